"""A month on a home server, compressed (benchmarks/scripted_month.py, one round per wait): the page tells the truth at each step.

The script runs as a program, as an operator would run it: the previous release's folders
(``tests/fixtures/upgrade-2ffcc27.tar.gz``) served on by this release with Mosquitto (TLS, ACL, one
account per device) and two replaying ``fedhar-client`` processes, then ``reissue``, ``rename``,
a server certificate 10 days from expiry, ``broker renew``, ``backup`` while serving, ``restore`` into
a fresh folder served again, and ``forget``, all on 127.0.0.1. At each step it reads the status page
in headless Chromium and compares what the page shows with the files, the registry, the
certificates and the broker; a step matches only when every comparison holds. This test checks
that all eight steps ran in order and matched, and that each left its screenshot.

Skips without mosquitto or Chromium/chromedriver/selenium, unless FEDHAR_REQUIRE_MOSQUITTO=1 or
FEDHAR_REQUIRE_BROWSER=1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.mosquitto, pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[1]
STEPS = ["upgraded", "reissue", "rename", "certificate-near-expiry", "renewed", "backup", "restored", "forget"]


def test_every_step_of_the_month_shows_the_truth_on_the_page(tmp_path: Path) -> None:
    shots = tmp_path / "shots"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "scripted_month.py"), "--rounds", "1", "--out", str(shots)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=400)
    if r.returncode == 2:
        required = [v for v in ("FEDHAR_REQUIRE_MOSQUITTO", "FEDHAR_REQUIRE_BROWSER") if os.environ.get(v) == "1"]
        if required:
            pytest.fail(f"{' and '.join(required)}=1 but: {r.stderr.strip()}")
        pytest.skip(r.stderr.strip())
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]
    steps = [ln.split(":", 1)[0].split() for ln in lines if ln[:2].isdigit()]
    assert steps == [[f"{i + 1:02d}", s] for i, s in enumerate(STEPS)], lines
    assert all(" matched=yes " in ln for ln in lines if ln[:2].isdigit()) and "mismatch" not in r.stdout, r.stdout
    last = dict(part.split("=", 1) for part in lines[-1].split())
    assert (last["steps"], last["matched"], last["screenshots"]) == ("8", "8", "8"), lines[-1]
    for i, s in enumerate(STEPS):
        png = (shots / f"{i + 1:02d}-{s}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000, s
    # what the page said at the steps that change what a device is called
    said = {s: ln for s, ln in zip(STEPS, (ln for ln in lines if ln[:2].isdigit()), strict=True)}
    assert "dev-b renamed to kitchen-pi 0 rounds" in said["rename"]
    assert "(10 days left)" in said["certificate-near-expiry"] and "(825 days left)" in said["renewed"]
    assert "dev-a gone (forgotten) 0 rounds" in said["forget"]
