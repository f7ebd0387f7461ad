"""FedDWA over spilled updates: read block by block from memory-mapped files, with the same results as in memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest
import torch

from coordinator import feddwa
from coordinator.spill import SpilledState, spill_update
from coordinator.strategies import Federation
from coordinator.strategies.feddwa import FedDWA, FedDWASettings
from coordinator.updates import ClientUpdate
from har_models.nn.model import ArchSpec, init_state

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"conv.weight": (5, 1, 3, 7), "conv.bias": (5,), "hidden.weight": (11, 13), "out.bias": (3,)}


def _random_update(cid: str, seed: int) -> ClientUpdate:
    g = torch.Generator().manual_seed(seed)
    state = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    guidance = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in state.items()}
    return ClientUpdate(cid, 0, 0, 10 + seed, 2, state, guidance, size=1)


@pytest.mark.parametrize("block_size", [None, 1, 17, 1000])
def test_mapped_states_give_the_same_distances_weights_and_models_as_states_in_memory(tmp_path: Path, block_size: int | None) -> None:
    ups = [_random_update(f"c{k}", k) for k in range(7)]
    spilled = [spill_update(u, tmp_path) for u in ups]
    assert all(isinstance(u.state, feddwa.FlatBlockSource) for u in spilled)
    # The exact (float64) product, to compare with the direct computation below; tests/test_feddwa_gram.py compares
    # the float32 one of mapped and in-memory states.
    mem = feddwa.aggregate([u.state for u in ups], [u.guidance for u in ups], top_k=3, block_size=block_size,  # type: ignore[misc]
                           gram="float64")  # fmt: skip
    disk = feddwa.aggregate([u.state for u in spilled], [u.guidance for u in spilled], top_k=3, block_size=block_size,  # type: ignore[misc]
                            gram="float64")  # fmt: skip
    # Same numbers summed in the same order: equal bit for bit, not merely close.
    assert torch.equal(mem.distances, disk.distances) and torch.equal(mem.weights, disk.weights)
    for a, b in zip(mem.states, disk.states, strict=True):
        assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    # And they are the right numbers: D against a direct float64 computation, w̄_i against sum_j p_ij w_j.
    flat = [torch.cat([u.state[k].double().flatten() for k in SHAPES]) for u in ups]
    gflat = [torch.cat([u.guidance[k].double().flatten() for k in SHAPES]) for u in ups]  # type: ignore[index]
    direct = torch.tensor([[float(((gflat[i] - flat[j]) ** 2).sum()) for i in range(7)] for j in range(7)], dtype=torch.float64)
    torch.testing.assert_close(disk.distances, direct, rtol=1e-10, atol=1e-10)
    mix = sum(disk.weights[j, 4] * flat[j] for j in range(7))
    torch.testing.assert_close(torch.cat([disk.states[4][k].double().flatten() for k in SHAPES]), mix, rtol=1e-6, atol=1e-6)


def test_a_mixture_of_spilled_and_in_memory_updates_gives_the_same_result(tmp_path: Path) -> None:
    # A full disk keeps some updates in memory (coordinator.service): both kinds meet in one round.
    ups = [_random_update(f"c{k}", 10 + k) for k in range(5)]
    mixed = [spill_update(u, tmp_path) if k % 2 else u for k, u in enumerate(ups)]
    mem = feddwa.aggregate([u.state for u in ups], [u.guidance for u in ups], top_k=2, block_size=9)  # type: ignore[misc]
    mix = feddwa.aggregate([u.state for u in mixed], [u.guidance for u in mixed], top_k=2, block_size=9)  # type: ignore[misc]
    assert torch.equal(mem.distances, mix.distances) and torch.equal(mem.weights, mix.weights)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(mem.states, mix.states, strict=True) for k in a)


def test_the_feddwa_strategy_never_loads_a_whole_spilled_model_for_its_mixes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)
    ups = []
    for k in range(4):
        st, gd = init_state(spec, k), init_state(spec, 50 + k)
        ups.append(ClientUpdate(f"c{k}", 0, 0, 10 + k, 2, st, gd, size=1))
    fed = Federation(spec, spec, init_state(spec, 99))
    mem = FedDWA(FedDWASettings(top_k=2)).aggregate_fit(0, fed, ups)
    spilled = [spill_update(u, tmp_path) for u in ups]
    # Count whole-tensor reads (state[name]) and every mapped slice.
    whole: list[str] = []
    sliced: list[int] = []
    get, read = SpilledState.__getitem__, SpilledState.read_flat

    def counting_get(self: SpilledState, name: str) -> torch.Tensor:
        whole.append(self.prefix + name)
        return get(self, name)

    def counting_read(self: SpilledState, name: str, lo: int, hi: int, out: np.ndarray) -> None:
        sliced.append(hi - lo)
        read(self, name, lo, hi, out)

    monkeypatch.setattr(SpilledState, "__getitem__", counting_get)
    monkeypatch.setattr(SpilledState, "read_flat", counting_read)
    disk = FedDWA(FedDWASettings(top_k=2)).aggregate_fit(0, fed, spilled)
    n_params = sum(v.numel() for v in ups[0].state.values())
    # No whole tensor is read: the mixes and the shadow FedAvg average share one block-wise pass.
    assert whole == []
    # distances: every trained and guidance element once; the mixes (and the average): every trained element once more.
    assert sum(sliced) == 3 * len(ups) * n_params
    assert torch.equal(mem.mixing, disk.mixing)  # type: ignore[arg-type]
    assert all(torch.equal(mem.personal[c][k], disk.personal[c][k]) for c in mem.personal for k in mem.personal[c])
    assert all(torch.equal(mem.global_state[k], disk.global_state[k]) for k in mem.global_state)


_CHILD = r"""
import json, sys
from collections.abc import Mapping
from pathlib import Path
import torch
from coordinator import feddwa
from coordinator.aggregation import weighted_average
from coordinator.spill import SpilledState

