"""Screen off / Doze (docs/reliability.md, "The OS withholds the sensors"): a silent source is
reported as "sensing paused", its old windows are not fresh, and a refused background start of
the foreground service is shown on the Federation screen instead of crashing the app."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from edge_client.app.controller import AppConfig
from edge_client.app.service import BACKGROUND_START_REFUSED, RemoteController, service_start_error
from edge_client.freshness import SensingFreshness
from har_models.data.labels import HAPT_LABELS, REALWORLD_LABELS
from har_models.data.pipeline import SensorPipeline
from har_models.data.recording import LabelTrack
from har_models.wire.messages import ClientStatus, MessageError

P = 20_000_000
S = 1_000_000_000
T0 = 10**12


class Clock:
    """The sensor clock's now, set by the test (ns)."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def feed(pipe, fresh, t):
    """Push both streams' events stamped ``t`` (one chunk of 250 per sensor at a time) and note the windows."""
    n = 0
    for a in range(0, t.size, 250):
        for sensor in ("acc", "gyro"):
            ws = pipe.push(sensor, t[a : a + 250], np.ones((t[a : a + 250].size, 3)))
            fresh.note(ws)
            n += len(ws)
    return n


def test_silence_then_backlog_then_live():
    clock = Clock(T0)
    fresh = SensingFreshness(limit_s=60, clock_ns=clock)
    pipe = SensorPipeline(REALWORLD_LABELS, LabelTrack(np.array([0]), np.array([7])))
    live1 = T0 + P * np.arange(1500)  # 30 s of live events
    clock.now = int(live1[-1])
    w1 = feed(pipe, fresh, live1)
    assert fresh.state() == "live" and w1 == 22  # starts 0, 64, ..., 1344: all 22 end before the reorder horizon
    clock.now = int(live1[-1]) + 300 * S  # 300 s of silence: nothing arrives
    assert fresh.state() == "paused"
    backlog = live1[-1] + P * np.arange(1, 15_001)  # the FIFO's 15,000 events per stream, stamped over those 300 s
    ws_backlog = feed(pipe, fresh, backlog)
    assert fresh.state() == "live"  # the backlog's newest window ends within 60 s of now
    live2 = backlog[-1] + P * np.arange(1, 1501)
    clock.now = int(live2[-1])
    feed(pipe, fresh, live2)
    pipe.close()
    st = pipe.stats
    assert st.late_dropped == 0 and st.duplicates_dropped == 0 and st.outliers_dropped == 0  # nothing lost, nothing twice
    assert st.accepted == 2 * (1500 + 15_000 + 1500) and ws_backlog > 0


def test_old_windows_are_not_fresh():
    clock = Clock(T0 + 600 * S)
    fresh = SensingFreshness(limit_s=60, clock_ns=clock)
    from har_models.data.windowing import WindowSet

    starts = np.array([T0, T0 + 530 * S, T0 + 590 * S])
    ws = WindowSet(np.zeros((3, 6, 128), np.float32), np.zeros(3, np.int64), REALWORLD_LABELS, starts)
    assert fresh.fresh(ws).tolist() == [False, False, True]  # ends 597.44 s ago, 67.44 s ago, 7.44 s ago
    fresh.note(ws.subset(np.array([0, 1])))
    assert fresh.state() == "paused"
    fresh.note(ws)
    assert fresh.state() == "live"
    assert SensingFreshness(clock_ns=clock).state() == "paused"  # no window yet
    with pytest.raises(ValueError, match="limit_s"):
        SensingFreshness(limit_s=0)


def test_status_carries_sensing_and_stays_compatible():
    old = ClientStatus("phone-1", "online").to_bytes()
    assert b"sensing" not in old  # untracked: the message is what it always was
    assert ClientStatus.from_bytes(old).sensing == ""
    paused = ClientStatus("phone-1", "online", sensing="paused")
    assert ClientStatus.from_bytes(paused.to_bytes()) == paused
    with pytest.raises(MessageError, match="sensing"):
        ClientStatus.from_bytes(ClientStatus("phone-1", "online", sensing="asleep").to_bytes())


