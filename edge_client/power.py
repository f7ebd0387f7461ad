"""Is the device charging? Android through ``BatteryManager`` (pyjnius), Linux through ``/sys/class/power_supply``.

Federated training is heavy on the battery, so by the usual practice of cross-device
federated learning a device takes part only while it charges, if its owner asks for that.

Sources: Android developer reference, ``BatteryManager.isCharging()`` (API 23) and the
``ACTION_BATTERY_CHANGED`` sticky intent's ``EXTRA_PLUGGED``; Linux kernel ABI
``Documentation/ABI/testing/sysfs-class-power`` (``type``, ``online``, ``status``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("fedhar.client.power")

SYSFS_POWER = Path("/sys/class/power_supply")


def charging_linux(root: Path = SYSFS_POWER) -> bool | None:
    """Charging state from the Linux power-supply class.

    True if an external supply (``type`` Mains, USB, USB_C, ...) reports ``online`` = 1
    or a battery reports ``status`` Charging or Full; False if there is a battery and
    neither holds; None if the machine reports no supplies at all (a desktop or a Pi
    without a UPS HAT: always on mains, and the caller decides what that means).

    Parameters
    ----------
    root : Path
        The power-supply class folder (replaceable for tests).

    Never raises: an unreadable folder or file counts as not reported.
    """
    try:
        devices = sorted(root.iterdir())
    except OSError:  # no such folder (a container, macOS) or not readable
        return None
    seen_battery = seen_any = False
    for dev in devices:
        kind = _read(dev / "type")
        if kind is None:
            continue
        seen_any = True
        if kind == "Battery":
            seen_battery = True
            if _read(dev / "status") in ("Charging", "Full"):
                return True
        elif _read(dev / "online") == "1":
            return True
    if not seen_any:
        return None
    return False if seen_battery else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def charging_android() -> bool | None:
    """Charging state from Android's ``BatteryManager`` (None where pyjnius, i.e. Android, is missing).

    The battery is read through the running foreground service's own context
    (``PythonService.mService``), which is where sensing and training run; the activity's
    (``PythonActivity.mActivity``) is null in the service process and is used only when no
    service runs (the UI process). A phone has a battery, so a state that cannot be read on
    Android (no context, a Java exception) is "not charging", never "charging": training
    waits rather than drains the battery.
    """
    try:
        from jnius import autoclass
    except ImportError:
        return None
    from edge_client.sensors.android import android_context

    try:
        ctx: Any = android_context(autoclass)
        if ctx is None:
            raise RuntimeError("neither the service nor the activity has a context")
        Context = autoclass("android.content.Context")
        manager = ctx.getSystemService(Context.BATTERY_SERVICE)
        return bool(manager.isCharging())
    except Exception as exc:  # a Java exception or a missing class: not charging, not a crash
        log.warning("cannot read the battery state (%s); counting it as not charging", exc)
        return False


def battery_percent_linux(root: Path = SYSFS_POWER) -> float | None:
    """Battery level, percent of capacity, from the Linux power-supply class; None if no battery reports one.

    The first supply of ``type`` Battery (in name order) that has ``capacity`` (0..100) gives it;
    one without it but with ``energy_now``/``energy_full`` (or ``charge_now``/``charge_full``)
    gives their ratio. Never raises: an unreadable or malformed file counts as not reported.

    Parameters
    ----------
    root : Path
        The power-supply class folder (replaceable for tests).
    """
    try:
        devices = sorted(root.iterdir())
    except OSError:
        return None
    for dev in devices:
        if _read(dev / "type") != "Battery":
            continue
        cap = _number(dev / "capacity")
        if cap is not None and 0 <= cap <= 100:
            return cap
        for now, full in (("energy_now", "energy_full"), ("charge_now", "charge_full")):
            a, b = _number(dev / now), _number(dev / full)
            if a is not None and b is not None and b > 0 and 0 <= a <= b:
                return 100.0 * a / b
    return None


def _number(path: Path) -> float | None:
    text = _read(path)
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


BATTERY_PROPERTY_CAPACITY = 4
"""``BatteryManager.BATTERY_PROPERTY_CAPACITY`` (API 21): remaining capacity as an integer percentage."""


def battery_percent_android() -> float | None:
    """Battery level, percent, from Android's ``BatteryManager.getIntProperty(BATTERY_PROPERTY_CAPACITY)``.

    None off Android (no pyjnius), and where the property is not supported (the call returns
    ``Integer.MIN_VALUE``, or 0 before API 28 on some devices: both read as not reported, never
    as an empty battery) or cannot be read.
    """
    try:
        from jnius import autoclass
    except ImportError:
        return None
    from edge_client.sensors.android import android_context

    try:
        ctx: Any = android_context(autoclass)
        if ctx is None:
            return None
        Context = autoclass("android.content.Context")
        value = int(ctx.getSystemService(Context.BATTERY_SERVICE).getIntProperty(BATTERY_PROPERTY_CAPACITY))
    except Exception as exc:  # a Java exception or a missing class: not reported, not a crash
        log.debug("cannot read the battery level (%s)", exc)
        return None
    return float(value) if 0 < value <= 100 else None


def battery_percent() -> float | None:
    """Battery level in percent (Android first, then Linux sysfs); None where the platform reports none."""
    level = battery_percent_android()
    return battery_percent_linux() if level is None else level


def is_charging(unknown_means: bool = True) -> bool:
    """True if the device charges (Android first, then Linux sysfs).

    Parameters
    ----------
    unknown_means : bool
        What to answer when no source knows (a desktop or a board on mains): True by default,
        since such a machine does not run on a battery.
    """
    state = charging_android()
    if state is None:
        state = charging_linux()
    return unknown_means if state is None else state
