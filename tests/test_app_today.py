"""The Today screen in a real Kivy window under Xvfb: a replayed HAPT session classified on the device, a stretch relabelled.

tests/app_today_driver.py runs the app in its own process (no torch, no scipy, the numpy
backend's model) and reports what the widgets showed; here those texts are checked against
the device's own files: the timeline store, the recorded-window log and the client store the
trainer reads. Screenshots go to docs/screenshots/ when FEDHAR_UPDATE_SCREENSHOTS=1.
"""

from __future__ import annotations

import datetime
import itertools
import os
import shutil
from pathlib import Path

import pytest
from support.app_script import run_driver

from edge_client.timeline import STEP_NS
from edge_client.timeline_store import TIMELINE_FILE, TimelineStore
from edge_client.window_log import WindowLog
from har_models.data.labels import HAPT_LABELS

pytest.importorskip("kivy")

from test_app import display  # noqa: F401  (the Xvfb fixture)

pytestmark = [pytest.mark.slow, pytest.mark.app]

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "docs" / "screenshots"


@pytest.mark.parametrize("window", ["480x800", "800x600"])
def test_today_shows_the_replayed_day_and_a_relabelled_stretch_becomes_training_windows(tmp_path, display, window):  # noqa: F811
    out, state = tmp_path / "out", tmp_path / "state"
    res, _ = run_driver("app_today_driver.py", out, str(state), window, display=display, timeout_s=400)
    assert res["window"] == [int(v) for v in window.split("x")]

    # Before: stretches in time order, not overlapping, as the store smooths them; nothing recorded yet.
    before = res["before"]["stretches"]
    assert len(before) >= 3 and all(a[1] <= b[0] for a, b in itertools.pairwise(before))
    assert sum(res["before"]["counts"].values()) == 0 and res["before"]["date"] == "[b]Today[/b]"
    assert "walking: 40 more windows" in res["before"]["guidance"]

    # The tapped stretch is the one selected, named in words.
    start, end, label = res["selected"]["stretch"]
    assert res["selected"]["bar"] == [start, end]
    assert f": {HAPT_LABELS.names[label].replace('_', ' ')}, {(end - start) / 60e9:.1f} min." in res["selected"]["text"]

    # After the relabel: the windows made are the stretch's, in the log the recorder writes and in the store the trainer reads.
    other = res["relabel_to"]
    made = res["after"]["counts"][other]
    assert made == round((end - start) / STEP_NS)  # one window per 1.28 s of the stretch
    n_train, n_test = res["after"]["n_train"], res["after"]["n_test"]
    assert n_train + n_test == made  # training and test windows named apart
    assert res["after"]["taught"] == (
        f"{n_train} training and {n_test} test windows from this stretch ({n_train} training windows in all); the next round trains on them"
    )
    log_counts = WindowLog(state / "recorded_windows.log", HAPT_LABELS).counts()
    assert int(log_counts[HAPT_LABELS.index(other)]) == made and int(log_counts.sum()) == made
    assert res["after"]["corrected"] == [[start, end, HAPT_LABELS.index(other), True]]
    need = 40 - made
    assert (f"{other}: {need} more windows" in res["after"]["guidance"]) == (need > 0)
    tl = TimelineStore(state / TIMELINE_FILE, HAPT_LABELS)
    assert tl.corrected_windows() == made and tl.get("weekly_goal_min", "") == "90"
    assert res["goal_after"].endswith(" of 90 active minutes (walking, stairs) in the 7 days to this one")

    # The exported day: the corrected stretch as its first row, marked corrected.
    name, folder = res["exported"].removeprefix("saved ").split("\nin ")
    csv_path = Path(folder) / name
    assert csv_path.parent == state / "exports"
    rows = csv_path.read_text().splitlines()
    assert rows[0] == "start,end,activity,minutes,corrected"
    assert any(row.split(",")[2:] == [other, f"{(end - start) / 60e9:.2f}", "1"] for row in rows[1:])

    # Older days: yesterday has nothing, and the way back leads to today again, never past it.
    yesterday = (datetime.date.today() - datetime.timedelta(days=1)).strftime("%a %d %b %Y")
    assert res["yesterday"] == {"date": f"[b]{yesterday}[/b]", "stretches": 0, "walking": "0.0", "next_disabled": False,
                                "text": "Nothing recognised on this day yet: the model classifies while the phone senses"}
    assert res["back"]["date"] == "[b]Today[/b]" and res["back"]["next_disabled"] and res["back"]["stretches"] >= 3

    for name in ("today", "today-relabelled"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        if os.environ.get("FEDHAR_UPDATE_SCREENSHOTS") == "1":
            SHOTS.mkdir(parents=True, exist_ok=True)
            shutil.copy(png, SHOTS / f"{name}-{window}.png")
