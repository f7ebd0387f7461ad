"""The app split in two processes, as on Android: a sensing service and the UI, talking through two files.

Sensing, recording and training go on with the screen off in a python-for-android foreground
service (``buildozer.spec``), a process apart from the Kivy UI. They share the app's private
folder and two JSON files, each written atomically: ``app_settings.json`` (by the UI: how to join,
the password's file only, never the password; label set, what is recorded, take part, charge only,
the last ``requests`` of the Today and History screens, one of :data:`REQUESTS` with its ``args``,
and ``leave``) and ``app_status.json`` (by the service: counts, live prediction, federation state,
``answers`` per request id, ``{"ok": ...}`` or ``{"error": ..., "kind": ...}``, the History view,
``left``). The screens read ``timeline.sqlite`` (WAL) directly; every change goes through the
service. :func:`run_service` is the service; the UI uses :class:`RemoteController`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from edge_client.app import service_files as files
from edge_client.app.config import default_data_dir
from edge_client.app.controller import DeviceController
from edge_client.app.remote import BACKGROUND_START_REFUSED, RemoteController, service_start_error  # noqa: F401  (re-exported)
from edge_client.app.service_files import STATUS_FILE, read_json
from edge_client.app.views import FederationView, LiveView
from edge_client.power import is_charging
from edge_client.sensors.base import SensorSource

log = logging.getLogger("fedhar.app.service")


HISTORY_EVERY_S = 5.0
"""Seconds between two refreshes of the History screen's view in the status file (recordings, quality, storage)."""

REQUESTS = ("relabel", "undo_relabel", "delete_span", "delete_recording", "set_keep")
"""The controller's methods the UI asks for through the settings file's ``requests`` (each answered once)."""


def answer_request(ctl: DeviceController, req: dict[str, Any]) -> dict[str, Any]:
    """Do one request of the UI (``op`` one of :data:`REQUESTS`, ``args`` its keyword arguments): ``{"ok": result}``
    (an :class:`~edge_client.history.Edit` as a dict, or None), or ``{"error": message, "kind": class name}``."""
    op, args = req.get("op"), req.get("args")
    if op not in REQUESTS or not isinstance(args, dict):
        return {"error": f"unknown request {op!r}", "kind": "ValueError"}
    try:
        result = getattr(ctl, str(op))(**args)
    except (KeyError, LookupError, ValueError, TypeError, OSError) as exc:
        log.error("request %s %s: %s", op, args, exc)
        return {"error": str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc), "kind": type(exc).__name__}
    return {"ok": asdict(result) if result is not None else None}


def _android_wake_lock() -> Any:
    """A partial wake lock on Android (batched sensor events arrive only while the CPU is awake); None elsewhere."""
    try:
        from jnius import autoclass
    except ImportError:
        return None
    try:
        service = autoclass("org.kivy.android.PythonService").mService
        Context = autoclass("android.content.Context")
        PowerManager = autoclass("android.os.PowerManager")
        lock = service.getSystemService(Context.POWER_SERVICE).newWakeLock(PowerManager.PARTIAL_WAKE_LOCK, "fedhar:sensing")
        lock.acquire()
        return lock
    except Exception as exc:  # keep sensing without it; the log says why batches may stall
        log.warning("no wake lock (%s); sensor batches may stall while the screen is off", exc)
        return None


