"""Outcomes, not mechanics: a small federation learns, and each switch changes what it should.

Three HAPT subjects, a small CNN (8 filters, 32 units), real client processes and the
embedded broker: the main job in miniature. Chance on six activities is 1/6 = 0.167.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.small_federation import run_simulation

from coordinator.state import RunState

pytestmark = pytest.mark.slow  # five small federations


def _run(run_dir: Path, *extra: str) -> dict:
    """The small federation (3 clients, 8 filters, 32 units) with a larger step and two local epochs, run id = folder name."""
    return run_simulation(run_dir, "--lr", "0.05", "--local-epochs", "2", *extra)


@pytest.fixture(scope="module")
def fedavg(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    d = tmp_path_factory.mktemp("fedavg") / "fedavg"
    return d, _run(d, "--rounds", "2")


def test_two_rounds_learn_well_above_chance(fedavg: tuple[Path, dict]) -> None:
    _, doc = fedavg
    first, last = doc["rounds"][0], doc["rounds"][-1]
    assert last["global"]["accuracy"] > 0.5 and last["global"]["macro_f1"] > 0.4
    assert last["global"]["accuracy"] > first["received_union"]["accuracy"]  # round 0 received the untrained model


def test_feddwa_gives_each_client_its_own_model(tmp_path: Path) -> None:
    doc = _run(tmp_path / "feddwa", "--rounds", "2", "--aggregation", "feddwa", "--top-k", "2")
    assert doc["final"]["global"]["accuracy"] > 0.4
    st = RunState(tmp_path / "feddwa")
    _, g, personal = st.load_round_models(1)
    assert sorted(personal) == ["hapt-01", "hapt-02", "hapt-03"]
    # Each P_i is its own mix: none equals the shadow FedAvg model G, and no two are equal.
    models = [g, *personal.values()]
    for i in range(len(models)):
        for j in range(i + 1, len(models)):
            assert not torch.equal(models[i]["out.weight"], models[j]["out.weight"])
    # The round summary records p_ij (row i = target client): rows sum to 1 with at most K = 2 sources each.
    for r in doc["rounds"]:
        w = r["feddwa_weights"]
        assert w["clients"] == ["hapt-01", "hapt-02", "hapt-03"]
        for row in w["p"]:
            assert len(row) == 3 and all(0.0 <= x <= 1.0 for x in row)
            assert abs(sum(row) - 1.0) < 1e-5 and sum(x > 0 for x in row) <= 2


def test_ala_changes_what_clients_start_from(tmp_path: Path, fedavg: tuple[Path, dict]) -> None:
    _, plain = fedavg
    doc = _run(tmp_path / "ala", "--rounds", "2", "--client-init", "ala", "--ala", '{"layer_idx": 4, "eta": 1.0}')
    # Round 0 has no local model yet, so ALA takes the received one: identical to the plain run.
    assert doc["rounds"][0]["personalisation"] == plain["rounds"][0]["personalisation"]
    # From round 1 on, ALA blends the received and the local model: the clients' figures differ.
    assert doc["rounds"][1]["personalisation_clients"] != plain["rounds"][1]["personalisation_clients"]


def test_feddist_paper_mode_grows_with_intermediate_exchanges(tmp_path: Path) -> None:
    # A low k_0 makes growth certain on a small model, so the service must drive the intermediate exchanges.
    doc = _run(tmp_path / "feddist", "--rounds", "2", "--growth", "feddist", "--feddist-k0", "0.5", "--feddist-mode", "paper")
    r0 = doc["rounds"][0]
    assert r0["growth"]["layers"], r0["growth"]
    grown = r0["growth"]["layers"]
    assert r0["conv_filters"] == 8 + grown.get("conv", {}).get("added", 0)
    assert r0["dense_units"] == 32 + grown.get("hidden", {}).get("added", 0)
    assert r0["arch_version"] == len(grown)
    st = RunState(tmp_path / "feddist")
    spec, _, _ = st.load_round_models(1)
    assert spec.conv_filters >= r0["conv_filters"] and doc["final"]["global"]["accuracy"] > 0.3
    stages = {d.split()[-1] for _, _, k, d in st.events() if k == "growth"}
    assert stages, "growth events recorded"
