"""Sensing health: the delivered rate, the newest window's age, gaps and late samples a pipeline measured,
carried in the client's status (optional fields, so older statuses still parse) and filled by the client."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import numpy as np
import pytest

from edge_client.freshness import SensingHealthMeter
from edge_client.sensors.replay import ReplaySource
from har_models.data.labels import HAPT_LABELS, REALWORLD_LABELS
from har_models.data.pipeline import SensorPipeline
from har_models.data.recording import LabelTrack, Recording, SensorStream
from har_models.wire.messages import ClientStatus, MessageError, SensingHealth

P = 20_000_000  # 50 Hz, ns
S = 1_000_000_000
T0 = 10**12  # a multiple of P


class Clock:
    """The sensor clock's now, set by the test (ns)."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def pipeline() -> SensorPipeline:
    return SensorPipeline(REALWORLD_LABELS, LabelTrack(np.array([0]), np.array([7])))


def feed(pipe: SensorPipeline, meter: SensingHealthMeter, t_acc: np.ndarray, t_gyro: np.ndarray, chunk: int = 100) -> None:
    """Both streams in alternating chunks, as a driver delivers them; the windows noted."""
    for a in range(0, max(t_acc.size, t_gyro.size), chunk):
        for sensor, t in (("acc", t_acc), ("gyro", t_gyro)):
            part = t[a : a + chunk]
            if part.size:
                meter.note(pipe.push(sensor, part, np.ones((part.size, 3))))


# ---------------------------------------------------------------------- the wire
def test_status_round_trips_with_backend_arch_and_health() -> None:
    h = SensingHealth(acc_hz=49.8, gyro_hz=50.0, window_age_s=1.5, gaps_1h=2, late=7)
    st = ClientStatus("phone-1", "idle", sensing="live", charging=True, backend="executorch", arch_version=3, sensing_health=h)
    raw = st.to_bytes()
    assert json.loads(raw)["sensing_health"] == {"acc_hz": 49.8, "gyro_hz": 50.0, "window_age_s": 1.5, "gaps_1h": 2, "late": 7}
    assert ClientStatus.from_bytes(raw) == st
    partial = ClientStatus("phone-1", "idle", sensing_health=SensingHealth(late=0))  # no sample yet: only the late count
    assert json.loads(partial.to_bytes())["sensing_health"] == {"late": 0}
    assert ClientStatus.from_bytes(partial.to_bytes()) == partial


def test_an_old_status_without_the_fields_parses_and_a_new_one_without_them_is_unchanged() -> None:
    # What a client of the release before these fields sent (every key it had, nothing else).
    old = {"protocol": 1, "client_id": "pi-1", "state": "online", "label_set": "hapt6", "n_train": 10, "n_test": 2,
           "train_stats": {}, "class_counts": [5, 5], "run_id": "", "last_round": -1, "instance": "abc", "sent_unix": 5.0,
           "refresh_s": 30.0, "sensing": "live", "charging": False}  # fmt: skip
    st = ClientStatus.from_bytes(json.dumps(old).encode())
    assert (st.backend, st.arch_version, st.sensing_health) == ("", None, None)
    d = json.loads(ClientStatus("pi-1", "online").to_bytes())
    assert not {"backend", "arch_version", "sensing_health"} & set(d)  # left out when unknown: older coordinators parse it


@pytest.mark.parametrize(
    ("health", "field"),
    [
        ({"acc_hz": float("nan")}, "acc_hz"),
        ({"gyro_hz": -1.0}, "gyro_hz"),
        ({"acc_hz": 1e6}, "acc_hz"),
        ({"acc_hz": True}, "acc_hz"),
        ({"window_age_s": -0.5}, "window_age_s"),
        ({"window_age_s": float("inf")}, "window_age_s"),
        ({"gaps_1h": -1}, "gaps_1h"),
        ({"gaps_1h": 1.5}, "gaps_1h"),
        ({"late": "3"}, "late"),
        ({"mag_hz": 50.0}, "mag_hz"),
        ([50.0], "sensing_health"),
    ],
)
def test_out_of_range_health_is_refused(health: object, field: str) -> None:
    d = json.loads(ClientStatus("phone-1", "online").to_bytes())
    d["sensing_health"] = health
    with pytest.raises(MessageError, match=field):
        ClientStatus.from_bytes(json.dumps(d).encode())  # json writes NaN and Infinity, as a hostile client could


