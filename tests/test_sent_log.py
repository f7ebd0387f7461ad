"""The ledger of what left the device, and the words of why it is or is not training."""

from __future__ import annotations

import datetime as dt

from edge_client.app.controller import FederationView, taking_part_words
from edge_client.sent_log import SENT_KEPT, note_receipt, note_sent, sent_words, size_words, with_versions

T = dt.datetime(2026, 12, 1, 14, 30).timestamp()


def test_a_retry_is_one_entry_a_receipt_marks_it_counted_and_the_ledger_is_bounded():
    led = note_sent([], "run-a", 1, 0, 41_230, 1, T)
    led = note_sent(led, "run-a", 2, 0, 41_230, 1, T + 60)
    led = note_sent(led, "run-a", 2, 0, 41_500, 1, T + 90)  # sent again after a restart
    assert [(e["round"], e["bytes"]) for e in led] == [(1, 41_230), (2, 41_500)]
    led = note_receipt(led, "run-a", 1, 0)
    led = note_receipt(led, "run-b", 2, 0)  # another run's receipt changes nothing
    assert [e["counted"] for e in led] == [True, False]
    # The server's version numbers where it said them (round 1 started from version 17), else the architecture's.
    assert sent_words(with_versions(led, {("run-a", 1): 17, ("run-b", 2): 5}), open_round=2) == [
        "round 2, 01 Dec 14:31: a model update of 41.5 kB (architecture v1), waiting for the coordinator's receipt",
        "round 1, 01 Dec 14:30: a model update of 41.2 kB (from model v17), counted",
    ]
    assert sent_words(led, open_round=3)[0].endswith("not confirmed: the round went on without it")
    for r in range(SENT_KEPT + 5):
        led = note_sent(led, "run-a", r, 0, 10, 1, T)
    assert len(led) == SENT_KEPT and led[-1]["round"] == SENT_KEPT + 4
    assert [size_words(n) for n in (800, 1234, 2_500_000)] == ["800 B", "1.2 kB", "2.5 MB"]


def test_why_the_device_is_or_is_not_training_in_words():
    v = FederationView(broker="home:8883", round=4)
    assert taking_part_words(v) == 'Not taking part: switch on "Take part in training" to help train the shared model'
    v.take_part, v.state = True, "waiting for charger"
    assert taking_part_words(v) == "Not training now: the phone is not charging, and you chose to train only while charging"
    v.state = "training"
    assert taking_part_words(v) == "Training round 4 on this phone now"
    v.state = "disconnected"
    assert taking_part_words(v) == "Taking part, but the server at home:8883 cannot be reached now; trying again"
    v.state, v.error = "failed", "login refused: ask the server's operator for a new bundle"
    assert taking_part_words(v) == "Not training: login refused: ask the server's operator for a new bundle"


def test_the_server_in_words_in_the_sentence_of_why():
    v = FederationView(broker="home:8883", round=18, take_part=True, state="connected")
    assert taking_part_words(v) == "Taking part: connected, waiting for the server's next round (last round 18)"
    v.server = "home server online: next round at about 14:30 (3 devices taking part)"
    assert taking_part_words(v) == (
        "Taking part: connected; home server online: next round at about 14:30 (3 devices taking part); last round 18"
    )
    v.server, v.server_down = "home server offline since 14:02", True
    assert taking_part_words(v) == "Taking part, but no rounds now: home server offline since 14:02"
