"""A model version's figures read under one spelling ("personalisation") whatever release wrote them."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.server import devices_cli
from coordinator.server.figures import read_figures
from coordinator.server.registry import Registry


def test_old_and_new_spellings_read_alike() -> None:
    old = {"personalization_accuracy": 0.75, "personalization_macro_f1": 0.5, "global_accuracy": None}
    new = {"personalisation_accuracy": 0.75, "personalisation_macro_f1": 0.5, "global_accuracy": None}
    assert read_figures(old) == new and list(read_figures(old)) == list(new)
    assert read_figures(new) == new
    both = {"personalization_macro_f1": 0.1, "personalisation_macro_f1": 0.5}
    assert read_figures(both) == {"personalisation_macro_f1": 0.5}


def test_devices_versions_shows_a_figure_an_older_release_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reg = Registry(tmp_path)
    reg.add_version(1, 0, 1, tmp_path / "versions" / "v000001.safetensors", {"personalization_macro_f1": 0.625, "updates": 3})
    reg.close()
    assert devices_cli.main("versions", ["--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "62.5%" in out