@pytest.mark.parametrize(("key", "value"), [("backend", "Torch!"), ("backend", "x" * 33), ("backend", 3),
                                            ("arch_version", -1), ("arch_version", 2.0), ("arch_version", True)])  # fmt: skip
def test_bad_backend_or_arch_version_is_refused(key: str, value: object) -> None:
    d = json.loads(ClientStatus("phone-1", "online").to_bytes())
    d[key] = value
    with pytest.raises(MessageError, match=key):
        ClientStatus.from_bytes(json.dumps(d).encode())


# ---------------------------------------------------------------------- the meter
def test_rates_by_hand_without_a_clock() -> None:
    """30 s of sensor clock: 1201 acc samples 25 ms apart (40 Hz), 3001 gyro samples 10 ms apart (100 Hz)."""
    meter, pipe = SensingHealthMeter(), pipeline()
    meter.watch(pipe)
    t_acc = T0 + 25_000_000 * np.arange(1201)
    t_gyro = T0 + 10_000_000 * np.arange(3001)
    meter.note(pipe.push("acc", t_acc, np.ones((t_acc.size, 3))))
    meter.note(pipe.push("gyro", t_gyro, np.ones((t_gyro.size, 3))))
    meter.note(pipe.close())
    h = meter.snapshot()
    assert h is not None and pipe.stats.accepted == 1201 + 3001
    # now = the newest sample, T0 + 30 s; each stream younger than a minute: samples in (T0, T0 + 30 s] over 30 s
    assert (h.acc_hz, h.gyro_hz) == (1200 / 30, 3000 / 30) == (40.0, 100.0)
    assert (h.gaps_1h, h.late) == (0, 0)


def test_a_full_minute_on_the_sensor_clock_and_the_newest_windows_age() -> None:
    clock = Clock(T0)
    meter, pipe = SensingHealthMeter(clock_ns=clock), pipeline()
    meter.watch(pipe)
    t = T0 + P * np.arange(4500)  # 90 s at 50 Hz, the last sample at T0 + 89.98 s
    feed(pipe, meter, t, t)
    clock.now = int(t[-1])  # the newest sample just arrived
    h = meter.snapshot()
    assert h is not None
    # Accepted once the stream is 200 ms past a sample: the minute ends at now - 0.2 s and holds 3000 samples.
    assert (h.acc_hz, h.gyro_hz) == (50.0, 50.0)
    # Released up to sample 4489; the grid starts at T0, windows every 64 samples: the last complete one starts at
    # sample 64 * 68 = 4352 and ends at sample 4480, T0 + 89.6 s; now is T0 + 89.98 s.
    assert h.window_age_s == pytest.approx(0.38, abs=1e-9)
    assert (h.gaps_1h, h.late) == (0, 0)
    clock.now = int(t[-1]) + 30 * S  # 30 s of silence: half the minute delivered nothing
    h = meter.snapshot()
    # The minute is (T0 + 59.78 s, T0 + 119.78 s]: samples 2990..4489 were accepted in it (the last ten, within 0.2 s of
    # the newest, wait for a later sample to be released), 1500 in 60 s.
    assert h is not None and (h.acc_hz, h.gyro_hz) == (1500 / 60, 1500 / 60) == (25.0, 25.0)
    assert h.window_age_s == pytest.approx(30.38, abs=1e-9) and h.gaps_1h == 1  # a silence still going on


