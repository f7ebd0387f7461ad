"""Leaving the federation, without a window: the leaving status on the wire and the words the app shows."""

from __future__ import annotations

import json

import pytest

from edge_client.leave import LeaveOutcome, leave_words, leaving_status
from har_models.wire.messages import ClientStatus, MessageError, offline_status


def test_the_leaving_status_is_an_offline_status_that_says_left_and_round_trips():
    payload = leaving_status("phone-1", forget=True, now_unix=1_700_000_000.0)
    assert json.loads(payload) == {"protocol": 1, "client_id": "phone-1", "state": "offline", "left": "forget", "label_set": "",
                                   "n_train": 0, "n_test": 0, "train_stats": {}, "class_counts": [], "run_id": "", "last_round": -1,
                                   "instance": "", "sent_unix": 1_700_000_000.0, "refresh_s": 0.0}  # fmt: skip
    st = ClientStatus.from_bytes(payload)
    assert (st.state, st.left, st.selectable) == ("offline", "forget", False)
    assert ClientStatus.from_bytes(leaving_status("phone-1", forget=False)).left == "keep"
    # Left out when "": a status of a device that stays is the message it always was.
    assert "left" not in json.loads(offline_status("phone-1")) and ClientStatus.from_bytes(offline_status("phone-1")).left == ""


@pytest.mark.parametrize(
    ("change", "words"),
    [({"left": "delete-everything"}, "left must be one of"), ({"state": "online"}, "a device that left is offline, not 'online'")],
)
def test_a_leaving_status_that_is_not_one_is_refused(change, words):
    d = json.loads(leaving_status("phone-1", forget=True)) | change
    with pytest.raises(MessageError, match=words):
        ClientStatus.from_bytes(json.dumps(d).encode())


def test_leave_words_say_what_went_and_whether_the_server_was_told():
    went = ("the broker password and certificate of the enrolment", "the local model and its training state")
    told = leave_words(LeaveOutcome(forget=False, told=True, deleted=went), "phone-1")
    assert told == ("You left the federation. Deleted from this phone: the broker password and certificate of the enrolment and "
                    "the local model and its training state. The server was told that this phone left. To join again, enrol "
                    "with a new bundle.")  # fmt: skip
    offline = leave_words(LeaveOutcome(forget=True, told=False, not_told="the server was not told: broker unreachable"), "phone-1")
    assert offline == ("You left the federation. Deleted from this phone: nothing was left to delete. The server was not told: "
                       "broker unreachable. Ask the server's operator to forget phone-1. To join again, enrol with a new "
                       "bundle.")  # fmt: skip
