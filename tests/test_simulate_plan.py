"""fedhar-simulate's plan step: options become a typed plan, bad ones an exit status, and nothing starts or is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from har_models.data.subjects import DEFAULT_HAPT
from simulation.simulate import PlanError, build_parser, main, plan


def _plan(*argv: str):
    return plan(build_parser().parse_args(list(argv)), list(argv))


def test_options_become_a_plan_without_touching_the_disk(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    p = _plan("--clients", "2", "--rounds", "3", "--aggregation", "feddwa", "--split", "paper", "--run-dir", str(run_dir),
              "--run-id", "r1")  # fmt: skip
    assert list(p.sources) == ["hapt-01", "hapt-02"]
    assert (p.run_id, p.federation, p.run_dir) == ("r1", "r1", run_dir.resolve())
    assert p.settings.rounds == 3 and p.settings.aggregation == "feddwa" and not p.settings.resume
    assert p.split.text == "paper" and p.data == DEFAULT_HAPT.resolve()
    assert p.command == "fedhar-simulate --clients 2 --rounds 3 --aggregation feddwa --split paper " \
        f"--run-dir {run_dir} --run-id r1"
    assert not run_dir.exists()  # the plan starts nothing and writes nothing


def test_a_named_federation_and_a_default_run_id(tmp_path: Path) -> None:
    p = _plan("--clients", "1", "--federation", "home", "--run-dir", str(tmp_path / "x"))
    assert p.federation == "home" and p.run_id.startswith(f"hapt-{p.settings.aggregation}-")


@pytest.mark.parametrize(
    ("argv", "status", "match"),
    [
        (["--dataset", "realworld"], 2, "needs --data PATH"),
        (["--data", "/nonexistent/hapt"], 3, "nonexistent"),
        (["--split", "random"], 2, "random"),
        (["--resume"], 2, "--resume needs --run-dir of an earlier run"),
    ],
)
@pytest.mark.slow
def test_unusable_options_are_refused_with_their_status(argv: list[str], status: int, match: str) -> None:
    with pytest.raises(PlanError, match=match) as err:
        _plan(*argv)
    assert err.value.status == status


@pytest.mark.slow
def test_a_damaged_earlier_run_is_status_6(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "state.sqlite").write_bytes(b"this is not a database" * 100)
    with pytest.raises(PlanError, match="is damaged") as err:
        _plan("--resume", "--run-dir", str(tmp_path))
    assert err.value.status == 6
    assert main(["--resume", "--run-dir", str(tmp_path), "--no-progress"]) == 6  # main prints it and exits with it
    assert "fedhar-simulate: " in capsys.readouterr().err
