"""benchmarks/bench_scale.py: a simulated device's update is one the coordinator takes, and a small run counts every update once.

The small run is the benchmark's own command with 50 devices in 2 generator processes for
2 rounds against a real Mosquitto and the real coordinator; what it counted is read from the
coordinator's ``report.json``, not from the benchmark's table.
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


@pytest.mark.slow
@pytest.mark.mosquitto
def test_fifty_devices_two_rounds_every_update_counted_once(tmp_path: Path) -> None:
    if find_mosquitto() is None:
        if os.environ.get("FEDHAR_REQUIRE_MOSQUITTO") == "1":
            pytest.fail("mosquitto is required (FEDHAR_REQUIRE_MOSQUITTO=1) but not installed; apt-get install mosquitto")
        pytest.skip("mosquitto not installed (apt-get install mosquitto)")
    done = subprocess.run(
        [sys.executable, str(BENCH), "--sizes", "50", "--rounds", "2", "--procs", "2", "--round-timeout", "60", "--keep", str(tmp_path)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "n50" / "run" / "report.json").read_text())
    assert [(r["round"], r["selected"], r["updates"], r.get("duplicates", 0)) for r in report["rounds"]] == [(0, 50, 50, 0), (1, 50, 50, 0)]
    last = done.stdout.strip().splitlines()[-1]
    figures = dict(kv.split("=", 1) for kv in last.split())
    assert set(figures) == {"updates", "cpu_s_per_update", "coord_peak_rss_mib", "round_wall_s", "broker_bytes_per_round",
                            "bytes_per_device", "lost", "double"}  # fmt: skip
    assert (figures["updates"], figures["lost"], figures["double"]) == ("50", "0", "0")
    assert float(figures["cpu_s_per_update"]) > 0 and float(figures["coord_peak_rss_mib"]) > 50
    # Every device at least sent its update (~1.6 kB for this CNN) and received the model once per round.
    assert float(figures["bytes_per_device"]) > 3000
    assert float(figures["broker_bytes_per_round"]) == pytest.approx(50 * float(figures["bytes_per_device"]), rel=1e-3)
