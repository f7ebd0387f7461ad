"""An upgrade from the previous release: its home-server folders, read and served by this code.

``tests/fixtures/upgrade-2ffcc27.tar.gz`` holds a data folder, broker folder and certificates
written by commit 2ffcc27 (``tests/support/make_upgrade_fixture.py``: three devices enrolled,
six rounds served with real clients, dev-c revoked after round 2). The test moves them to a new
place as an operator moving a server would (paths and ports in ``server.toml``,
``mosquitto.conf`` and ``fedhar-broker.json``), then checks that ``devices``, ``versions``,
``backup`` and ``restore`` read them and that ``serve`` continues the federation from the newest
version with the old history and the revocation kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from support.registry_views import kept_versions
from support.small_federation import processes, wait_for
from support.upgrade_fixture import move_upgrade_fixture

from coordinator.server.registry import Registry
from simulation.broker import find_mosquitto, stop_process, wait_for_port

pytestmark = [pytest.mark.slow, pytest.mark.mosquitto]

ROOT = Path(__file__).resolve().parents[1]
HAPT = ROOT / "datasets" / "hapt"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "coordinator.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_previous_release_folder_is_read_and_served_on(tmp_path: Path) -> None:
    exe = find_mosquitto()
    if exe is None:
        if os.environ.get("FEDHAR_REQUIRE_MOSQUITTO") == "1":
            pytest.fail("mosquitto is required (FEDHAR_REQUIRE_MOSQUITTO=1) but not installed; apt-get install mosquitto")
        pytest.skip("mosquitto not installed (apt-get install mosquitto)")
    root, made, port, tls_port = move_upgrade_fixture(tmp_path)
    data = root / "data"
    before = _digests(data)
    old_versions = kept_versions(data)
    assert old_versions[-1][0] == made["newest_version"] == 6 and [r for _, r in old_versions] == [1, 2, 3, 4, 5]
    old_report = json.loads((data / "run" / "report.json").read_text())
    old_rounds = [r["round"] for r in old_report["rounds"]]
    assert old_rounds == list(range(6))

    # a backup of the old release's folder, as taken before an upgrade
    r = _cli("backup", str(tmp_path / "backup"), "--data", str(data))
    assert r.returncode == 0, r.stderr
    # the old registry and versions as the CLI shows them (both at once: each start imports torch)
    cli = [sys.executable, "-m", "coordinator.cli"]
    reads = [subprocess.Popen([*cli, *args, "--data", str(data)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for args in (["devices", "--json"], ["versions"])]  # fmt: skip
    (devices_out, devices_err), (versions_out, versions_err) = (p.communicate(timeout=120) for p in reads)
    assert [p.returncode for p in reads] == [0, 0], devices_err + versions_err
    rows = {d["name"]: d for d in json.loads(devices_out)}
    assert {n: d["state"] for n, d in rows.items()} == {"dev-a": "enrolled", "dev-b": "enrolled", "dev-c": "revoked"}
    assert rows["dev-c"]["last_round"] == 2 and rows["dev-a"]["rounds"] == 6 and rows["dev-a"]["owner"] == "Anna"
    listed = [ln.split()[:2] for ln in versions_out.splitlines()[1:]]
    assert [v[0] for v in listed] == ["2", "3", "4", "5", "6"] and listed[-1][1] == "newest", versions_out

    serve_log = tmp_path / "serve.log"
    logs = [serve_log, tmp_path / "mosquitto.log", *(tmp_path / f"{n}.log" for n in ("dev-a", "dev-b"))]
    with open(tmp_path / "mosquitto.log", "wb") as sink:
        broker = subprocess.Popen([exe, "-c", str(root / "broker" / "mosquitto.conf")], stdout=sink, stderr=subprocess.STDOUT)
    try:
        assert wait_for_port("127.0.0.1", port, 10) and wait_for_port("127.0.0.1", tls_port, 10), (tmp_path / "mosquitto.log").read_text()
        with processes() as procs:
            with open(serve_log, "wb") as out:
                serve = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "serve", "--data", str(data)],
                                         stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)  # fmt: skip
            procs.append(serve)
            # the devices keep their accounts; the bundles' old port is overridden as the device's settings would be
            for i, name in enumerate(("dev-a", "dev-b")):
                cmd = [sys.executable, "-m", "edge_client.cli", "--client-id", name, "--federation", "homefed",
                       "--broker", f"127.0.0.1:{tls_port}", "--username", name,
                       "--password-file", str(root / "broker" / "credentials" / f"{name}.password"),
                       "--tls-ca", str(root / "pki" / "ca.crt"), "--source", f"hapt:{HAPT}/user{i + 1:02d}.npz",
                       "--state-dir", str(tmp_path / f"s-{name}"), "--threads", "1"]  # fmt: skip
                with open(tmp_path / f"{name}.log", "wb") as out:
                    procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT))
            wait_for(lambda: kept_versions(data)[-1][0] >= 7, 40, "a round served by the new release", logs)
            serve.send_signal(signal.SIGINT)
            assert serve.wait(30) == 130, serve_log.read_text()[-3000:]
    finally:
        stop_process(broker)
    text = serve_log.read_text()
    assert "continuing after round 5 (model version 6)" in text, text[-3000:]
    # server.toml names no strategy: the run takes this release's default and the log says why and how to keep the old one
    assert "this release's default is 'fedexp', not 'fedavgm'" in text and "put aggregation = 'fedavgm' in server.toml" in text
    assert "aggregation changed from" not in text, text[-3000:]  # that is for a change the operator made
    new_versions = kept_versions(data)
    kept = [v for v in new_versions if v[0] <= 6]
    assert kept == old_versions[-len(kept) :] and len(kept) >= 3  # the newest old ones kept (keep_versions = 5 prunes older)
    assert new_versions[len(kept)] == (7, 6)
    assert [r for _, r in new_versions] == list(range(new_versions[0][1], new_versions[-1][1] + 1))
    assert new_versions[-1][1] >= 6
    report = json.loads((data / "run" / "report.json").read_text())
    rounds = [r["round"] for r in report["rounds"]]
    assert rounds[:6] == old_rounds and rounds == list(range(len(rounds))) and len(rounds) >= 7
    for rec in report["rounds"][6:]:
        assert "dev-c" not in rec.get("personalisation_clients", []), rec
    reg = Registry(data)
    try:
        assert "dev-c" in reg.revoked_names() and max(p.round for p in reg.participation("dev-c")) == 2
        assert max(p.round for p in reg.participation("dev-a")) == rounds[-1]
        assert reg.schema_version() == 1  # the column added beside schema 1: the old release reads the file as before
    finally:
        reg.close()

    # what the upgrade changed: the old files are all there, except the bundles of devices that
    # joined or were revoked (deleted by design: they hold passwords); the registry gained a column
    after = _digests(data)
    pruned = {f"versions/v{v:06d}.safetensors" for v, _ in old_versions if v not in dict(new_versions)}
    # the run keeps the models of its newest rounds only, as the old release did
    pruned |= {rel for rel in before if rel.startswith("run/models/")}
    assert (data / "run" / "models" / f"r{new_versions[-1][1]:04d}" / "global.safetensors").is_file()
    lost = sorted(set(before) - set(after) - pruned)
    assert lost == [f"enrolment/dev-{n}.{e}" for n in "abc" for e in ("json", "png")], lost
    for rel in before:
        if rel.startswith("versions/") and rel in after:
            assert after[rel] == before[rel], rel
    with sqlite3.connect(data / "server.sqlite") as db:
        cols = {row[1] for row in db.execute("PRAGMA table_info(devices)")}
    assert "renamed_to" in cols

    # going back: the backup of the old folder restored over the upgraded one (server stopped)
    r = _cli("restore", str(tmp_path / "backup"), "--data", str(data), "--force")
    assert r.returncode == 0, r.stderr
    assert kept_versions(data) == old_versions
    assert [r["round"] for r in json.loads((data / "run" / "report.json").read_text())["rounds"]] == old_rounds
    r = _cli("devices", "--data", str(data), "--json")
    assert r.returncode == 0, r.stderr
    rows = {d["name"]: d for d in json.loads(r.stdout)}
    assert {n: (d["state"], d["rounds"]) for n, d in rows.items()} == {
        "dev-a": ("enrolled", 6),
        "dev-b": ("enrolled", 6),
        "dev-c": ("revoked", 3),
    }
    shutil.rmtree(tmp_path / "backup")
