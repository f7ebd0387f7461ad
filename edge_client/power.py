"""Is the device charging, and its battery level? Android through ``BatteryManager`` (pyjnius), Linux through sysfs.

Training is heavy on the battery, so by cross-device FL's usual practice a device may take part
only while it charges. Sources: Android's ``BatteryManager`` reference; Linux kernel ABI
``Documentation/ABI/testing/sysfs-class-power`` (``type``, ``online``, ``status``, ``capacity``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("fedhar.client.power")

SYSFS_POWER = Path("/sys/class/power_supply")


def charging_linux(root: Path = SYSFS_POWER) -> bool | None:
    """Charging state from the Linux power-supply class folder ``root``; never raises (unreadable: not reported).

    True if an external supply reports ``online`` = 1 or a battery ``status`` Charging or Full;
    False if there is a battery and neither holds; None without supplies (a desktop, a Pi on mains).
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


def _android_battery() -> Any:
    """Android's ``BatteryManager`` through the service's context (sensing and training run there), else the activity's;
    None off Android (no pyjnius). Raises RuntimeError without a context, or what the Java call raises."""
    try:
        from jnius import autoclass
    except ImportError:
        return None
    from edge_client.sensors.android import android_context

    ctx: Any = android_context(autoclass)
    if ctx is None:
        raise RuntimeError("neither the service nor the activity has a context")
    return ctx.getSystemService(autoclass("android.content.Context").BATTERY_SERVICE)


def charging_android() -> bool | None:
    """Charging state from Android's ``BatteryManager`` (None off Android); a state that cannot be read is "not charging"
    (a phone has a battery: training waits rather than drains it)."""
    try:
        manager = _android_battery()
        return None if manager is None else bool(manager.isCharging())
    except Exception as exc:  # a Java exception or a missing class: not charging, not a crash
        log.warning("cannot read the battery state (%s); counting it as not charging", exc)
        return False


def battery_percent_linux(root: Path = SYSFS_POWER) -> float | None:
    """Battery level, percent, of the first ``type`` Battery in ``root`` with ``capacity`` (else ``energy_now/full`` or
    ``charge_now/full``); None if none reports one. Never raises."""
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
    """Battery level, percent, from ``BatteryManager.getIntProperty(BATTERY_PROPERTY_CAPACITY)``; None off Android, or
    where unsupported (``Integer.MIN_VALUE``, or 0 before API 28: never an empty battery) or unreadable."""
    try:
        manager = _android_battery()
        if manager is None:
            return None
        value = int(manager.getIntProperty(BATTERY_PROPERTY_CAPACITY))
    except Exception as exc:  # a Java exception or a missing class: not reported, not a crash
        log.debug("cannot read the battery level (%s)", exc)
        return None
    return float(value) if 0 < value <= 100 else None


def battery_percent() -> float | None:
    """Battery level in percent (Android first, then Linux sysfs); None where the platform reports none."""
    level = battery_percent_android()
    return battery_percent_linux() if level is None else level


def is_charging(unknown_means: bool = True) -> bool:
    """True if the device charges (Android first, then Linux sysfs); ``unknown_means`` when no source knows (a machine
    on mains)."""
    state = charging_android()
    if state is None:
        state = charging_linux()
    return unknown_means if state is None else state