def test_a_300_s_silence_counts_one_gap_and_ages_out_after_an_hour() -> None:
    clock = Clock(T0)
    meter, pipe = SensingHealthMeter(clock_ns=clock), pipeline()
    meter.watch(pipe)
    before = T0 + P * np.arange(3000)  # 60 s
    after = before[-1] + 300 * S + P * np.arange(3600)  # 300 s of nothing on both streams, then 72 s more
    feed(pipe, meter, before, before)
    feed(pipe, meter, after, after)
    clock.now = int(after[-1])
    h = meter.snapshot()
    assert h is not None and h.gaps_1h == 1  # the acc and the gyro silences overlap: one gap
    assert (h.acc_hz, h.gyro_hz) == (50.0, 50.0)  # the minute after the gap is whole
    clock.now = int(after[-1]) + 3600 * S
    h = meter.snapshot()
    assert h is not None and h.gaps_1h == 1  # the old gap ended more than an hour ago; the silence going on is one
    short = SensingHealthMeter()
    p2 = pipeline()
    short.watch(p2)
    jittery = T0 + P * np.arange(600)
    jittery[300:] += 2 * S  # a 2 s pause: shorter than a window (2.56 s), not a gap
    feed(p2, short, jittery, jittery)
    h = short.snapshot()
    assert h is not None and h.gaps_1h == 0


def test_late_samples_are_counted() -> None:
    meter, pipe = SensingHealthMeter(), pipeline()
    meter.watch(pipe)
    t = T0 + P * np.arange(500)
    late = T0 + P * np.arange(100, 105) + 1  # 5 stamps 8 s behind the newest one: late
    meter.note(pipe.push("acc", t, np.ones((500, 3))))
    meter.note(pipe.push("gyro", t, np.ones((500, 3))))
    meter.note(pipe.push("acc", late, np.ones((5, 3))))
    # More than 1 s behind, they are held as a possible backward clock step until 25 samples on the
    # stream's clock show they were not one (har_models.data.clock); then they count as late.
    more = T0 + P * np.arange(500, 530)
    meter.note(pipe.push("acc", more, np.ones((30, 3))))
    meter.note(pipe.push("gyro", more, np.ones((30, 3))))
    h = meter.snapshot()
    assert h is not None and h.late == pipe.stats.late_dropped == 5


def test_no_pipeline_no_health_and_a_new_session_starts_afresh() -> None:
    meter = SensingHealthMeter()
    assert meter.snapshot() is None  # nothing watched: the status leaves the field out
    pipe = pipeline()
    meter.watch(pipe)
    assert meter.snapshot() == SensingHealth(late=0)  # watched, nothing received yet
    t = T0 + P * np.arange(500)
    feed(pipe, meter, t, t)
    pipe2 = pipeline()
    meter.watch(pipe2)
    assert meter.snapshot() == SensingHealth(late=0)
    with pytest.raises(ValueError, match="rate_span_s"):
        SensingHealthMeter(rate_span_s=math.nan)


def recording(n_acc: int, acc_step_ns: int, n_gyro: int, gyro_step_ns: int) -> Recording:
    t_a, t_g = T0 + acc_step_ns * np.arange(n_acc), T0 + gyro_step_ns * np.arange(n_gyro)
    return Recording("s1", "walk", SensorStream(t_a, np.ones((n_acc, 3))), SensorStream(t_g, np.ones((n_gyro, 3))),
                     LabelTrack(np.array([0]), np.array([7])))  # fmt: skip