def run_service(
    state_dir: Path | None = None,
    source: SensorSource | None = None,
    stop: threading.Event | None = None,
    poll_s: float = 0.5,
    charging: Callable[[], bool] = is_charging,
) -> None:
    """Run sensing, recording and the federation agent as the UI's settings say, until ``stop`` (on Android: until
    Android stops it). ``state_dir`` defaults to the platform's app data folder + ``/fedhar``, ``source`` to the
    Android sensors; the settings file is read every ``poll_s``."""
    folder = state_dir or default_data_dir() / "fedhar"
    folder.mkdir(parents=True, exist_ok=True)
    settings = read_json(folder / files.SETTINGS_FILE) or {}
    cfg = files.config_from_settings(folder, settings)
    if source is None:
        from edge_client.sensors.android import AndroidSensorSource

        source = AndroidSensorSource()
    stop = stop or threading.Event()
    status: dict[str, Any] = {"counts": {}, "live": asdict(LiveView()), "federation": asdict(FederationView()), "recording": None,
                              "answers": {}, "left": {}}  # fmt: skip
    lock = threading.Lock()

    holder: dict[str, DeviceController] = {}  # the controller reports before its constructor returns

    def publish(key: str, value: Any) -> None:
        with lock:
            status[key] = value
            rec = holder["ctl"].recorder if "ctl" in holder else None
            status["recording"] = rec.activity if rec else None
            status["session_windows"] = rec.session_windows if rec else 0
            status["time"] = time.time()
            files.write_json_atomic(folder / STATUS_FILE, status)

    wake = _android_wake_lock()
    ctl = DeviceController(cfg, source, on_live=lambda v: publish("live", asdict(v)), on_counts=lambda c: publish("counts", c),
                           on_federation=lambda v: publish("federation", asdict(v)), charging=charging, supervise_s=poll_s)  # fmt: skip
    holder["ctl"] = ctl
    # Requests answered before a restart stay answered: a relabel or a deletion is applied once.
    status["answers"] = json.loads(ctl.timeline.get("answers", "{}"))
    status["left"] = json.loads(ctl.timeline.get("left", "{}"))
    publish("counts", ctl.counts())
    ctl.start_sensing()
    applied: dict[str, Any] = {k: settings.get(k) for k in files.FEDERATION_KEYS}
    last_history = -float("inf")
    try:
        while not stop.wait(poll_s):
            s = read_json(folder / files.SETTINGS_FILE)
            if s is None:
                continue
            fed = {k: s.get(k) for k in files.FEDERATION_KEYS}
            if fed != applied:
                changed = {k: v for k, v in fed.items() if v != applied.get(k) and k != "password_stamp"}
                if fed.get("password_stamp") != applied.get("password_stamp"):
                    changed["password_file"] = fed.get("password_file")  # same file, new password
                try:
                    ctl.set_federation(**changed)
                except ValueError as exc:
                    log.error("settings: %s", exc)
                applied = fed
            for key, setter in (("take_part", ctl.set_take_part), ("charge_only", ctl.set_charge_only)):
                if key in s and s[key] != applied.get(key):
                    setter(bool(s[key]))
                    applied[key] = s[key]
            for req in s.get("requests") or []:
                if not isinstance(req, dict) or str(req.get("id")) in status["answers"]:
                    continue
                answer = answer_request(ctl, req)
                done = dict(list((dict(status["answers"]) | {str(req.get("id")): answer}).items())[-files.REQUESTS_KEPT:])
                ctl.timeline.set("answers", json.dumps(done))
                publish("answers", done)
                publish("history", asdict(ctl.history()))
                last_history = time.monotonic()
            if time.monotonic() - last_history >= HISTORY_EVERY_S:
                publish("history", asdict(ctl.history()))
                last_history = time.monotonic()
            req = s.get("leave")
            if isinstance(req, dict) and str(req.get("id")) != status.get("left", {}).get("id"):
                try:
                    outcome = asdict(ctl.leave(bool(req.get("forget"))))
                except OSError as exc:  # a file that cannot be deleted: the UI says so
                    log.error("leaving: %s", exc)
                    outcome = {"error": str(exc)}
                # Answered once, also across a restart; the UI writes the settings of a device that never joined next.
                ctl.timeline.set("left", json.dumps({"id": str(req.get("id"))} | outcome))
                publish("left", {"id": str(req.get("id"))} | outcome)
            rec = s.get("recording")
            if rec != ctl.recorder.activity:
                if rec is None:
                    ctl.stop_recording()
                else:
                    try:
                        ctl.start_recording(str(rec))
                    except KeyError as exc:
                        log.error("settings: %s", exc)
                publish("counts", ctl.counts())
    finally:
        ctl.close()
        if wake is not None:
            wake.release()