class JavaException(Exception):
    """Stand-in for pyjnius' ``jnius.JavaException``: the Java class name in ``classname``."""

    def __init__(self, classname: str, message: str) -> None:
        super().__init__(message)
        self.classname = classname


def test_service_start_error_words():
    refused = JavaException("android.app.ForegroundServiceStartNotAllowedException", "startForegroundService() not allowed")
    assert service_start_error(refused) == BACKGROUND_START_REFUSED
    other = service_start_error(JavaException("java.lang.SecurityException", "no permission"))
    assert other == "cannot start the sensing service: JavaException: no permission"


@pytest.mark.parametrize("later", [False, True])
def test_background_start_is_caught_and_shown(tmp_path, monkeypatch, later):
    """The app's real start path (main.start_android_service) against a stand-in jnius whose service start throws."""
    from edge_client.app import main

    def autoclass(name):
        if name == "org.kivy.android.PythonActivity":
            return types.SimpleNamespace(mActivity=types.SimpleNamespace(getPackageName=lambda: "org.fedhar.app"))
        assert name == "org.fedhar.app.ServiceSensing"

        def start(activity, arg):
            raise JavaException("android.app.ForegroundServiceStartNotAllowedException", "app is in background")

        return types.SimpleNamespace(start=start)

    monkeypatch.setitem(sys.modules, "jnius", types.SimpleNamespace(autoclass=autoclass))
    pending = []
    # permissions already granted: start at once; or after the dialog answers (later)
    monkeypatch.setattr(main, "request_android_permissions", (lambda then: pending.append(then)) if later else (lambda then: then()))
    shown = []
    cfg = AppConfig(state_dir=tmp_path, labels=HAPT_LABELS, client_id="phone-1", broker="127.0.0.1:1")
    ui = RemoteController(cfg, on_federation=shown.append, start_service=main.start_android_service, poll_s=60)
    try:
        ui.start_sensing()  # must not raise
        for then in pending:
            then()
        assert ui.federation.error == BACKGROUND_START_REFUSED
        assert shown and shown[-1].error == BACKGROUND_START_REFUSED
    finally:
        ui.close()
    monkeypatch.setattr(main, "request_android_permissions", lambda then: then())
    with pytest.raises(JavaException):  # without an error callback the exception is the caller's
        main.start_android_service()


class LiveStandIn:
    """A live sensor source as the controller sees it, stamping on a clock the test moves (``clock_ns``)."""

    name = "stand-in"
    running = False

    def __init__(self, clock: Clock) -> None:
        self.clock_ns = clock

    def start(self, on_chunk, on_end=None) -> None:
        self.running = True

    def stop(self) -> None:
        self.running = False

    def fault(self) -> str:
        return ""  # withheld by the OS is a pause (sensing "paused"), not a fault of the source


def test_client_status_says_sensing_paused(tmp_path):
    from edge_client.app.controller import DeviceController

    clock = Clock(T0)
    cfg = AppConfig(state_dir=tmp_path, labels=HAPT_LABELS, client_id="phone-1", broker="127.0.0.1:9")  # nobody listens there
    ctl = DeviceController(cfg, LiveStandIn(clock), charging=lambda: False, supervise_s=60)
    try:
        t = T0 + P * np.arange(1500)
        for a in range(0, t.size, 100):
            for sensor in ("acc", "gyro"):
                ctl._on_chunk((sensor, t[a : a + 100], np.ones((t[a : a + 100].size, 3))))
        clock.now = int(t[-1])
        from har_models.data.windowing import WindowSet

        rng = np.random.default_rng(0)  # recorded windows, so the agent has data to take part with
        ctl.window_log.append(WindowSet(rng.normal(size=(40, 6, 128)).astype(np.float32), np.arange(40) % 6, HAPT_LABELS))
        ctl._start_agent()
        assert ctl._agent is not None
        assert ClientStatus.from_bytes(ctl._agent._status_bytes()).sensing == "live"
        clock.now = int(t[-1]) + 300 * S  # Doze: nothing for 300 s
        assert ClientStatus.from_bytes(ctl._agent._status_bytes()).sensing == "paused"
    finally:
        ctl.close()