@pytest.mark.slow
def test_a_paced_replay_reports_what_the_pipeline_received() -> None:
    """A recording whose phone delivered 40 Hz acc and 50 Hz gyro, replayed at 10x on a test clock: the meter
    reports 40 and 50 Hz (the samples' own clock), not the 50 Hz a replay is meant to give nor the 400/500 per wall second."""
    rec = recording(1201, 25_000_000, 1501, P)  # both end at T0 + 30 s
    wall = [0.0]

    def sleep(s: float) -> None:
        wall[0] += s

    meter, pipe = SensingHealthMeter(), pipeline()
    meter.watch(pipe)
    prog = ReplaySource(rec, speed=10.0, clock=lambda: wall[0], sleep=sleep).run(pipe, meter.note)
    h = meter.snapshot()
    assert prog.finished and wall[0] == pytest.approx(3.0, abs=0.01)  # 30 s of recording in 3 s of (test) wall clock
    assert h is not None and (h.acc_hz, h.gyro_hz) == (40.0, 50.0)


def test_ingest_with_a_replay_feeds_the_meter(tmp_path, monkeypatch) -> None:
    """fedhar-client --replay-speed: ingest_source replays through a watched pipeline (same windows as before)."""
    from edge_client import sources
    from edge_client.sensors.replay import replay_windows
    from edge_client.store import ClientStore
    from har_models.data.splits import SplitSpec
    from har_models.data.subjects import SubjectSource

    rec = recording(3001, P, 3001, P)  # 60 s at 50 Hz
    monkeypatch.setattr(sources, "recordings_of", lambda spec: [rec])
    spec = SubjectSource("realworld", tmp_path, "s1", ("chest",), REALWORLD_LABELS, SplitSpec.parse("paper", seed=1))
    store = ClientStore(tmp_path / "state", REALWORLD_LABELS)
    try:
        meter = SensingHealthMeter()
        n_train, n_test = sources.ingest_source(store, spec, speed=1000.0, health=meter)
        expected = replay_windows(rec, REALWORLD_LABELS)
        assert n_train + n_test == len(expected) > 0
        h = meter.snapshot()
        assert h is not None and (h.acc_hz, h.gyro_hz, h.gaps_1h, h.late) == (50.0, 50.0, 0, 0)
        # without a clock, now is the newest sample (T0 + 60 s); the last whole window is samples 2816..2943 (64 * 44 + 127 <= 3000)
        assert expected.t_start_ns is not None
        ends = expected.t_start_ns + 128 * P
        assert int(ends.max()) == T0 + 2944 * P
        assert h.window_age_s == pytest.approx((3000 - 2944) * 0.02, abs=1e-9) == 1.12
    finally:
        store.close()


# ---------------------------------------------------------------------- the client fills them
class LiveStandIn:
    """A live sensor source as the app's controller sees it, stamping on a clock the test moves (``clock_ns``)."""

    name = "stand-in"
    running = False

    def __init__(self, clock: Clock) -> None:
        self.clock_ns = clock

    def start(self, on_chunk, on_end=None) -> None:
        self.running = True

    def stop(self) -> None:
        self.running = False

    def fault(self) -> str:
        return ""  # a source delivering as asked


