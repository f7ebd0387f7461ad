"""What taking part costs a device (edge_client.cost): CPU of sensing per hour and of each round, the battery's drain
per day; in the status the coordinator parses, on its page, and in the app's words."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient
from support.replay_day import hapt_day

from coordinator.server.monitor import Monitor
from coordinator.server.web import ServerView, make_app
from edge_client.agent import ClientConfig, EdgeAgent
from edge_client.app.controller import AppConfig, DeviceController
from edge_client.backends.numpy_ref import init_weights
from edge_client.cost import ROUND_COST_KEY, SENSING_MIN_S, CostMeter, RoundCost, cost_words
from edge_client.power import battery_percent_linux
from edge_client.recorder import RECORDED_LOG
from edge_client.sensors.base import ReplaySensor
from edge_client.store import ClientStore
from edge_client.trainer import RoundOutcome
from edge_client.window_log import WindowLog
from har_io.broker_config import BrokerConfig
from har_models.data.labels import HAPT_LABELS
from har_models.data.windowing import WindowSet
from har_models.nn.arch import ArchSpec
from har_models.wire import codec
from har_models.wire.chunking import transfer_id
from har_models.wire.messages import ClientStatus, CoordinatorStatus, DeviceCost, MessageError, RoundAnnouncement, TrainingPlan
from har_models.wire.topics import Topics

SLACK_S = 0.15  # CPU seconds a measurement may add around a known burn (interpreter, the GIL's hand-overs)


def burn(seconds: float) -> None:
    """Use ``seconds`` of this thread's CPU time (a busy loop: no sleep, no I/O)."""
    t0 = time.thread_time()
    x = 0
    while time.thread_time() - t0 < seconds:
        x += 1


def stamps(t0_s: float, t1_s: float) -> np.ndarray:
    return np.array([int(t0_s * 1e9), int(t1_s * 1e9)], np.int64)


# -- sensing ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sensing_cpu_per_hour_is_the_sensor_threads_cpu_over_the_sensed_span() -> None:
    meter = CostMeter()

    def sensor_thread(t_offset_s: float, burn_s: float) -> None:
        # three chunks covering 60 s of samples; CPU burnt inside the handling and between chunks (the "reading");
        # a sleep between chunks (a sensor waiting for its next batch) costs nothing
        for k in range(3):
            with meter.sensing(stamps(t_offset_s + 20 * k, t_offset_s + 20 * (k + 1))):
                burn(burn_s / 2)
            if k < 2:
                burn(burn_s / 2)
            time.sleep(0.05)

    t = threading.Thread(target=sensor_thread, args=(1000.0, 0.2))
    t.start()
    t.join()
    cpu, span = meter.sensing_cpu_s(), meter.sensed_s()
    assert span == pytest.approx(60.0)
    # 3 x 0.1 in the handler and 2 x 0.1 between chunks counted; the last 0.1 came after the last chunk ended
    assert 0.5 <= cpu <= 0.5 + SLACK_S
    assert meter.sensing_cpu_s_per_h() == pytest.approx(cpu / 60.0 * 3600.0)
    # sensing restarted on a new thread: its CPU and span add to the first run's, the gap between runs is no sensing
    t = threading.Thread(target=sensor_thread, args=(5000.0, 0.1))
    t.start()
    t.join()
    assert meter.sensed_s() == pytest.approx(120.0)
    assert 0.75 <= meter.sensing_cpu_s() <= 0.75 + 2 * SLACK_S


