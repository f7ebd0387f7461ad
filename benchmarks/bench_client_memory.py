"""A client's peak memory in a federation round, per training backend, against its imports alone.

Runs short federations over the embedded broker on 127.0.0.1: the coordinator in this process,
one real ``fedhar-client`` process per backend (``python -m edge_client.cli --backend torch |
numpy | executorch``, one thread, the same HAPT subject for every client so that their data are
equal), the paper CNN (F = 196, H = 1024: 6.45 M parameters, 25.8 MB per float32 copy) unless
``--conv-filters/--dense-units``; once with ``client_init = overwrite`` and once with FedALA's
``ala`` (``--ala`` chooses). Per client process it reads, from ``/proc/<pid>``:

- ``ingest MB``: the peak resident set (VmHWM) from the start to the moment the client has
  ingested its windows (replaying the HAPT recordings through the sensor pipeline; its log says
  so), read then;
- ``round MB``: VmHWM from then (reset to the current RSS through ``/proc/<pid>/clear_refs``)
  to its exit after the run: joining, the model, training, ALA, evaluation, the update. Read by
  polling ``/proc/<pid>/status`` every 50 ms; the last reading before exit comes after the last
  round (the coordinator aggregates and announces the end in between).

(``ru_maxrss`` from ``wait4`` is not used: on Linux it also counts the forked copy of this
process before ``exec``, i.e. the coordinator with PyTorch loaded.)

Baseline, in the same run: ``import MB``, the peak of a bare interpreter that imports what that
backend's client imports (``edge_client.cli`` and the backend's trainer and runtime: PyTorch,
numpy, or the ExecuTorch runtime and PyTorch) and exits. ``round - import`` is what the model,
the data and the training add. Goal of issue 13: at most 400 MB per client (a Raspberry Pi 3
has 1 GB).

ExecuTorch programs are exported on first use of an architecture, inside the client; a first
warm-up federation (one round, not measured) fills ``--program-cache`` so that the measured
runs load them as a device that already has them would. That client's figures are printed as
``export``: its round peak includes the export (what a device pays once per architecture if it
exports the programs itself).

Last lines: ``<backend>[_ala]_round_peak_mb=<MB>`` for every run, then
``client_peak_rss_mb=<MB>``: the round peak of the lowest-footprint backend without ALA.

    python benchmarks/bench_client_memory.py [--backends torch,numpy,executorch] [--rounds 2]
        [--ala both|off|on] [--subject 01] [--conv-filters 196 --dense-units 1024]
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coordinator.config import CoordinatorConfig, EvaluationSettings, ModelSettings, Timing, TrainingSettings  # noqa: E402
from coordinator.evaluation import Evaluator  # noqa: E402
from coordinator.service import Coordinator  # noqa: E402
from har_io.broker_config import BrokerConfig  # noqa: E402
from har_models.data.subjects import union_test_set  # noqa: E402
from har_models.nn.arch import ArchSpec  # noqa: E402
from simulation.broker import EmbeddedBroker  # noqa: E402

MB = 1024 * 1024
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
IMPORTS = {
    "torch": "import edge_client.cli, edge_client.agent, edge_client.trainer, edge_client.backends.torch_eager",
    "numpy": "import edge_client.cli, edge_client.agent, edge_client.trainer, edge_client.backends.numpy_ref",
    "executorch": "import edge_client.cli, edge_client.agent, edge_client.trainer, edge_client.backends.executorch_rt",
}
INGESTED = "test windows from"  # the client's log line once its windows are in its store (edge_client/cli.py)


def _status_kb(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def import_peak(backend: str) -> int:
    """Peak RSS (bytes) of a bare interpreter importing what a ``backend`` client imports (its own VmHWM)."""
    code = IMPORTS[backend] + "; print(next(l for l in open('/proc/self/status') if l.startswith('VmHWM:')).split()[1])"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **ONE_THREAD}, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_client_memory: importing the {backend} client's modules failed:\n{done.stderr[-2000:]}")
    return int(done.stdout.split()[-1]) * 1024


class Client:
    """One ``fedhar-client`` process and a thread that follows its memory."""

    def __init__(self, backend: str, port: int, federation: str, source: str, tmp: Path):
        self.backend, self.cid = backend, f"mem-{backend}"
        self.log = tmp / f"{federation}-{self.cid}.log"
        args = ["--client-id", self.cid, "--broker", f"127.0.0.1:{port}", "--federation", federation, "--source", source,
                "--state-dir", str(tmp / federation / self.cid), "--backend", backend, "--program-cache", str(tmp / "programs"),
                "--threads", "1", "--max-seconds", "900", "--exit-after-run", federation]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "edge_client.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                                         cwd=ROOT, env={**os.environ, **ONE_THREAD})
        self.ingest_kb: int | None = None  # VmHWM just before the reset: start-up and ingest
        self.round_kb: int | None = None  # VmHWM after it: the federation rounds
        self.reset = False
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()

    def _follow(self) -> None:
        pid = self.proc.pid
        while Path(f"/proc/{pid}").exists() and self.proc.returncode is None:
            if not self.reset and INGESTED in self.log.read_text(errors="replace"):
                self.ingest_kb = _status_kb(pid, "VmHWM")
                try:
                    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := current RSS (Linux >= 4.0)
                    self.reset = True
                except OSError:
                    return
            if self.reset:
                hwm = _status_kb(pid, "VmHWM")
                if hwm is not None:
                    self.round_kb = hwm
            time.sleep(0.05)

    def finish(self, timeout: float) -> tuple[int, int | None, int | None]:
        """Wait up to ``timeout`` s for the exit (then kill); (status, ingest peak bytes, round peak bytes), None if unread."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.thread.join(5)
        return rc, *(None if kb is None else kb * 1024 for kb in (self.ingest_kb, self.round_kb))  # type: ignore[return-value]


