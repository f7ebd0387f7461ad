"""Certificates watched and renewed, backups taken while the server writes and restored with checks, the audit log shown.

Real openssl certificates (the recipe of ``broker init --help``), a real Mosquitto that serves the
renewed certificate after its reload, real SQLite files copied with the online backup API while
another connection keeps writing them.
"""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coordinator.broker.certificates import EXPIRY_WARNING_S, certificate_not_after
from coordinator.server.audit import audit, read_audit
from coordinator.server.backup import BackupError, backup
from coordinator.server.metrics import make_registry, scrape
from coordinator.server.registry import Registry
from coordinator.server.restore import restore
from coordinator.server.web import ServerView, render_page
from coordinator.state import RunState

ROOT = Path(__file__).resolve().parents[1]


def _served_not_after(port: int, ca: Path) -> float:
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s, ctx.wrap_socket(s, server_hostname="127.0.0.1") as t:
        cert = t.getpeercert()
    assert cert is not None
    return ssl.cert_time_to_seconds(str(cert["notAfter"]))


@pytest.mark.slow
def test_expiry_on_page_metrics_and_log_then_renew_without_new_ca(
    tmp_path: Path, tls_mosquitto: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    b = tls_mosquitto("certs", ["dev-a"])
    crt = b.out / "tls" / "server.crt"
    not_after = certificate_not_after(crt)
    assert abs(not_after - _served_not_after(b.tls_port, b.ca)) < 1.0  # what the broker serves
    assert 29 * 86400 < not_after - time.time() <= 30 * 86400  # the test PKI's -days 30
    data = tmp_path / "data"
    reg = Registry(data)
    audit(data, "enrol", "dev-a", "owner Anna")
    view = ServerView(name="home", registry=reg, broker_dir=b.out)
    with caplog.at_level(logging.WARNING, logger="fedhar.server.web"):
        page = render_page(view)
        render_page(view)
    warned = [r.getMessage() for r in caplog.records if "certificate" in r.getMessage()]
    assert len(warned) == 2 and all("expires in 30 days" in w or "expires in 29 days" in w for w in warned)  # once a day each
    assert "broker renew --out" in warned[0]
    assert 'data-which="server"' in page and 'data-which="ca"' in page and "days left" in page and "rate-warn" in page
    assert '<table id="audit">' in page and "<td>enrol</td><td>dev-a</td>" in page
    text = scrape(make_registry(view.totals, certificates=view.certificate_seconds_left)).decode()
    line = next(x for x in text.splitlines() if x.startswith('fedhar_certificate_expiry_seconds{which="server"}'))
    assert abs(float(line.split()[-1]) - (not_after - time.time())) < 60

    # renew: a new certificate from the same CA, served after the reload; devices keep their ca.crt
    r = subprocess.run([sys.executable, "-m", "coordinator.cli", "broker", "renew", "--out", str(b.out),
                        "--ca-key", str(b.ca.with_name("ca.key")), "--days", "400", "--data", str(data)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "the broker was reloaded" in r.stdout
    renewed = certificate_not_after(crt)
    assert 399 * 86400 < renewed - time.time() <= 400 * 86400
    deadline = time.monotonic() + 10
    while abs(_served_not_after(b.tls_port, b.ca) - renewed) > 1.0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert abs(_served_not_after(b.tls_port, b.ca) - renewed) < 1.0  # verified against the unchanged CA
    assert view.certificate_seconds_left()["server"] > EXPIRY_WARNING_S  # the page reads the new file
    assert [e.action for e in read_audit(data)] == ["enrol", "renew"]
    r = subprocess.run([sys.executable, "-m", "coordinator.cli", "broker", "renew", "--out", str(b.out),
                        "--ca-key", str(b.ca.with_name("other-ca.key"))],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert r.returncode == 2 and "failed" in r.stderr and "nothing was replaced" in r.stderr
    assert certificate_not_after(crt) == renewed
    reg.close()


@pytest.mark.slow
def test_backup_while_writing_and_restore_with_checks(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = tmp_path / "broker"
    (broker / "credentials").mkdir(parents=True)
    (broker / "credentials" / "dev-a.password").write_text("pw-a\n")
    (broker / "acl").write_text("user dev-a\n")
    reg = Registry(data)
    reg.enrol("dev-a", "Anna")
    (data / "server.toml").write_text(f'[server]\nbroker_dir = "{broker}"\n')
    (data / "versions").mkdir()
    (data / "versions" / "v0001.safetensors").write_bytes(b"model 1")
    state = RunState(data / "run")
    state.close()
    stop = threading.Event()
    written: list[int] = []

    def writer() -> None:  # the running server: rounds and participation keep coming while the backup reads
        db = sqlite3.connect(data / "run" / "state.sqlite", timeout=30)
        i = 0
        while not stop.is_set():
            with db:
                db.execute("INSERT INTO rounds (round, completed, summary) VALUES (?, ?, ?)", (i, time.time(), json.dumps({"round": i})))
            reg.note_participation(i, "dev-a", 0.5, 0.5)
            written.append(i)
            i += 1
        db.close()

    t = threading.Thread(target=writer)
    t.start()
    try:
        while len(written) < 50:
            time.sleep(0.01)
        r = subprocess.run([sys.executable, "-m", "coordinator.cli", "backup", str(tmp_path / "bk"), "--data", str(data)],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    finally:
        stop.set()
        t.join()
    assert r.returncode == 0, r.stderr
    bk = tmp_path / "bk"
    assert (bk.stat().st_mode & 0o777) == 0o700
    copied = sqlite3.connect(bk / "data" / "run" / "state.sqlite")
    n = copied.execute("SELECT COUNT(*), MAX(round) FROM rounds").fetchone()
    copied.close()
    assert n[0] == n[1] + 1 and 50 <= n[0] <= len(written)  # a consistent snapshot: rounds 0..k, none torn
    assert (bk / "broker" / "credentials" / "dev-a.password").read_text() == "pw-a\n"
    assert (bk / "data" / "versions" / "v0001.safetensors").read_bytes() == b"model 1"
    assert [e.action for e in read_audit(data)] == ["backup"]
    reg.close()

    # restore: refused into a non-empty folder, refused when damaged, then put back elsewhere
    with pytest.raises(BackupError, match="exists and is not empty"):
        restore(bk)
    other = tmp_path / "restored"
    done = restore(bk, other, force=True)  # the broker folder exists: --force moves it aside
    assert any("moved aside" in line for line in done)
    reg2 = Registry(other)
    assert [d.name for d in reg2.devices()] == ["dev-a"] and len(reg2.participation("dev-a")) >= 50
    reg2.close()
    assert (broker / "credentials" / "dev-a.password").read_text() == "pw-a\n"
    assert [e.action for e in read_audit(other)] == ["restore"]  # the backup was taken before its own entry
    (bk / "data" / "versions" / "v0001.safetensors").write_bytes(b"tampered")
    with pytest.raises(BackupError, match="differs from its checksum"):
        restore(bk, tmp_path / "third")
    assert not (tmp_path / "third").exists()
    with pytest.raises(BackupError, match="not a fedhar backup"):
        restore(tmp_path / "data", tmp_path / "third")
    with pytest.raises(BackupError, match="not an empty folder"):
        backup(data, bk, data / "server.toml", None)