@pytest.mark.slow
def test_work_sensing_hands_to_other_threads_counts_as_sensing_and_in_a_round_as_the_rounds() -> None:
    meter = CostMeter()

    def helped(burn_s: float) -> None:  # a library that runs the work on a pool thread of its own (PyTorch, BLAS)
        worker = threading.Thread(target=burn, args=(burn_s,))
        worker.start()
        worker.join()

    def sensor(burn_s: float, chunks: int) -> None:
        for k in range(chunks):
            with meter.sensing(stamps(k, k + 1)):
                if k:  # the first chunk of a thread counts that thread alone
                    helped(burn_s)

    t = threading.Thread(target=sensor, args=(0.3, 2))
    t.start()
    t.join()
    assert 0.3 <= meter.sensing_cpu_s() <= 0.3 + SLACK_S
    # a round's pool threads are the round's: a sensor chunk that ends during the round counts its own thread only
    before = meter.sensing_cpu_s()
    with meter.round(1, lambda: "torch"):
        helped(0.3)
        t = threading.Thread(target=sensor, args=(0.0, 2))
        t.start()
        t.join()
    assert meter.sensing_cpu_s() - before <= SLACK_S / 3
    assert 0.3 <= meter.rounds()[0].cpu_s <= 0.3 + SLACK_S


def test_no_sensing_figure_before_a_minute_of_samples() -> None:
    meter = CostMeter()
    with meter.sensing(stamps(0.0, SENSING_MIN_S - 1)):
        burn(0.01)
    assert meter.sensing_cpu_s() > 0 and meter.sensing_cpu_s_per_h() is None
    assert meter.snapshot().sensing_cpu_s_per_h is None
    with meter.sensing(np.array([int(SENSING_MIN_S * 1e9)], np.int64)):
        pass
    assert meter.sensing_cpu_s_per_h() is not None


# -- rounds ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_round_counts_the_process_cpu_of_the_round_less_the_sensing_threads() -> None:
    meter = CostMeter()
    with meter.round(4, lambda: "numpy"):
        # sensing goes on during the round: 0.3 s of CPU on the sensor thread, not the round's
        sensor = threading.Thread(target=lambda: _sense(meter, 0.3))
        sensor.start()
        burn(0.4)  # the round's own work
        sensor.join()
    assert 0.3 <= meter.sensing_cpu_s() <= 0.3 + SLACK_S
    (rc,) = meter.rounds()
    assert (rc.round, rc.backend) == (4, "numpy")
    assert 0.4 <= rc.cpu_s <= 0.4 + SLACK_S
    assert rc.wall_s >= rc.cpu_s - SLACK_S
    # a round that fails is not a round's cost
    with pytest.raises(RuntimeError), meter.round(5, lambda: "numpy"):
        burn(0.01)
        raise RuntimeError("the plan could not be followed")
    assert [r.round for r in meter.rounds()] == [4]


def _sense(meter: CostMeter, burn_s: float) -> None:
    with meter.sensing(stamps(0, 1)):
        burn(burn_s)


def test_round_costs_survive_as_json_and_bad_entries_are_skipped() -> None:
    meter = CostMeter()
    for r in range(25):
        with meter.round(r, lambda: "torch"):
            pass
    kept = meter.rounds_json()
    assert [d["round"] for d in kept] == list(range(5, 25))  # the newest 20
    again = CostMeter(rounds=[*kept, {"round": 1}, {"round": 2, "backend": "numpy", "cpu_s": -1.0, "wall_s": 0, "unix": 0}])
    assert again.rounds() == meter.rounds()


# -- battery ---------------------------------------------------------------------------------------
def test_battery_percent_per_day_counts_drops_off_the_charger_only() -> None:
    meter = CostMeter()
    for t, pct, charging in [(0, 80, False), (3600, 78, False), (7200, 77, True), (9000, 90, True), (10800, 90, False),
                             (14400, 88, False)]:  # fmt: skip
        meter.note_battery(pct, charging, unix=1e9 + t)
    # 2 % in the first hour off the charger, 2 % in the second: 4 % over 7200 s
    assert meter.battery_pct_per_day() == pytest.approx(4 / 7200 * 86400) == pytest.approx(48.0)
    assert meter.snapshot().battery_pct_per_day == 48.0


