"""The one eligibility rule (coordinator/admission.py): the coordinator selects from the devices it names eligible,
and the reasons it gives for the others are the ones the home server's waiting line prints."""

from __future__ import annotations

import time
from pathlib import Path

from coordinator.admission import OPEN, Admission, eligibility
from coordinator.config import CoordinatorConfig
from coordinator.service import Coordinator
from har_io.broker_config import BrokerConfig
from har_models.wire.messages import ClientStatus


def _status(cid: str, **kw: object) -> ClientStatus:
    base: dict[str, object] = dict(label_set="hapt6", n_train=50, sent_unix=time.time(), refresh_s=30.0)
    base.update(kw)
    return ClientStatus(cid, "online", **base)  # type: ignore[arg-type]


def test_the_coordinator_decides_with_the_rule_that_explains(tmp_path: Path) -> None:
    charging = {"on": True}
    admission = Admission(revoked={"gone"}.__contains__, enrolled=lambda c: c != "stranger",
                          require_charging=lambda: charging["on"])  # fmt: skip
    cfg = CoordinatorConfig(run_dir=tmp_path / "run", broker=BrokerConfig.parse("127.0.0.1:9"), run_id="r1")
    co = Coordinator(cfg, progress=False, admission=admission).grid
    for st in (_status("ok"), _status("battery", charging=False), _status("stranger"), _status("empty", n_train=0),
               _status("other", label_set="realworld8")):  # fmt: skip
        co.handle(co.topics.client_status(st.client_id), st.to_bytes())
    co.handle(co.topics.client_status("gone"), _status("gone").to_bytes())  # refused: not even counted as present
    assert list(co.eligibility().eligible) == ["ok", "other"]  # no federation yet: any label set
    got = co.eligibility("hapt6")
    assert got.eligible == ("ok",)
    assert got.left_out == {"battery": "not_charging", "stranger": "not_enrolled", "empty": "no_training_windows",
                            "other": "label_set"}  # fmt: skip
    charging["on"] = False  # a settings reload: asked at every look
    assert co.eligibility("hapt6").eligible == ("battery", "ok") and "battery" not in co.eligibility("hapt6").left_out


def test_the_first_reason_that_applies_is_given_and_the_open_admission_admits_all() -> None:
    statuses = {"a": _status("a"), "b": ClientStatus("b", "offline", label_set="hapt6", n_train=0),
                "c": _status("c", n_train=0)}  # fmt: skip
    got = eligibility(statuses, fresh=lambda c: c != "a", admission=OPEN)
    assert got.eligible == () and got.left_out == {"a": "stale", "b": "offline", "c": "no_training_windows"}
    revoked = eligibility(statuses, fresh=lambda c: True, admission=Admission(revoked=lambda c: True))
    assert set(revoked.left_out.values()) == {"revoked"}
