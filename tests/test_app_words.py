"""The app's words a person reads: the Live screen's line, and which Enrol text is a bundle to mask."""

from __future__ import annotations

from edge_client.app.words import HOP_S, is_bundle_text, live_words, span_words


def test_durations_read_as_a_person_says_them():
    assert [span_words(s) for s in (0, 40.4, 59.6, 60, 185, 3599, 3600, 7753.0)] == [
        "0 s", "40 s", "1 min", "1 min", "3 min", "59 min", "1 h 0 min", "2 h 9 min"
    ]  # fmt: skip


def test_the_live_line_says_how_long_the_model_watched_not_a_window_count():
    assert live_words(0) == "Nothing seen yet: the first guess comes after about 3 seconds of movement"
    line = live_words(6057)  # the count the issue saw: 6057 x 1.28 s = 7753 s
    assert line == "Watching for 2 h 9 min; the guess is updated about every second from the last 3 seconds"
    assert "windows" not in line and "6057" not in line and str(HOP_S) not in line
    assert live_words(30).startswith("Watching for 38 s;")


def test_bundle_text_is_told_from_a_file_path():
    assert is_bundle_text('{"format": "fedhar-enrolment"') and is_bundle_text('  \n{"version": 1}')
    assert not is_bundle_text("/sdcard/Download/phone-anna.json") and not is_bundle_text("")
