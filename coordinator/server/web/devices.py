"""One row per device, as ``/api/devices`` gives it and the page's device table shows it.

A row merges the server database (enrolment, owner, revocation, participation), the round records,
the broker's retained status as the monitor read it, and the run's harm counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from coordinator.server.harm import NO_HARM, DeviceHarm
from coordinator.server.monitor import DeviceSeen, MonitorSnapshot
from coordinator.server.web.fold import Took
from har_models.wire.messages import ClientStatus

TARGET_RATE_HZ = 50.0
"""The sample rate every device must deliver (the model's 50 Hz grid)."""

RATE_OK_HZ = (45.0, 55.0)
"""A delivered rate outside this range (Hz, bounds fine) is shown in the warning colour."""


def clean(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float replaced by None (JSON has no NaN), keys as strings."""
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean(v) for v in obj]
    return None if isinstance(obj, float) and not math.isfinite(obj) else obj


def sensing_json(st: ClientStatus | None, seen: DeviceSeen | None = None, now: float | None = None) -> dict[str, Any]:
    """The ``sensing`` object of a device in ``/api/devices`` from its latest status (None: no status).

    Keys (None where the status does not carry them): ``state``, ``target_hz``, ``acc_hz``, ``gyro_hz``,
    ``rate_hz`` (the slower stream), ``rate_ok`` (both within :data:`RATE_OK_HZ`), ``newest_window_age_s``,
    ``window_stream_stopped``, ``gaps``, ``late``, ``charging``. With ``seen`` and ``now`` the window age
    is the age now, so a stream that stopped (repeating its last age) ages on the page.
    """
    h = st.sensing_health if st is not None else None
    age = h.window_age_s if h is not None else None
    stopped: bool | None = None
    if age is not None and seen is not None and seen.window_age_since_unix is not None and now is not None:
        stopped = seen.received_unix > seen.window_age_since_unix + 0.5
        age = age + max(0.0, now - seen.window_age_since_unix)
    rates = [r for r in ((h.acc_hz, h.gyro_hz) if h is not None else ()) if r is not None]
    lo, hi = RATE_OK_HZ
    return {
        "state": (st.sensing or None) if st is not None else None,
        "target_hz": TARGET_RATE_HZ,
        "rate_hz": min(rates) if rates else None,
        "acc_hz": h.acc_hz if h is not None else None,
        "gyro_hz": h.gyro_hz if h is not None else None,
        "rate_ok": all(lo <= r <= hi for r in rates) if rates else None,
        "newest_window_age_s": age,
        "window_stream_stopped": stopped,
        "gaps": h.gaps_1h if h is not None else None,
        "late": h.late if h is not None else None,
        "charging": st.charging if st is not None else None,
    }


def _last_known(seen: DeviceSeen) -> dict[str, Any]:
    w, b = seen.windows, seen.backend
    return {"n_train": w[0] if w else None, "n_test": w[1] if w else None, "windows_unix": w[2] if w else None,
            "backend": b[0] if b else None, "backend_unix": b[1] if b else None}  # fmt: skip


def device_rows(snap: MonitorSnapshot, registered: Sequence[Any], participation: Mapping[str, Any], took: Mapping[str, Took],
                harm: Mapping[str, DeviceHarm], arch_at: Callable[[int], int | None], now: float,
                link_down: bool) -> list[dict[str, Any]]:  # fmt: skip
    """One JSON object per device, by name: enrolled ones, and any other the broker or the records show.

    ``took`` covers devices the registry has no participation for; with ``link_down`` an enrolled device's
    ``online`` is None. Keys as :meth:`coordinator.server.web.view.ServerView.devices` documents.
    """
    rows = {str(r.name): r for r in registered}
    names = sorted(set(rows) | set(snap.devices) | set(took))  # a sender known only by its rejections is no device
    out = []
    for name in names:
        row = rows.get(name)
        state = str(row.state) if row is not None else "unenrolled"
        gone = state == "forgotten"
        seen = None if gone else snap.devices.get(name)
        own = took.get(name) if not gone else None
        last: tuple[int, float | None, float | None] | None
        last_contribution: float | None = None
        renamed_to = getattr(row, "renamed_to", None)
        if renamed_to is not None:  # its participation moved to the new name: counted there, not twice
            n_rounds, last = 0, None
        elif name in participation:
            p = participation[name]
            n_rounds, last, last_contribution = p.rounds, (int(p.last.round), p.last.accuracy, p.last.macro_f1), p.last_t
        else:
            n_rounds, last = (own.rounds, own.last) if own is not None else (0, None)
        st = seen.status if seen is not None else None
        online: bool | None = bool(seen is not None and seen.online and state != "revoked")
        if link_down and seen is not None and state == "enrolled":
            online = None  # its presence cannot be known while the page's broker link is down
        known = seen is not None and not online and (seen.windows is not None or seen.backend is not None)
        arch = st.arch_version if st is not None and st.arch_version is not None else arch_at(last[0]) if last else None
        out.append(clean({
            "name": name,
            "owner": getattr(row, "owner", None),
            "state": state,
            "renamed_to": renamed_to,
            "online": online,
            "status": st.state if st is not None else None,
            "last_seen_unix": seen.last_seen_unix if seen is not None else None,
            "refresh_s": (st.refresh_s or None) if st is not None else None,
            "last_contribution_unix": last_contribution,
            "rounds": n_rounds,
            "last_round": last[0] if last else (st.last_round if st is not None and st.last_round >= 0 else None),
            "last_accuracy": last[1] if last else None,
            "last_macro_f1": last[2] if last else None,
            "arch_version": arch,
            "backend": (st.backend or None) if st is not None else None,
            "program_fault": (st.program_fault or None) if st is not None else None,
            "fault": (st.fault or None) if st is not None else None,
            "n_train": st.n_train if st is not None else None,
            "n_test": st.n_test if st is not None else None,
            "sensing": sensing_json(st, seen, now),
            "cost": st.cost.to_json() if st is not None and st.cost is not None else {},
            "last_known": _last_known(seen) if known and seen is not None else None,
            **(NO_HARM if gone else harm.get(name, NO_HARM)).to_json(),
        }))  # fmt: skip
    return out


def device_counts(registered: Sequence[Any], snap: MonitorSnapshot) -> dict[str, int]:
    """Devices by state for the metrics: enrolled, revoked, forgotten (registry) and online (monitor; never a revoked one)."""
    counts: dict[str, int] = {"enrolled": 0, "online": 0, "revoked": 0, "forgotten": 0}
    for r in registered:
        if str(r.state) in counts:
            counts[str(r.state)] += 1
    not_enrolled = {str(r.name) for r in registered if str(r.state) != "enrolled"}
    counts["online"] = sum(1 for cid, d in snap.devices.items() if d.online and cid not in not_enrolled)
    return counts
