"""Program delivery end to end: ExecuTorch clients that cannot export receive every version's programs over MQTT.

A small FedDist federation (three HAPT subjects, a small CNN, the embedded broker, the
coordinator in this process, the clients as separate processes) whose architecture grows after
round 0. One client trains with PyTorch; one with ExecuTorch's Python runtime and one through the
Android adapter (``--backend executorch-android``, ExecuTorch's Java classes replaced by
``tests/support/java_executorch_standin.py``, since no JVM exists here). Neither ExecuTorch client has
programs, and both have the exporter replaced by one that fails, so each version's programs can
only come from the coordinator. Real ExecuTorch programs (executorch 1.4.0) run throughout.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.config import (
    CoordinatorConfig,
    EvaluationSettings,
    FedDistSettings,
    ModelSettings,
    Timing,
    TrainingSettings,
    TransportSettings,
)
from coordinator.evaluation import Evaluator
from coordinator.service import Coordinator
from coordinator.state import RunState
from har_io.mqtt_link import BrokerConfig
from har_models.data.subjects import union_test_set
from har_models.wire import codec
from simulation.broker import EmbeddedBroker

pytestmark = pytest.mark.slow  # exports ExecuTorch programs and runs a growing federation

ROOT = Path(__file__).resolve().parents[1]
# The client's process cannot export: every export entry point of the exporter fails.
NO_EXPORT = (
    "import sys\n"
    "import har_models.nn.export as ex\n"
    "def blocked(*a, **k):\n"
    "    raise ImportError('exporting ExecuTorch programs is blocked in this client')\n"
    "ex.export_training_program = ex.export_inference_program = ex.export_static_inference_program = blocked\n"
)
# ... and, for the Android adapter, pyjnius's autoclass is the stand-in of ExecuTorch's Java classes.
STANDIN_JNIUS = (
    "import types\n"
    "from tests.support.java_executorch_standin import autoclass\n"
    "sys.modules['jnius'] = types.SimpleNamespace(autoclass=autoclass)\n"
)
MAIN = "from edge_client.cli import main\nsys.exit(main(sys.argv[1:]))\n"
BACKENDS = {1: "torch", 2: "executorch", 3: "executorch-android"}


def _client(k: int, backend: str, port: int, tmp: Path) -> subprocess.Popen[bytes]:
    cid = f"hapt-{k:02d}"
    args = ["--client-id", cid, "--broker", f"127.0.0.1:{port}", "--federation", "grow", "--source",
            f"hapt:{ROOT / 'datasets' / 'hapt' / f'user{k:02d}.npz'}", "--state-dir", str(tmp / cid),
            "--backend", backend, "--max-seconds", "900", "--exit-after-run", "grow"]  # fmt: skip
    if backend == "torch":
        cmd = [sys.executable, "-m", "edge_client.cli", *args]
    else:
        boot = NO_EXPORT + (STANDIN_JNIUS if backend == "executorch-android" else "") + MAIN
        cmd = [sys.executable, "-c", boot, *args, "--programs", "fetch"]
    with open(tmp / f"{cid}.log", "wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def _stored_versions(folder: Path) -> list[int]:
    return sorted(json.loads(p.read_text())["spec"]["version"] for p in folder.glob("*.json"))


@pytest.mark.parametrize("transport", ["mqtt", "blobs"])
def test_executorch_clients_get_the_programs_of_each_grown_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   transport: str) -> None:  # fmt: skip
    pytest.importorskip("executorch")
    exporter_cache = tmp_path / "coordinator-programs"
    monkeypatch.setenv("FEDHAR_PROGRAM_CACHE", str(exporter_cache))  # the coordinator exports each version afresh
    sources = {f"hapt-{k:02d}": f"hapt:{ROOT / 'datasets' / 'hapt' / f'user{k:02d}.npz'}" for k in BACKENDS}
    with EmbeddedBroker() as broker:
        procs = {k: _client(k, b, broker.port, tmp_path) for k, b in BACKENDS.items()}
        try:
            cfg = CoordinatorConfig(
                run_dir=tmp_path / "run", broker=BrokerConfig(port=broker.port), federation="grow", run_id="grow",
                rounds=2, growth="feddist", timing=Timing(expected_clients=3, start_timeout_s=300, round_timeout_s=400),
                model=ModelSettings(conv_filters=8, dense_units=32), training=TrainingSettings(lr=0.05, local_epochs=1),
                evaluation=EvaluationSettings(generalisation_every=0), feddist=FedDistSettings(mode="function_preserving", k0=0.1),
                transport=TransportSettings(kind=transport),
            )  # fmt: skip
            doc = Coordinator(cfg, Evaluator(union_test_set(sources)), progress=False).run()
        finally:
            for p in procs.values():
                try:
                    p.wait(90)
                except subprocess.TimeoutExpired:
                    p.kill()
    logs = {k: (tmp_path / f"hapt-{k:02d}.log").read_text() for k in BACKENDS}
    tails = {k: v[-3000:] for k, v in logs.items()}
    rounds = doc["rounds"]
    # Round 0 trains version 0; FedDist grows the model after it, so round 1 trains a later version.
    grown = rounds[0]["arch_version"]
    assert grown > 0, rounds[0].get("growth")
    assert [r["updates"] for r in rounds] == [3, 3], tails  # every client's update counted in both rounds
    assert [r["missing"] for r in rounds] == [[], []], tails
    for k in (2, 3):
        # Both versions arrived over MQTT and were stored in the client's own state folder ...
        assert _stored_versions(tmp_path / f"hapt-{k:02d}" / "programs") == [0, grown], tails[k]
        assert "stored the ExecuTorch programs of architecture v0" in logs[k]
        assert f"stored the ExecuTorch programs of architecture v{grown}" in logs[k]
        # ... and the client trained on them (two rounds reported, none refused).
        assert logs[k].count(f"'backend': '{BACKENDS[k]}'") == 2, tails[k]
        assert "rejected the programs" not in logs[k] and "cannot follow" not in logs[k], tails[k]
        assert procs[k].returncode == 0, tails[k]
    assert "asking the coordinator" not in logs[1]  # the PyTorch client never asks
    assert _stored_versions(exporter_cache) == [0, grown]  # the coordinator exported each version once
    assert RunState(tmp_path / "run").events("program_request_rejected") == []
    if transport == "blobs":
        # The programs went through the blob store: each ExecuTorch client's last set is an object addressed to it
        # (the one before it was dropped), beside the last round's global model.
        kinds = sorted((codec.peek_header(p.read_bytes())["kind"], codec.peek_header(p.read_bytes())["client_id"])
                       for p in (tmp_path / "run" / "blobs" / "objects").iterdir())  # fmt: skip
        assert kinds == [("model", ""), ("program", "hapt-02"), ("program", "hapt-03")], kinds