def test_battery_is_unknown_without_a_level_and_measuring_before_half_an_hour_off_the_charger() -> None:
    meter = CostMeter()
    meter.note_battery(None, False, unix=1e9)
    assert not meter.battery_seen() and meter.battery_pct_per_day() is None
    assert cost_words(meter.snapshot(), [], meter.battery_seen())[-1] == "Battery: unknown (this device reports no battery level)"
    meter.note_battery(90, False, unix=1e9)
    meter.note_battery(89, False, unix=1e9 + 1200)
    assert meter.battery_seen() and meter.battery_pct_per_day() is None
    assert cost_words(meter.snapshot(), [], True)[-1] == "Battery: measuring (a figure after 30 min off the charger)"
    meter.note_battery(float("nan"), False, unix=1e9 + 1300)
    meter.note_battery(101, False, unix=1e9 + 1400)
    meter.note_battery(88, False, unix=1e9 + 2400)
    assert meter.battery_pct_per_day() == pytest.approx(2 / 2400 * 86400)


def test_the_battery_level_is_read_from_the_linux_power_supply_class(tmp_path: Path) -> None:
    def supply(name: str, **files: str) -> None:
        (tmp_path / name).mkdir()
        for k, v in files.items():
            (tmp_path / name / k).write_text(v + "\n")

    assert battery_percent_linux(tmp_path / "missing") is None
    supply("AC", type="Mains", online="1")
    assert battery_percent_linux(tmp_path) is None  # mains only: a desktop, a board: unknown, never 100
    supply("BAT1", type="Battery", energy_now="30000000", energy_full="40000000")
    assert battery_percent_linux(tmp_path) == 75.0
    supply("BAT0", type="Battery", capacity="57")
    assert battery_percent_linux(tmp_path) == 57.0  # the first battery in name order
    (tmp_path / "BAT0" / "capacity").write_text("garbage\n")
    assert battery_percent_linux(tmp_path) == 75.0  # BAT0 gives no usable figure: the next battery does
    (tmp_path / "BAT1" / "energy_full").write_text("0\n")
    assert battery_percent_linux(tmp_path) is None  # none left: unknown, never 0 or 100


# -- the status and the coordinator ----------------------------------------------------------------
COST = DeviceCost(sensing_cpu_s_per_h=41.5, round_cpu_s=3.25, round_wall_s=4.0, round_backend="numpy", battery_pct_per_day=18.0)


def test_the_cost_round_trips_through_the_status_and_a_status_without_it_reads_as_before() -> None:
    st = ClientStatus("phone-1", "idle", n_train=10, cost=COST)
    assert ClientStatus.from_bytes(st.to_bytes()) == st
    part = ClientStatus("phone-1", "idle", cost=DeviceCost(sensing_cpu_s_per_h=12.0))
    assert b'"cost": {"sensing_cpu_s_per_h": 12.0}' in part.to_bytes()  # unknown figures left out
    assert ClientStatus.from_bytes(part.to_bytes()).cost == DeviceCost(sensing_cpu_s_per_h=12.0)
    old = ClientStatus("phone-1", "idle")
    assert b"cost" not in old.to_bytes() and ClientStatus.from_bytes(old.to_bytes()).cost is None


@pytest.mark.parametrize(
    "cost, words",
    [
        ('{"round_cpu_s": -1}', "cost.round_cpu_s must be a number in [0, 1e+07]"),
        ('{"sensing_cpu_s_per_h": NaN}', "cost.sensing_cpu_s_per_h must be a number"),
        ('{"battery_pct_per_day": true}', "cost.battery_pct_per_day must be a number"),
        ('{"round_backend": "Torch!"}', "cost.round_backend must be a backend name"),
        ('{"watts": 3}', "watts"),
        ("[1, 2]", "cost must be an object"),
    ],
)
def test_a_malformed_cost_is_a_message_error_naming_the_field(cost: str, words: str) -> None:
    good = ClientStatus("phone-1", "idle").to_bytes()
    bad = good[:-1] + b', "cost": ' + cost.encode() + b"}"
    with pytest.raises(MessageError, match=re.escape(words)):
        ClientStatus.from_bytes(bad)


