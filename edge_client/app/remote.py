"""The UI's side of the app split in two processes (Android): :class:`RemoteController`, the controller's methods over two files.

See :mod:`edge_client.app.service` for the files and the service that answers them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from edge_client.app.config import AppConfig
from edge_client.app.history_edits import HistoryView
from edge_client.app.joining import enrol, federation_fields
from edge_client.app.service_files import (
    FEDERATION_KEYS,
    REQUESTS_KEPT,
    SETTINGS_FILE,
    STATUS_FILE,
    config_from_settings,
    read_json,
    settings_of,
    write_json_atomic,
)
from edge_client.app.views import FederationView, LiveView, settings_view
from edge_client.history import Edit
from edge_client.leave import LeaveOutcome
from edge_client.sensors.base import SensorSource
from edge_client.timeline import guidance
from edge_client.timeline_store import TIMELINE_FILE, TimelineStore
from har_io.enrolment import EnrolmentBundle
from har_io.threads import join_started

log = logging.getLogger("fedhar.app.service")


class _RecorderState:
    """What the UI knows of the service's recorder (mirrors :class:`~edge_client.recorder.Recorder`'s attributes)."""

    def __init__(self) -> None:
        self.activity: str | None = None
        self.session_windows = 0

    @property
    def recording(self) -> bool:
        return self.activity is not None


BACKGROUND_START_REFUSED = "cannot start the sensing service from the background"
"""What the Federation screen shows when Android 12+ refuses to start the foreground service."""

FOREGROUND_START_NOT_ALLOWED = "android.app.ForegroundServiceStartNotAllowedException"
"""Java class Android 12+ throws for ``startForegroundService`` from the background."""


def service_start_error(exc: BaseException) -> str:
    """Words for the screen about a failed service start.

    Android 12+'s ``ForegroundServiceStartNotAllowedException`` (by pyjnius' ``classname``, the type's
    name or the message) gives :data:`BACKGROUND_START_REFUSED`, anything else
    "cannot start the sensing service: <type>: <message>".
    """
    names = (str(getattr(exc, "classname", "") or ""), type(exc).__name__, str(exc))
    short = FOREGROUND_START_NOT_ALLOWED.rsplit(".", 1)[1]
    if any(short in n for n in names):
        return BACKGROUND_START_REFUSED
    return f"cannot start the sensing service: {type(exc).__name__}: {exc}"


class RemoteController:
    """The UI's side: the :class:`~edge_client.app.controller.DeviceController` methods the screens use, over the two files.

    ``source`` is unused (the service owns the sensors); the ``on_*`` callbacks run in the polling
    thread (every ``poll_s``); ``start_service`` starts the service (on Android
    :func:`~edge_client.app.main.start_android_service`; None: someone else does).
    """

    def __init__(
        self,
        cfg: AppConfig,
        source: SensorSource | None = None,
        on_live: Callable[[LiveView], None] | None = None,
        on_counts: Callable[[dict[str, int]], None] | None = None,
        on_federation: Callable[[FederationView], None] | None = None,
        start_service: Callable[[Callable[[BaseException], None]], None] | None = None,
        poll_s: float = 0.3,
        **_: Any,
    ):
        self.cfg = cfg
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        self._settings_path = cfg.state_dir / SETTINGS_FILE
        self._status_path = cfg.state_dir / STATUS_FILE
        old = read_json(self._settings_path) or {}
        # What was entered on the Federation screen before wins over the defaults the UI starts with.
        kept = ("take_part", "charge_only", "recording", *(FEDERATION_KEYS if old.get("client_id") else ()))
        self.settings = settings_of(cfg) | {k: old[k] for k in kept if k in old}
        self.cfg = cfg = config_from_settings(cfg.state_dir, self.settings) if old.get("client_id") else cfg
        write_json_atomic(self._settings_path, self.settings)
        self.recorder = _RecorderState()
        self.recorder.activity = self.settings["recording"]
        self.live = LiveView()
        self.federation = settings_view(cfg)
        self._counts = {n: 0 for n in cfg.labels.names}
        self.timeline = TimelineStore(cfg.state_dir / TIMELINE_FILE, cfg.labels)
        self._answers: dict[str, dict[str, Any]] = {}  # the service's answers to the requests
        self._history: dict[str, Any] = {}
        self._left: dict[str, Any] = {}  # the service's answer to the last leave request
        self._on_live = on_live or (lambda v: None)
        self._on_counts = on_counts or (lambda c: None)
        self._on_federation = on_federation or (lambda v: None)
        self._start_service = start_service
        self._stop = threading.Event()
        self._poll_s = poll_s
        self._seen: float | None = None
        self._thread = threading.Thread(target=self._poll, name="status-poll", daemon=True)
        self._thread.start()

    def _save(self) -> None:
        write_json_atomic(self._settings_path, self.settings)

    def _poll(self) -> None:
        while not self._stop.wait(self._poll_s):
            st = read_json(self._status_path)
            if st is None or st.get("time") == self._seen:
                continue
            self._seen = st.get("time")
            self.recorder.activity = st.get("recording")
            self._answers = {str(k): v for k, v in (st.get("answers") or {}).items() if isinstance(v, dict)}
            self._history = dict(st.get("history") or {})
            self._left = dict(st.get("left") or {})
            self.recorder.session_windows = int(st.get("session_windows", 0))
            if st.get("counts"):
                self._counts = {k: int(v) for k, v in st["counts"].items()}
                self._on_counts(dict(self._counts))
            self.live = LiveView(**st["live"])
            self._on_live(self.live)
            self.federation = FederationView(**{k: v for k, v in st["federation"].items() if k in _VIEW_FIELDS})
            self._on_federation(self.federation)

    def start_sensing(self) -> None:
        """Start the service (it senses whether or not the UI is open); a failure, now or later (after a permission
        dialog, through the callback given to ``start_service``), never propagates: the Federation screen's ``error``
        says it (:func:`service_start_error`)."""
        if self._start_service is None:
            return
        try:
            self._start_service(self._service_failed)
        except Exception as exc:  # a Java exception through pyjnius, or anything else: shown, never a crash
            self._service_failed(exc)

    def _service_failed(self, exc: BaseException) -> None:
        text = service_start_error(exc)
        log.warning("%s (%s: %s)", text, type(exc).__name__, exc)
        self.federation = replace(self.federation, error=text)
        self._on_federation(self.federation)

    def stop_sensing(self) -> None:
        """The service keeps sensing; closing the UI does not stop it."""

    def start_recording(self, activity: str) -> None:
        """Ask the service to label what follows as ``activity`` (KeyError outside the label set)."""
        self.cfg.labels.index(activity)
        self.settings["recording"] = activity
        self.recorder.activity = activity
        self.recorder.session_windows = 0
        self._save()

    def stop_recording(self) -> None:
        """Ask the service to stop labelling."""
        self.settings["recording"] = None
        self.recorder.activity = None
        self._save()

    def set_take_part(self, on: bool) -> None:
        """Allow or forbid taking part in federated rounds."""
        self.settings["take_part"] = bool(on)
        self._save()

    def set_charge_only(self, on: bool) -> None:
        """Train only while charging."""
        self.settings["charge_only"] = bool(on)
        self._save()

    def set_broker(self, host_port: str) -> None:
        """Use another broker (``host:port``; ValueError otherwise)."""
        self.set_federation(broker=host_port)

    def set_federation(self, **fields: Any) -> None:
        """Ask the service to join with other settings (as :meth:`DeviceController.set_federation`; ValueError, nothing
        changed, for an invalid field); a ``password`` is stored in the shared private folder, the settings name its file."""
        changes = federation_fields(self.cfg.state_dir, fields)
        self.cfg = replace(self.cfg, **changes)
        self._take_federation_settings()
        keep = {k: getattr(self.federation, k) for k in ("state", "round", "last_accuracy", "take_part", "charge_only", "charging")}
        self.federation = replace(settings_view(self.cfg), **keep)
        self._save()

    def enrol(self, source: str | Path, ca_file: str | Path | None = None) -> EnrolmentBundle:
        """Join with an enrolment bundle's settings (as :meth:`DeviceController.enrol`; the service restarts its agent)."""
        return enrol(self, source, ca_file)

    def counts(self) -> dict[str, int]:
        """Recorded windows per activity, as last reported."""
        return dict(self._counts)

    def _ask(self, op: str, wait_s: float, **args: Any) -> Edit | None:
        """Ask the service to run ``op`` (one of :data:`~edge_client.app.service.REQUESTS`) and wait for its answer.

        Returns what it did, or None when the method returns nothing or the service has not answered
        within ``wait_s`` (it still will). Raises KeyError, LookupError, ValueError or OSError as the
        controller's method raised it in the service.
        """
        rid = f"{time.time_ns()}"
        reqs = list(self.settings.get("requests") or [])
        reqs.append({"id": rid, "op": op, "args": args})
        self.settings["requests"] = reqs[-REQUESTS_KEPT:]
        self._save()
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            answer = self._answers.get(rid)
            if answer is not None:
                if "error" in answer:
                    kinds: dict[str, type[Exception]] = {"KeyError": KeyError, "LookupError": LookupError, "OSError": OSError}
                    raise kinds.get(str(answer.get("kind")), ValueError)(answer["error"])
                ok = answer.get("ok")
                return None if ok is None else Edit(**{**ok, "before": tuple(ok["before"]), "after": tuple(ok["after"])})
            time.sleep(0.05)
        return None

    def relabel(self, start_ns: int, end_ns: int, activity: str, wait_s: float = 5.0) -> Edit | None:
        """Ask the service to relabel a stretch (as :meth:`DeviceController.relabel`; KeyError for an unknown activity);
        None if it has not answered yet."""
        self.cfg.labels.index(activity)
        return self._ask("relabel", wait_s, start_ns=int(start_ns), end_ns=int(end_ns), activity=activity)

    def undo_relabel(self, correction_id: int | None = None, wait_s: float = 5.0) -> Edit | None:
        """Ask the service to undo a correction (as :meth:`DeviceController.undo_relabel`)."""
        return self._ask("undo_relabel", wait_s, correction_id=correction_id)

    def delete_span(self, start_ns: int, end_ns: int, wait_s: float = 5.0) -> Edit | None:
        """Ask the service to delete a stretch (as :meth:`DeviceController.delete_span`)."""
        return self._ask("delete_span", wait_s, start_ns=int(start_ns), end_ns=int(end_ns))

    def delete_recording(self, t_first_ns: int, t_last_ns: int, label: int, wait_s: float = 5.0) -> Edit | None:
        """Ask the service to delete a recording (as :meth:`DeviceController.delete_recording`)."""
        return self._ask("delete_recording", wait_s, t_first_ns=int(t_first_ns), t_last_ns=int(t_last_ns), label=int(label))

    def set_keep(self, keep_days: float, keep_raw_days: float, wait_s: float = 5.0) -> None:
        """Ask the service to keep predictions and raw samples that long (as :meth:`DeviceController.set_keep`)."""
        self._ask("set_keep", wait_s, keep_days=float(keep_days), keep_raw_days=float(keep_raw_days))

    def history(self) -> HistoryView:
        """The History screen's view, as the service last reported it."""
        return HistoryView(**self._history) if self._history else HistoryView()

    def guidance(self) -> list[str]:
        """What to record next, in words (:func:`~edge_client.timeline.guidance`)."""
        return guidance(self.counts())

    def leave(self, forget: bool, wait_s: float = 30.0) -> LeaveOutcome:
        """Ask the service to leave the federation (as :meth:`DeviceController.leave`) and wait for what it did.

        Once it answers, the settings go back to a device that never joined, so a restarted service
        does not join again. Raises OSError if the service could not delete a file or did not
        answer within ``wait_s`` (it still may).
        """
        rid = f"{time.time_ns()}"
        self.settings["leave"] = {"id": rid, "forget": bool(forget)}
        self.settings["take_part"] = False
        self._save()
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            left = self._left
            if left.get("id") == rid:
                break
            time.sleep(0.05)
        else:
            raise OSError(f"the sensing service did not answer in {wait_s:.0f} s; it leaves when it reads the request")
        if "error" in left:
            raise OSError(left["error"])
        self.cfg = replace(self.cfg, broker=AppConfig.broker, federation=AppConfig.federation, username=None, password_file=None,
                           tls_ca=None)  # fmt: skip
        self._take_federation_settings()
        self.settings.pop("leave", None)
        self._save()
        self.federation = replace(settings_view(self.cfg), charge_only=self.federation.charge_only, charging=self.federation.charging)
        return LeaveOutcome(forget=bool(left["forget"]), told=bool(left["told"]), not_told=str(left.get("not_told", "")),
                            deleted=tuple(left.get("deleted", ())))  # fmt: skip


    def _take_federation_settings(self) -> None:
        fresh = settings_of(self.cfg)
        for key in FEDERATION_KEYS:
            self.settings[key] = fresh[key]
    def close(self) -> None:
        """Stop polling (the service goes on)."""
        self._stop.set()
        join_started(self._thread, 5)
        self.timeline.close()


_VIEW_FIELDS = set(FederationView.__dataclass_fields__)
