"""Updates spilled to disk aggregate exactly as in memory, one tensor of one client at a time."""

from __future__ import annotations

from pathlib import Path

import torch

from coordinator.aggregation import weighted_average
from coordinator.spill import SpilledState, clear, spill_update
from coordinator.updates import ClientUpdate
from har_models.nn.model import ArchSpec, init_state

SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)


def _update(cid: str, seed: int, guidance: bool = False) -> ClientUpdate:
    st = init_state(SPEC, seed)
    g = init_state(SPEC, seed + 100) if guidance else None
    return ClientUpdate(cid, 0, 0, 10 + seed, 2, st, g, size=1)


def test_fedavg_of_spilled_updates_equals_fedavg_in_memory_bit_for_bit(tmp_path: Path) -> None:
    ups = [_update(f"c{k}", k) for k in range(7)]
    spilled = [spill_update(u, tmp_path) for u in ups]
    assert all(isinstance(u.state, SpilledState) for u in spilled)
    mem = weighted_average([u.state for u in ups], [u.n_train for u in ups])
    disk = weighted_average([u.state for u in spilled], [u.n_train for u in spilled])
    assert set(mem) == set(disk) and all(torch.equal(mem[k], disk[k]) for k in mem)


def test_a_spilled_state_reads_each_tensor_back_exactly(tmp_path: Path) -> None:
    u = _update("c1", 3, guidance=True)
    s = spill_update(u, tmp_path)
    assert list(s.state) == list(u.state) and len(s.state) == 6
    assert all(torch.equal(s.state[k], u.state[k]) for k in u.state)
    assert s.guidance is not None and u.guidance is not None
    assert all(torch.equal(s.guidance[k], u.guidance[k]) for k in u.guidance)
    clear(tmp_path)
    assert not tmp_path.exists()