def federation(name: str, backends: list[str], args: argparse.Namespace, rounds: int, client_init: str,
               tmp: Path) -> dict[str, tuple[int | None, int | None]]:
    """Run one federation with one client per backend; backend -> (ingest peak, round peak) in bytes (None: unread)."""
    source = f"hapt:{args.data_dir / f'user{args.subject}.npz'}"
    t0 = time.monotonic()
    with EmbeddedBroker() as broker:
        clients = [Client(b, broker.port, name, source, tmp) for b in backends]
        try:
            cfg = CoordinatorConfig(
                run_dir=tmp / name / "run", broker=BrokerConfig(port=broker.port), federation=name, run_id=name,
                rounds=rounds, min_clients=len(backends), client_init=client_init,
                timing=Timing(expected_clients=len(backends), start_timeout_s=600, round_timeout_s=600),
                model=ModelSettings(conv_filters=args.conv_filters, dense_units=args.dense_units),
                training=TrainingSettings(local_epochs=1), evaluation=EvaluationSettings(generalisation_every=0),
            )
            doc = Coordinator(cfg, Evaluator(union_test_set({c.cid: source for c in clients})), progress=False).run()
        finally:
            ends = {c.backend: c.finish(120) for c in clients}
        out = {}
        for c in clients:
            rc, peak, rnd = ends[c.backend]
            if rc != 0:
                sys.exit(f"bench_client_memory: {name}: the {c.backend} client ended with {rc}:\n{c.log.read_text()[-3000:]}")
            out[c.backend] = (peak, rnd)
    updates = [r["updates"] for r in doc["rounds"]]
    if updates != [len(backends)] * rounds:
        sys.exit(f"bench_client_memory: {name}: updates per round {updates}, expected {len(backends)} each")
    print(f"  {name}: {rounds} round(s), {len(backends)} clients, {time.monotonic() - t0:.0f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the benchmark; print the table and the result lines; return the round peaks in MB."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="torch,numpy,executorch", help="comma-separated (torch,numpy,executorch)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per federation (2: ALA runs in round 1)")
    ap.add_argument("--ala", choices=("both", "off", "on"), default="both", help="client_init overwrite, ala, or both (both)")
    ap.add_argument("--subject", default="01", help="HAPT subject every client replays (01)")
    ap.add_argument("--conv-filters", type=int, default=196, help="F of the CNN (paper: 196)")
    ap.add_argument("--dense-units", type=int, default=1024, help="H of the CNN (paper: 1024)")
    ap.add_argument("--data-dir", type=Path, default=ROOT / "datasets" / "hapt", help="folder of the userXX.npz files")
    args = ap.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or any(b not in IMPORTS for b in backends):
        sys.exit(f"bench_client_memory: --backends must name some of {sorted(IMPORTS)}, got {args.backends!r}")
    if args.rounds < 1:
        sys.exit("bench_client_memory: --rounds must be >= 1")
    logging.basicConfig(level=logging.WARNING)

    imports = {b: import_peak(b) for b in backends}
    inits = {"both": ["overwrite", "ala"], "off": ["overwrite"], "on": ["ala"]}[args.ala]
    runs: dict[tuple[str, str], tuple[int | None, int | None]] = {}
    export: tuple[int | None, int | None] | None = None
    with tempfile.TemporaryDirectory(prefix="bench-client-mem-") as tmp_s:
        tmp = Path(tmp_s)
        if "executorch" in backends:
            export = federation("memwarm", backends, args, 1, "overwrite", tmp)["executorch"]
        for init in inits:
            for b, v in federation(f"mem{init}", backends, args, args.rounds, init, tmp).items():
                runs[(b, init)] = v

    params = ArchSpec(n_classes=6, conv_filters=args.conv_filters, dense_units=args.dense_units).n_parameters()
    print(f"\nclient peak memory: HAPT subject {args.subject}, CNN F={args.conv_filters} H={args.dense_units} "
          f"({params / 1e6:.2f} M parameters, {params * 4 / 1e6:.1f} MB per float32 copy), E=1, batch 32, "
          f"{args.rounds} round(s), 1 thread")
    print("baseline: a bare interpreter importing the backend's client modules (import MB)\n")
    print(f"{'backend':>10} {'init':>9} {'import MB':>9} {'ingest MB':>9} {'round MB':>9} {'round-import':>12}")

    def mb(v: int | None) -> str:
        return "n/a" if v is None else f"{v / MB:.0f}"

    values: dict[str, float] = {}
    for (b, init), (ingest, rnd) in runs.items():
        if rnd is not None:
            values[f"{b}{'_ala' if init == 'ala' else ''}_round_peak_mb"] = rnd / MB
        print(f"{b:>10} {init:>9} {mb(imports[b]):>9} {mb(ingest):>9} {mb(rnd):>9} "
              f"{mb(None if rnd is None else rnd - imports[b]):>12}")
    if export is not None:
        print(f"{'executorch':>10} {'export':>9} {mb(imports['executorch']):>9} {mb(export[0]):>9} {mb(export[1]):>9} {'':>12}"
              "  (warm-up: the client exports the programs in its round)")
    if not values:
        sys.exit("bench_client_memory: no client's round peak could be read (/proc/<pid>/clear_refs not writable?)")
    plain = {b: values[f"{b}_round_peak_mb"] for b in backends if f"{b}_round_peak_mb" in values} or values
    best = min(plain, key=lambda k: plain[k])
    print(" ".join(f"{k}={v:.0f}" for k, v in values.items()))
    print(f"client_peak_rss_mb={plain[best]:.0f}")
    return values


if __name__ == "__main__":
    main()