def test_the_status_page_shows_each_devices_cost_and_the_api_carries_it() -> None:
    t, now = Topics("home"), 1_800_000_000.0
    mon = Monitor(t, clock=lambda: 100.0, wall=lambda: now)
    mon.handle(t.coordinator_status, CoordinatorStatus("online", "run-1", "a1", now, 30.0).to_bytes(), True)
    for st in (ClientStatus("phone-a", "idle", sent_unix=now, refresh_s=30.0, cost=COST),
               ClientStatus("pi-b", "idle", sent_unix=now, refresh_s=30.0, cost=DeviceCost(round_cpu_s=2.0, round_backend="torch")),
               ClientStatus("old", "idle", sent_unix=now, refresh_s=30.0)):  # fmt: skip
        mon.handle(t.client_status(st.client_id), st.to_bytes(), False)
    client = TestClient(make_app(ServerView(name="home", monitor=mon, wall=lambda: now)))
    devs = {d["name"]: d for d in client.get("/api/devices").json()}
    assert devs["phone-a"]["cost"] == COST.to_json() and devs["old"]["cost"] == {}
    page = client.get("/").text
    assert "<th>windows (train/test)</th><th>cost</th></tr>" in page
    rows = {m.group(1): m.group(0) for m in re.finditer(r'<tr class="device" data-name="([^"]+)".*?</tr>', page, re.S)}
    assert rows["phone-a"].endswith("<td>sensing 42 s CPU/h, round 3.2 s CPU (numpy), battery 18 %/day</td></tr>")
    assert rows["pi-b"].endswith("<td>round 2.0 s CPU (torch), battery unknown</td></tr>")
    assert rows["old"].endswith('<td><span class="muted">not reported</span></td></tr>')


# -- the agent measures its rounds -----------------------------------------------------------------
SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8, version=0)


def _store(folder: Path, n: int = 40) -> ClientStore:
    rng = np.random.default_rng(0)
    store = ClientStore(folder, HAPT_LABELS)
    x = (rng.normal(size=(n, 6, 128)) * 2).astype(np.float32)
    store.replace_windows("src", WindowSet(x, np.arange(n) % 6, HAPT_LABELS), 0.2, seed=1)
    return store


