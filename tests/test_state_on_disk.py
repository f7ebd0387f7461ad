"""State on disk: durable writes, contiguous arrays, resume from the newest intact round, one run per folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from coordinator.config import CoordinatorConfig, Timing
from coordinator.service import Coordinator, StateError
from coordinator.state import RunState, load_state_file, save_state_file
from har_io.broker_config import BrokerConfig
from har_models.files import atomic_write_bytes
from har_models.nn.model import ArchSpec, init_state
from simulation.broker import EmbeddedBroker

SPEC = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)


def test_a_transposed_tensor_is_saved_in_its_logical_order(tmp_path: Path) -> None:
    state = init_state(SPEC, 0)
    w = state["hidden.weight"]
    state["hidden.weight"] = w.t().contiguous().t()  # same values, column-major memory
    assert not state["hidden.weight"].is_contiguous()
    save_state_file(tmp_path / "m.safetensors", SPEC, state)
    _, back = load_state_file(tmp_path / "m.safetensors")
    assert torch.equal(back["hidden.weight"], w)


def test_atomic_write_replaces_whole_files_and_leaves_no_temporaries(tmp_path: Path) -> None:
    atomic_write_bytes(tmp_path / "sub" / "a.txt", "one")
    atomic_write_bytes(tmp_path / "sub" / "a.txt", b"two", mode=0o600)
    assert (tmp_path / "sub" / "a.txt").read_bytes() == b"two"
    assert (tmp_path / "sub" / "a.txt").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["a.txt"]


def _two_rounds(folder: Path) -> tuple[RunState, dict[str, torch.Tensor]]:
    st = RunState(folder)
    g0, g1 = init_state(SPEC, 0), init_state(SPEC, 1)
    st.complete_round(0, SPEC, g0, {"c1": g1}, {"round": 0})
    st.complete_round(1, SPEC, g1, {"c1": g0}, {"round": 1})
    return st, g0


@pytest.mark.parametrize("damage", [0, 200, "delete_folder"])
def test_resume_falls_back_to_the_newest_intact_round(tmp_path: Path, damage: int | str, caplog: pytest.LogCaptureFixture) -> None:
    st, g0 = _two_rounds(tmp_path)
    latest = tmp_path / "models" / "r0001" / "global.safetensors"
    if damage == "delete_folder":
        for p in sorted(latest.parent.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        latest.parent.rmdir()
    else:
        latest.write_bytes(latest.read_bytes()[: int(damage)])
    found = st.load_latest_intact()
    assert found is not None
    rnd, spec, g, personal = found
    assert set(personal) == {"c1"}
    assert rnd == 0 and spec == SPEC and all(torch.equal(g[k], g0[k]) for k in g0)
    assert st.last_completed_round() == 0  # round 1 is forgotten, so it runs again
    assert "round 1's saved models are unusable" in caplog.text


def test_nothing_intact_is_reported_not_guessed(tmp_path: Path) -> None:
    st, _ = _two_rounds(tmp_path)
    for r in ("r0000", "r0001"):
        (tmp_path / "models" / r / "global.safetensors").write_bytes(b"")
    assert st.load_latest_intact() is None


@pytest.mark.slow
def test_a_run_folder_belongs_to_one_run(tmp_path: Path) -> None:
    st, _ = _two_rounds(tmp_path)
    st.put("run_id", "first")
    st.close()
    with EmbeddedBroker() as broker:

        def config(resume: bool) -> CoordinatorConfig:
            broker_config = BrokerConfig(port=broker.port)
            return CoordinatorConfig(run_dir=tmp_path, broker=broker_config, run_id="second", resume=resume,
                                     timing=Timing(start_timeout_s=1))

        with pytest.raises(StateError, match="already belongs to run 'first'"):
            Coordinator(config(resume=False), progress=False).run()
        with pytest.raises(StateError, match="resume it with --run-id first"):
            Coordinator(config(resume=True), progress=False).run()


def test_a_damaged_database_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "state.sqlite").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StateError, match=r"state\.sqlite is damaged"):
        Coordinator(CoordinatorConfig(run_dir=tmp_path), progress=False)
