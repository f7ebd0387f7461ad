"""Gradient buffers kept across steps against a fresh buffer per step: a local epoch's CPU time and page faults.

One local epoch of the paper CNN (F=196, H=1024; 234 windows, batch 32, one PyTorch thread, SGD)
as :func:`har_models.nn.training.train_local` runs it, in four fresh processes:

- ``fresh``: ``zero_grad(set_to_none=True)``, the training loop before (the baseline);
- ``kept``: ``zero_grad(set_to_none=False)``, the loop now (each tensor's ``.grad`` allocated once);
- and both again with :func:`har_io.memory.bound_mmap_threshold` (4 MiB), the setting that would
  keep a worker's large blocks out of its heap.

Columns: ``CPU s`` median CPU seconds of an epoch over ``--epochs`` epochs after one warm-up;
``faults`` minor page faults per epoch (pages the kernel had to supply: memory returned to the
system and taken again); ``anon MB`` the process's anonymous memory after the epochs. The weights
of ``fresh`` and ``kept`` are equal bit for bit (``tests/test_gradient_buffers.py``).
Last line: ``kept_vs_fresh_cpu=<ratio>`` (glibc's default allocator settings).

    python benchmarks/bench_grad_buffers.py [--epochs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, time
import numpy as np, torch
from har_io.memory import bound_mmap_threshold
from har_models.nn.model import ArchSpec, build_model, init_state
from har_models.nn.training import make_loss
bound, keep, epochs = sys.argv[1] == "1", sys.argv[2] == "1", int(sys.argv[3])
if bound and not bound_mmap_threshold():
    sys.exit("glibc did not take the mmap threshold")
torch.set_num_threads(1)
spec = ArchSpec(n_classes=6)
model = build_model(spec, init_state(spec, 1))
model.train()
rng = np.random.default_rng(0)
x = torch.from_numpy((rng.normal(size=(234, 6, spec.window)) * 3).astype(np.float32))
y = torch.from_numpy(rng.integers(0, spec.n_classes, 234))
loss_fn, opt = make_loss(None), torch.optim.SGD(model.parameters(), lr=0.01)
def epoch():
    for s in range(0, 234, 32):
        opt.zero_grad(set_to_none=not keep)
        loss_fn(model(x[s : s + 32]), y[s : s + 32]).backward()
        opt.step()
epoch()
cpu, faults = [], []
for _ in range(epochs):
    f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
    epoch()
    cpu.append(time.process_time() - t0)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
anon = int(open("/proc/self/smaps_rollup").read().split("Anonymous:")[1].split()[0]) / 1024
print(json.dumps({"cpu": sorted(cpu)[len(cpu) // 2], "faults": sorted(faults)[len(faults) // 2], "anon_mb": anon}))
"""


def measure(bound: bool, keep: bool, epochs: int) -> dict[str, float]:
    """One configuration in a fresh interpreter (the allocator's settings are per process)."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    done = subprocess.run([sys.executable, "-c", CHILD, str(int(bound)), str(int(keep)), str(epochs)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"bench_grad_buffers: the child failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=7, help="timed epochs per configuration (after one warm-up)")
    args = ap.parse_args()
    if args.epochs < 1:
        sys.exit("bench_grad_buffers: --epochs must be >= 1")
    print("paper CNN, one local epoch (234 windows, batch 32), one thread; baseline: fresh gradient buffers, glibc defaults\n")
    print(f"{'allocator':>22} {'buffers':>8} {'CPU s':>7} {'faults':>8} {'anon MB':>8}")
    rows = {}
    for bound in (False, True):
        for keep in (False, True):
            r = rows[bound, keep] = measure(bound, keep, args.epochs)
            alloc = "mmap threshold 4 MiB" if bound else "glibc default"
            print(f"{alloc:>22} {'kept' if keep else 'fresh':>8} {r['cpu']:>7.3f} {r['faults']:>8.0f} {r['anon_mb']:>8.0f}", flush=True)
    print(f"kept_vs_fresh_cpu={rows[False, True]['cpu'] / rows[False, False]['cpu']:.2f}")


if __name__ == "__main__":
    main()
