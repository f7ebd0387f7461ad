"""FedDWA's server step over spilled updates: read block by block from memory maps, against loading every update.

The coordinator spills each update to a safetensors file (:mod:`coordinator.spill`). Baseline
(measured in the same run): the step as it was before the maps, every trained and guidance
model read whole through ``state[name]`` (a plain mapping view of the same files), which
:func:`coordinator.feddwa.distances` then holds at once. Candidate: the same files read as
:class:`coordinator.spill.SpilledState`, one ``(n, b)`` block of all clients at a time.

Each mode runs in a fresh process that resets its peak resident size (``/proc/self/clear_refs``)
just before the step, so ``peak MiB`` is what the step itself adds: the personalised outputs
(n models, needed to publish) plus whatever else it holds. Also checks that both give the same
P and personalised models bit for bit. Linux only.

    python benchmarks/bench_feddwa_mapped.py [--clients 30] [--conv-filters 64 --dense-units 512] [--top-k 5]

The last line gives the key figures as ``key=value`` pairs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coordinator import feddwa  # noqa: E402
from coordinator.spill import SpilledState, spill_update  # noqa: E402
from coordinator.updates import ClientUpdate  # noqa: E402
from har_models.nn.model import ArchSpec, init_state  # noqa: E402


class _Whole(Mapping[str, torch.Tensor]):
    """A spilled state seen only as a mapping (no block reads): how FedDWA read updates before the maps."""

    def __init__(self, state: SpilledState):
        self.state = state

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.state[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.state)

    def __len__(self) -> int:
        return len(self.state)


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def worker(mode: str, folder: Path, names: list[str], top_k: int) -> dict[str, object]:
    """One FedDWA step over the files in ``folder``: seconds, peak growth (bytes), digest of P and the models."""
    files = sorted(folder.glob("*.safetensors"))
    trained: list[Mapping[str, torch.Tensor]] = [SpilledState(p, "", names) for p in files]
    guidance: list[Mapping[str, torch.Tensor]] = [SpilledState(p, "guidance/", names) for p in files]
    if mode == "whole":
        trained = [_Whole(s) for s in trained]  # type: ignore[arg-type]
        guidance = [_Whole(s) for s in guidance]  # type: ignore[arg-type]
    feddwa.aggregate(trained[:2], guidance[:2], top_k=1)  # first-call allocations, outside the measurement
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) restarts from the current resident size
    before = _status_bytes("VmRSS:")
    t0 = time.perf_counter()
    res = feddwa.aggregate(trained, guidance, top_k=top_k)
    seconds = time.perf_counter() - t0
    growth = _status_bytes("VmHWM:") - before
    h = hashlib.sha256(res.weights.numpy().tobytes())
    for st in res.states:
        for name in names:
            h.update(st[name].numpy().tobytes())
    outputs = sum(v.numel() * v.element_size() for st in res.states for v in st.values())
    return {"mode": mode, "seconds": seconds, "peak_growth": growth, "outputs": outputs, "digest": h.hexdigest()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=30)
    ap.add_argument("--conv-filters", type=int, default=64)
    ap.add_argument("--dense-units", type=int, default=512)
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--worker", nargs=3, metavar=("MODE", "FOLDER", "NAMES"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        mode, folder, names = args.worker
        print(json.dumps(worker(mode, Path(folder), json.loads(names), args.top_k)))
        return 0

    spec = ArchSpec(n_classes=6, conv_filters=args.conv_filters, dense_units=args.dense_units)
    names = list(spec.shapes())
    with tempfile.TemporaryDirectory(prefix="bench-feddwa-mapped-") as tmp:
        folder = Path(tmp)
        for k in range(args.clients):
            w = init_state(spec, k)
            g = {name: v + 1e-3 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1000 + k)) for name, v in w.items()}
            spill_update(ClientUpdate(f"c{k:03d}", 0, 0, 100, 2, w, g, size=1), folder)
        spilled = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        rows = {}
        for mode in ("whole", "mapped"):
            cmd = [sys.executable, __file__, "--top-k", str(args.top_k), "--worker", mode, str(folder), json.dumps(names)]
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
            rows[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    same = rows["whole"]["digest"] == rows["mapped"]["digest"]
    mib = 2**20
    print(f"FedDWA step over {args.clients} spilled updates, F={args.conv_filters} H={args.dense_units} "
          f"({spec.n_parameters():,} parameters; {spilled / mib:.0f} MiB of updates on disk; outputs "
          f"{rows['mapped']['outputs'] / mib:.0f} MiB); baseline: every update read whole")
    print(f"{'mode':<8} {'seconds':>8} {'peak MiB':>9} {'peak - outputs MiB':>19}")
    for mode, r in rows.items():
        print(f"{mode:<8} {r['seconds']:>8.2f} {r['peak_growth'] / mib:>9.0f} {(r['peak_growth'] - r['outputs']) / mib:>19.0f}")
    print(f"identical P and personalised models: {same}")
    w, m = rows["whole"], rows["mapped"]
    print(f"clients={args.clients} params={spec.n_parameters()} updates_mib={spilled / mib:.0f} "
          f"whole_peak_mib={w['peak_growth'] / mib:.0f} mapped_peak_mib={m['peak_growth'] / mib:.0f} "
          f"peak_ratio={m['peak_growth'] / w['peak_growth']:.2f} time_ratio={m['seconds'] / w['seconds']:.2f} identical={same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