@pytest.mark.slow
def test_the_agent_measures_a_round_keeps_it_in_the_store_and_reports_it_in_its_status(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        agent = EdgeAgent(ClientConfig(client_id="c", broker=BrokerConfig(port=1), federation="home", backend="numpy"), store)
        assert ClientStatus.from_bytes(agent._status_bytes()).cost is None  # nothing measured yet: left out, as before
        envelope = codec.encode(init_weights(SPEC, 1), kind="model", round=1, arch_version=0)
        transfer = transfer_id(envelope)
        ann = RoundAnnouncement(run_id="r", round=1, state="training", arch=SPEC.to_dict(), label_set="hapt6", selected=("c",),
                                plan=TrainingPlan(local_epochs=1, lr=0.05, batch_size=8, seed=3))  # fmt: skip
        agent.models[transfer] = envelope
        real, inner = agent.trainer.run_round, []

        def round_that_burns(a: RoundAnnouncement, tensors: Mapping[str, np.ndarray]) -> RoundOutcome:
            burn(0.5)  # known work in the round, then the real round on the numpy backend
            p0 = time.process_time()
            out = real(a, tensors)
            inner.append(time.process_time() - p0)
            return out

        agent.trainer.run_round = round_that_burns  # type: ignore[assignment,method-assign]
        outcome = agent.rounds.decode_and_train(ann, transfer, ("r", 1, 0))
        assert outcome is not None and outcome.meta.n_train == len(store.windows("train"))
        (rc,) = agent.cost.rounds()
        assert rc.round == 1 and rc.backend == "numpy"
        assert 0.5 + inner[0] - 0.01 <= rc.cpu_s <= 0.5 + inner[0] + SLACK_S
        cost = ClientStatus.from_bytes(agent._status_bytes()).cost
        assert cost is not None and (cost.round_cpu_s, cost.round_backend) == (round(rc.cpu_s, 3), "numpy")
        assert cost.battery_pct_per_day is None and cost.sensing_cpu_s_per_h is None  # a board without sensing or battery
        assert not agent.cost.battery_seen()
        agent.battery, agent.charging = (lambda: 57.0), (lambda: False)  # a board on a UPS HAT: sampled at each status
        agent._status_bytes()
        assert agent.cost.battery_seen()
        # kept in the store: a restarted agent (or the app's screen) still has it
        assert store.get_meta(ROUND_COST_KEY) == agent.cost.rounds_json()
        again = EdgeAgent(ClientConfig(client_id="c", broker=BrokerConfig(port=1), federation="home", backend="numpy"), store)
        assert again.cost.rounds() == [rc]
    finally:
        store.close()


def test_cost_words_name_each_backend_with_its_latest_round_and_mean() -> None:
    rounds = [RoundCost(1, "numpy", 3.0, 3.5, 0.0), RoundCost(2, "torch", 1.0, 0.6, 0.0), RoundCost(3, "numpy", 4.0, 4.5, 0.0)]
    lines = cost_words(DeviceCost(sensing_cpu_s_per_h=36.0, battery_pct_per_day=24.4), rounds, True)
    assert lines == [
        "Sensing: 36 s of CPU per hour (1.0 % of one core)",
        "A round (numpy): 4.0 s of CPU in 4.5 s, round 3; 3.5 s on average over 2 rounds",
        "A round (torch): 1.0 s of CPU in 0.6 s, round 2",
        "Battery: 24 % a day off the charger (the whole phone, not fedhar alone)",
    ]
    assert cost_words(DeviceCost())[:2] == ["Sensing: measuring its CPU use (after a minute of sensing)",
                                            "A round: no round trained on this device yet"]  # fmt: skip


# -- the app: sensing measured on the sensor thread, shown in the view, carried by the agent's status ------------------
@pytest.mark.slow
def test_the_app_measures_sensing_shows_it_and_its_agent_reports_it(tmp_path: Path) -> None:
    store = ClientStore(tmp_path, HAPT_LABELS)
    store.save_local_model(SPEC.to_json(), init_weights(SPEC, 3))  # every window is classified for the timeline
    store.close()
    x = np.random.default_rng(0).normal(size=(20, 6, 128)).astype(np.float32)
    WindowLog(tmp_path / RECORDED_LOG, HAPT_LABELS).append(WindowSet(x, np.arange(20) % 6, HAPT_LABELS, np.arange(20, dtype=np.int64)))
    source = ReplaySensor(hapt_day(75.0), speed=None, loop=False)
    levels = iter([81.0, 80.0])
    cfg = AppConfig(state_dir=tmp_path, labels=HAPT_LABELS, client_id="phone-1", broker="127.0.0.1:1", backend="numpy")
    p0 = time.process_time()
    ctl = DeviceController(cfg, source, charging=lambda: False, battery=lambda: next(levels, 80.0), supervise_s=0.05)
    try:
        ctl.start_sensing()
        end = time.monotonic() + 120
        while source.running and time.monotonic() < end:
            time.sleep(0.05)
        assert not source.running
        used = time.process_time() - p0
        assert 74.0 <= ctl.cost.sensed_s() <= 75.0  # the replay's span on its own clock, not the wall time it took
        assert 0 < ctl.cost.sensing_cpu_s() <= used  # the sensor thread's share of what the process used meanwhile
        per_h = ctl.cost.sensing_cpu_s_per_h()
        assert per_h is not None
        assert per_h == pytest.approx(ctl.cost.sensing_cpu_s() / ctl.cost.sensed_s() * 3600)
        ctl.set_charge_only(False)
        ctl.set_take_part(True)  # starts the agent (its broker is unreachable: the status is built all the same)
        end = time.monotonic() + 30
        while ctl._agent is None and time.monotonic() < end:
            time.sleep(0.05)
        assert ctl._agent is not None
        cost = ClientStatus.from_bytes(ctl._agent._status_bytes()).cost
        assert cost is not None and cost.sensing_cpu_s_per_h == pytest.approx(per_h, rel=1e-3)
        assert cost.battery_pct_per_day is None  # a level is reported, but not yet for 30 min off the charger
        assert ctl.federation.cost[0] == f"Sensing: {per_h:.0f} s of CPU per hour ({per_h / 36:.1f} % of one core)"
        assert ctl.federation.cost[-1] == "Battery: measuring (a figure after 30 min off the charger)"
    finally:
        ctl.close()