folder, mode, names = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])

class Lazy(Mapping):  # a spilled state seen only as a mapping: what FedDWA read before it used the maps
    def __init__(self, s): self.s = s
    def __getitem__(self, k): return self.s[k]
    def __iter__(self): return iter(self.s)
    def __len__(self): return len(self.s)

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

files = sorted(folder.glob("*.safetensors"))
trained = [SpilledState(p, "", names) for p in files]
guidance = [SpilledState(p, "guidance/", names) for p in files]
if mode == "memory":
    trained, guidance = [Lazy(s) for s in trained], [Lazy(s) for s in guidance]
feddwa.aggregate(trained[:2], guidance[:2], top_k=1, block_size=4096)  # warm up: first-call allocations
open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current resident size
before = status("VmRSS:")
res = feddwa.aggregate(trained, guidance, top_k=3, block_size=65536)
print(json.dumps({"growth": status("VmHWM:") - before, "outputs": sum(v.numel() * 4 for s in res.states for v in s.values())}))
"""


def _peak_growth(folder: Path, mode: str, names: list[str]) -> dict[str, int]:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(folder), mode, json.dumps(names)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
def test_feddwa_over_mapped_files_does_not_hold_every_update_in_memory(tmp_path: Path) -> None:
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident size")
    n, shapes = 8, {"w": (1024, 2048), "b": (2048,)}  # 8 MiB per model, 16 MiB per update (trained + guidance)
    names = list(shapes)
    for k in range(n):
        g = torch.Generator().manual_seed(k)
        st = {name: torch.randn(s, generator=g) for name, s in shapes.items()}
        gd = {name: v + 0.01 for name, v in st.items()}
        spill_update(ClientUpdate(f"c{k}", 0, 0, 10, 2, st, gd, size=1), tmp_path)
    updates_bytes = sum(p.stat().st_size for p in tmp_path.glob("*.safetensors"))
    mapped = _peak_growth(tmp_path, "mapped", names)
    memory = _peak_growth(tmp_path, "memory", names)
    outputs = mapped["outputs"]
    assert outputs == n * (1024 * 2048 + 2048) * 4 and updates_bytes > 2 * outputs
    # The personalised models must exist (they are published); beyond them the mapped path holds blocks:
    # 2 stackers x (n, 65536) float64 = 8 MiB, a result block 4 MiB; well below a quarter of the updates (32 MiB).
    limit = outputs + updates_bytes // 4
    assert mapped["growth"] < limit, (mapped, limit)
    # The same measurement sees the updates when they are read whole (distances() then holds every trained
    # and guidance model at once), so it tells the two apart.
    assert memory["growth"] > updates_bytes * 9 // 10, (memory, updates_bytes)


class _Plain(Mapping[str, torch.Tensor]):
    """A mapping that is not a FlatBlockSource."""

    def __init__(self, d: dict[str, torch.Tensor]):
        self.d = d

    def __getitem__(self, k: str) -> torch.Tensor:
        return self.d[k]

    def __iter__(self) -> Iterator[str]:
        return iter(self.d)

    def __len__(self) -> int:
        return len(self.d)


def test_read_flat_copies_exactly_the_asked_range_and_refuses_a_wrong_one(tmp_path: Path) -> None:
    u = _random_update("c0", 3)
    s = spill_update(u, tmp_path)
    assert isinstance(s.guidance, SpilledState) and not isinstance(_Plain({}), feddwa.FlatBlockSource)
    w = u.guidance["hidden.weight"].flatten().double().numpy()  # type: ignore[index]
    out = np.zeros(50)
    s.guidance.read_flat("hidden.weight", 80, 130, out)
    assert np.array_equal(out, w[80:130])
    assert s.guidance.tensor_shape("hidden.weight") == (11, 13)
    with pytest.raises(ValueError, match="range"):
        s.guidance.read_flat("hidden.weight", 100, 144, np.zeros(44))
    with pytest.raises(KeyError):
        s.guidance.read_flat("nope", 0, 1, np.zeros(1))
