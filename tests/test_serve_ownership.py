"""Files that ``sudo fedhar-coordinator enrol`` creates in the server's data folder belong to the server's user."""

from __future__ import annotations

import os

import pytest

from coordinator.server.ownership import match_data_owner

needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="changing a file's owner needs root")


@needs_root
def test_root_created_files_go_to_the_data_folders_owner(tmp_path) -> None:
    data = tmp_path / "fedhar"
    (data / "enrolment").mkdir(parents=True)
    os.chown(data, 65534, 65534)  # the folder belongs to the server's user (here: nobody)
    (data / "server.sqlite").write_bytes(b"")
    (data / "enrolment" / "phone-anna.json").write_text("{}")
    changed = match_data_owner(data)
    assert sorted(p.relative_to(data).as_posix() for p in changed) == ["enrolment", "enrolment/phone-anna.json", "server.sqlite"]
    for p in (data / "server.sqlite", data / "enrolment", data / "enrolment" / "phone-anna.json"):
        assert (p.stat().st_uid, p.stat().st_gid) == (65534, 65534)


@needs_root
def test_a_root_owned_data_folder_is_left_alone(tmp_path) -> None:
    (tmp_path / "server.sqlite").write_bytes(b"")
    assert match_data_owner(tmp_path) == []
    assert (tmp_path / "server.sqlite").stat().st_uid == 0
