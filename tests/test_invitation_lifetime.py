"""An invitation (enrolment by certificate) is its own kind of artefact: never removed with the enrolment bundles,
it lives until its stated expiry or ``invite --revoke``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from coordinator.server import devices_cli
from coordinator.server.audit import read_audit
from coordinator.server.lifecycle import invitation_expiry, note_invitation, prune_bundles
from coordinator.server.registry import Registry


def _invitation(data: Path) -> list[Path]:
    folder = data / "enrolment"
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / "invitation.json", folder / "invitation.png"]
    for f in files:
        f.write_text("{}")
    return files


def test_the_bundle_clean_up_leaves_an_invitation_until_its_expiry(tmp_path: Path) -> None:
    Registry(tmp_path).close()
    files = _invitation(tmp_path)
    now = time.time()
    note_invitation(tmp_path, now + 30 * 86400)
    assert invitation_expiry(tmp_path) == pytest.approx(now + 30 * 86400)
    assert prune_bundles(tmp_path, joined={"invitation"}, now=now + 8 * 86400) == []  # a week and more: a bundle would go
    assert all(f.exists() for f in files)
    assert prune_bundles(tmp_path, now=now + 31 * 86400) == []  # not a bundle: not in the list
    assert not any(f.exists() for f in files) and invitation_expiry(tmp_path) is None


def test_invite_revoke_deletes_it_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Registry(tmp_path).close()
    files = _invitation(tmp_path)
    note_invitation(tmp_path, time.time() + 86400)
    assert devices_cli.main("invite", ["--revoke", "--data", str(tmp_path)]) == 0
    assert not any(f.exists() for f in files)
    assert "the invitation's files are deleted (2)" in capsys.readouterr().out
    assert [(e.action, e.detail) for e in read_audit(tmp_path)] == [("invite", "revoked: its files deleted")]