def test_the_apps_status_carries_backend_arch_version_and_health(tmp_path) -> None:
    from edge_client.app.controller import AppConfig, DeviceController
    from har_models.data.windowing import WindowSet
    from har_models.nn.arch import ArchSpec

    clock = Clock(T0)
    cfg = AppConfig(state_dir=tmp_path, labels=HAPT_LABELS, client_id="phone-1", broker="127.0.0.1:9", backend="numpy")  # nobody listens
    ctl = DeviceController(cfg, LiveStandIn(clock), charging=lambda: False, supervise_s=60)  # type: ignore[arg-type]  # a stand-in with the source's methods
    try:
        ctl.start_sensing()
        t = T0 + P * np.arange(4500)  # 90 s at 50 Hz on both streams
        for a in range(0, t.size, 100):
            for sensor in ("acc", "gyro"):
                ctl._on_chunk((sensor, t[a : a + 100], np.ones((t[a : a + 100].size, 3))))
        clock.now = int(t[-1])
        rng = np.random.default_rng(0)  # recorded windows, so the agent has data to take part with
        ctl.window_log.append(WindowSet(rng.normal(size=(40, 6, 128)).astype(np.float32), np.arange(40) % 6, HAPT_LABELS))
        ctl._start_agent()
        assert ctl._agent is not None
        st = ClientStatus.from_bytes(ctl._agent._status_bytes())
        assert (st.backend, st.arch_version) == ("numpy", None)  # no round yet: no local model
        for on in (False, True):  # the charger as the federation supervisor last read it
            ctl.federation.charging = on
            assert ClientStatus.from_bytes(ctl._agent._status_bytes()).charging is on
        assert st.sensing_health == SensingHealth(acc_hz=50.0, gyro_hz=50.0, window_age_s=0.38, gaps_1h=0, late=0)
        spec = ArchSpec(n_classes=6, conv_filters=8, dense_units=16, version=4)
        ctl.store.save_local_model(spec.to_json(), {k: np.zeros(v, np.float32) for k, v in spec.shapes().items()})
        ctl._agent.trainer.program_fault = "pte_corrupt"  # programs refused: the rounds train on the fallback
        st = ClientStatus.from_bytes(ctl._agent._status_bytes())
        assert (st.backend, st.arch_version) == ("numpy", 4)
        clock.now = int(t[-1]) + 300 * S  # Doze: nothing for 300 s
        h = ClientStatus.from_bytes(ctl._agent._status_bytes()).sensing_health
        assert h is not None and (h.acc_hz, h.gyro_hz, h.gaps_1h) == (0.0, 0.0, 1) and h.window_age_s == pytest.approx(300.38)
    finally:
        ctl.close()


def test_the_trainer_names_the_fallback_while_programs_are_refused(tmp_path) -> None:
    from edge_client.store import ClientStore
    from edge_client.trainer import FALLBACK_BACKEND, ClientTrainer

    store = ClientStore(tmp_path, HAPT_LABELS)
    try:
        tr = ClientTrainer(store, "phone-1", "executorch")
        assert tr.backend_in_use == "executorch" and tr.arch_version is None
        tr.program_fault = "pte_incompatible"
        assert tr.backend_in_use == FALLBACK_BACKEND == "numpy"
        (tmp_path / "local_model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")  # no architecture in it
        assert tr.arch_version is None
    finally:
        store.close()


def test_fedhar_client_with_a_paced_replay_reports_its_pipelines_health(tmp_path, monkeypatch) -> None:
    """fedhar-client --replay-speed: the status carries what the replay's pipeline received; a second start that
    ingests nothing (the store has the source) runs no pipeline and leaves the health out."""
    from edge_client import cli
    from edge_client.agent import EdgeAgent

    hapt = Path(__file__).resolve().parents[1] / "datasets" / "hapt" / "user05.npz"
    seen: list[ClientStatus] = []

    def run(self: EdgeAgent, stop: threading.Event, max_seconds: float | None = None) -> int:
        seen.append(ClientStatus.from_bytes(self._status_bytes()))  # the status it would publish on connecting
        return 0

    monkeypatch.setattr(EdgeAgent, "run", run)
    argv = ["--client-id", "hapt-05", "--source", f"hapt:{hapt}", "--state-dir", str(tmp_path), "--broker", "127.0.0.1:9",
            "--backend", "numpy"]  # fmt: skip
    first = cli.prepare([*argv, "--replay-speed", "4000"])
    assert not isinstance(first, int) and first.health is not None
    assert cli.serve(first, threading.Event()) == 0
    h = seen[-1].sensing_health
    assert h is not None and seen[-1].backend == "numpy" and seen[-1].arch_version is None
    assert (h.acc_hz, h.gyro_hz, h.late) == (50.0, 50.0, 0)  # HAPT's streams are 50 Hz, one sample every 20 ms
    again = cli.prepare([*argv, "--replay-speed", "4000"])
    assert not isinstance(again, int)
    assert cli.serve(again, threading.Event()) == 0
    assert seen[-1].sensing_health is None
