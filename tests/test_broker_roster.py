"""Revocation is final in ``run`` too (issue 37 item 3): a coordinator given the broker folder (``--broker-dir``) refuses,
from the next message on, a device the folder no longer lists, as ``serve`` refuses one its registry revoked."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from coordinator.admission import Admission
from coordinator.broker.roster import Roster
from coordinator.broker.settings import MANIFEST_NAME
from coordinator.cli import build_parser
from coordinator.config import CoordinatorConfig
from coordinator.service import Coordinator
from har_io.broker_config import BrokerConfig
from har_models.wire.messages import ClientStatus


def _manifest(folder: Path, clients: list[str]) -> None:
    path = folder / MANIFEST_NAME
    path.write_text(json.dumps({"settings": {"federation": "home"}, "clients": clients, "generator": "fedhar-coordinator broker"}))
    stamp = time.time_ns() + len(clients)  # a rewrite within one clock tick is still seen as one
    os.utime(path, ns=(stamp, stamp))


def test_a_device_the_broker_folder_no_longer_lists_is_refused_from_its_next_message_on(tmp_path: Path) -> None:
    _manifest(tmp_path, ["phone-a", "phone-b"])
    roster = Roster(tmp_path)
    cfg = CoordinatorConfig(run_dir=tmp_path / "run", broker=BrokerConfig.parse("127.0.0.1:9"), federation="home", run_id="r")
    grid = Coordinator(cfg, progress=False, admission=Admission(revoked=roster.refused)).grid
    for cid in ("phone-a", "phone-b", "stranger"):
        grid.handle(grid.topics.client_status(cid), ClientStatus(cid, "idle", label_set="hapt6", n_train=9,
                                                                 sent_unix=time.time(), refresh_s=30.0).to_bytes())  # fmt: skip
    assert list(grid.eligibility().eligible) == ["phone-a", "phone-b"]
    _manifest(tmp_path, ["phone-a"])  # fedhar-coordinator broker remove phone-b
    assert list(grid.eligibility().eligible) == ["phone-a"] and roster.refused("phone-b")
    (tmp_path / MANIFEST_NAME).write_text("{not json")  # a half-written manifest: the last list stands
    assert roster.listed("phone-a") and roster.refused("phone-b")


def test_run_takes_the_broker_folder_and_refuses_one_without_a_manifest(tmp_path: Path) -> None:
    assert build_parser().parse_args(["--broker-dir", str(tmp_path)]).broker_dir == tmp_path
    with pytest.raises(ValueError, match="not a readable broker folder manifest"):
        Roster(tmp_path)
