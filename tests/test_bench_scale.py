"""benchmarks/bench_scale.py: a simulated device's update is one the coordinator takes, and a small run counts every update once.

The small run is the benchmark's own command with 50 devices in 2 generator processes for
2 rounds against a real Mosquitto and the real coordinator, in both transports (MQTT and blobs);
what it counted is read from the coordinator's ``report.json``, not from the benchmark's table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.script_module import load_script

from har_models.wire import codec
from har_models.wire.messages import ClientStatus, RoundAnnouncement
from har_models.wire.update_meta import UpdateMeta
from simulation.broker import find_mosquitto

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench_scale.py"


def _bench() -> Any:
    return load_script(BENCH)


def test_update_is_the_received_model_plus_small_deterministic_noise() -> None:
    bench = _bench()
    received = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(3, dtype=np.float32)}
    ann = RoundAnnouncement(run_id="r1", round=4, state="training", arch={"version": 2}, label_set="hapt6", selected=("d00007",))
    env_bytes = bench.update_envelope(7, ann, received, seed=1)
    assert env_bytes == bench.update_envelope(7, ann, received, seed=1)  # same device, round and seed: same bytes
    assert env_bytes != bench.update_envelope(8, ann, received, seed=1)
    env = codec.decode(env_bytes)
    assert (env.kind, env.round, env.arch_version, env.client_id) == ("update", 4, 2, "d00007")
    meta = UpdateMeta.from_wire(env.meta)
    assert (meta.run_id, meta.n_train, meta.label_set) == ("r1", 47, "hapt6")
    for name, w0 in received.items():
        d = np.asarray(env.tensors[name]) - w0
        assert d.dtype == np.float32 and d.shape == w0.shape
        assert 0 < np.abs(d).max() < 1e-2  # noise of std 1e-3: never 0, never 10 sigma


def test_status_is_eligible_and_consistent_with_its_updates() -> None:
    bench = _bench()
    st = ClientStatus.from_bytes(bench.device_status(7, "abcd"))
    assert (st.client_id, st.state, st.label_set, st.n_train) == ("d00007", "idle", "hapt6", bench.n_train_of(7))
    assert sum(st.class_counts) == st.n_train
    assert st.train_stats["count"] == st.n_train * bench.WINDOW_SAMPLES


def _result(transport: str, n: int, broker: float, lost: int = 0, double: int = 0) -> dict[str, Any]:
    http = 5000.0 if transport == "blobs" else 0.0
    return {"transport": transport, "updates": n, "cpu_s_per_update": 0.01, "coord_peak_rss_mib": 270.0, "round_wall_s": 1.5,
            "broker_bytes_per_round": broker, "bytes_per_device": broker / n, "http_bytes_per_round": http, "lost": lost,
            "double": double}  # fmt: skip


def test_last_line_compares_the_transports_at_the_largest_size() -> None:
    bench = _bench()
    results = [_result("mqtt", 10, 1e6, lost=7), _result("blobs", 10, 1e3, double=9),  # a smaller N: not in the line
               _result("mqtt", 100, 400_000.0, lost=1), _result("blobs", 100, 3_000.0, lost=2, double=3)]  # fmt: skip
    figures = dict(kv.split("=", 1) for kv in bench.summary_line(results).split())
    assert figures["updates"] == "100"
    assert figures["blob_broker_ratio"] == "0.0075"  # 3,000 / 400,000
    assert (figures["lost"], figures["double"]) == ("3", "3")  # summed over both transports at N=100 only
    assert (figures["mqtt_bytes_per_device"], figures["blobs_bytes_per_device"]) == ("4000", "30")
    assert figures["blobs_http_bytes_per_round"] == "5000" and "mqtt_http_bytes_per_round" not in figures
    only_mqtt = dict(kv.split("=", 1) for kv in bench.summary_line(results[2:3]).split())
    assert "blob_broker_ratio" not in only_mqtt and only_mqtt["lost"] == "1"


@pytest.mark.slow
@pytest.mark.mosquitto
def test_fifty_devices_two_rounds_both_transports_every_update_counted_once(tmp_path: Path) -> None:
    if find_mosquitto() is None:
        if os.environ.get("FEDHAR_REQUIRE_MOSQUITTO") == "1":
            pytest.fail("mosquitto is required (FEDHAR_REQUIRE_MOSQUITTO=1) but not installed; apt-get install mosquitto")
        pytest.skip("mosquitto not installed (apt-get install mosquitto)")
    done = subprocess.run(
        [sys.executable, str(BENCH), "--sizes", "50", "--rounds", "2", "--procs", "2", "--round-timeout", "60", "--keep", str(tmp_path)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    runs = {}
    for transport in ("mqtt", "blobs"):
        report = json.loads((tmp_path / f"n50-{transport}" / "run" / "report.json").read_text())
        assert [(r["round"], r["selected"], r["updates"], r.get("duplicates", 0)) for r in report["rounds"]] == [
            (0, 50, 50, 0), (1, 50, 50, 0)], transport  # fmt: skip
        line = next(ln for ln in done.stdout.splitlines() if ln.startswith(f"N=50 {transport}: "))
        runs[transport] = json.loads(line.split(": ", 1)[1])
        assert runs[transport]["device_accepted"] == [50, 50], transport
    mqtt_run, blob_run = runs["mqtt"], runs["blobs"]
    # Blob mode: the model was fetched once per generator process and round, and every update went over HTTP.
    assert (blob_run["model_fetches"], blob_run["upload_errors"]) == (2 * 2, 0)
    # ... on kept-alive connections: at most one per upload thread and round (2 processes x 4 threads x 2 rounds), not one per PUT.
    assert 1 <= blob_run["http_connections"] <= 2 * 4 * 2
    assert (mqtt_run["model_fetches"], mqtt_run["http_bytes_per_round"]) == (0, 0)
    update_bytes = blob_run["http_up_per_round"] / 50  # no re-sends in so small a run: one PUT per device and round
    assert blob_run["resent"] == 0 and 1000 < update_bytes < 3000  # a 1.6 kB envelope for this CNN
    assert blob_run["http_down_per_round"] == pytest.approx(2 * update_bytes, rel=0.2)  # 2 processes x the model (same tensors)
    last = done.stdout.strip().splitlines()[-1]
    figures = dict(kv.split("=", 1) for kv in last.split())
    assert set(figures) == {"updates", "blob_broker_ratio", "lost", "double", "blobs_http_bytes_per_round"} | {
        f"{t}_{k}" for t in ("mqtt", "blobs")
        for k in ("cpu_s_per_update", "coord_peak_rss_mib", "round_wall_s", "broker_bytes_per_round", "bytes_per_device")}  # fmt: skip
    assert (figures["updates"], figures["lost"], figures["double"]) == ("50", "0", "0")
    for t in ("mqtt", "blobs"):
        assert float(figures[f"{t}_cpu_s_per_update"]) > 0 and float(figures[f"{t}_coord_peak_rss_mib"]) > 50
        assert float(figures[f"{t}_broker_bytes_per_round"]) == pytest.approx(50 * float(figures[f"{t}_bytes_per_device"]), rel=1e-3)
    # MQTT: every device at least sent its update (~1.6 kB for this CNN) and received the model once per round.
    assert float(figures["mqtt_bytes_per_device"]) > 3000
    # Blobs: the model and update bytes left the broker, so it moved less than over MQTT, by at least those 2 x 1.6 kB a device.
    mqtt_b, blob_b = float(figures["mqtt_broker_bytes_per_round"]), float(figures["blobs_broker_bytes_per_round"])
    assert blob_b < mqtt_b - 50 * 2 * update_bytes
    assert float(figures["blob_broker_ratio"]) == pytest.approx(blob_b / mqtt_b, abs=1e-4)
