"""A month on a home server, compressed: the previous release's folder served on, devices re-issued, renamed and
forgotten, a certificate near expiry renewed, a backup restored; the status page in headless Chromium at each step.

What runs, on 127.0.0.1 only, on ONE data folder (then its restored copy):

1. ``upgraded``: the data, broker and certificate folders of ``tests/fixtures/upgrade-2ffcc27.tar.gz``
   (written by the previous release: dev-a, dev-b and dev-c enrolled, six rounds, dev-c revoked)
   moved to a new place as an operator moving a server would (paths and ports), Mosquitto on
   their configuration, ``fedhar-coordinator serve`` of this release on it, and dev-a and dev-b
   as replaying clients (``fedhar-client --source hapt:...``) until ``--rounds`` rounds of this
   release have completed.
2. ``reissue``: ``reissue dev-a``; its old password is refused by the broker at once; the device
   is started again with its new bundle alone and takes part in ``--rounds`` more rounds, under
   the same name with the same history.
3. ``rename``: ``rename dev-b kitchen-pi``; the old name is refused; the device is started with the
   new bundle and takes part in ``--rounds`` more rounds; its earlier rounds count under its new name.
4. ``certificate-near-expiry``: the broker's server certificate replaced by one from the same CA
   valid for 10 days (openssl, as the test PKI makes its short-lived one) and the
   broker reloaded: the page warns.
5. ``renewed``: ``broker renew --days 825``: the warning is gone; the devices keep connecting.
6. ``backup``: ``backup DEST`` while serve and both devices run.
7. ``restored``: serve, the devices and the broker stopped, ``restore DEST --force`` (the data
   into a fresh folder, the broker folder back in its place, the old one moved aside), broker and serve
   started from them: the page shows the backup's rounds, versions and devices exactly.
8. ``forget``: ``forget dev-a`` against the served restored folder: its name is gone from the
   round records, versions and metrics; the page and ``/api/devices`` keep the name alone (so it
   stays refused: README "forget NAME") and the audit log says it was forgotten.

At each step the page is loaded in headless Chromium (selenium), what it shows (text of the DOM)
is compared with the truth read from the files, the registry, the certificates and the broker,
and a screenshot ``NN-step.png`` (a 1280x900 window) goes to ``--out``. One line per step is printed:
``NN step: matched=yes|no page: ...``, then ``mismatch: ...`` lines for what did not match; the
last line is ``steps=N matched=N screenshots=N wall_s=...``. Exit status 0 when every step
matched, 1 otherwise, 2 when something needed is missing (mosquitto, openssl, Chromium).

Run: ``python benchmarks/scripted_month.py`` (103 s on a 2-core machine with the defaults;
``--rounds 1``, the short run of ``tests/test_scripted_month.py``, 76 s). Needs
mosquitto, openssl, chromium, chromium-driver and selenium.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from support.upgrade_fixture import move_upgrade_fixture, mqtt_login  # noqa: E402

from simulation.broker import find_mosquitto, free_port, stop_process, wait_for_port  # noqa: E402

HAPT = ROOT / "datasets" / "hapt"
FED = "homefed"
NEW_NAME = "kitchen-pi"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
REFUSED = (4, 5, 134, 135)  # CONNACK: bad user name or password / not authorised (MQTT 3.1.1 and 5)


class Missing(RuntimeError):
    """A program or library the run needs is not installed (exit 2)."""


def get(port: int, path: str) -> str:
    """The body of ``GET http://127.0.0.1:port/path`` (raises on a status other than 200)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=15) as r:
        return str(r.read().decode())


@dataclass
class Truth:
    """What the files say, read just before and just after the page was loaded (rounds may complete in between)."""

    rounds: tuple[int, int]  # completed rounds (state.sqlite)
    device_rounds: dict[str, tuple[int, int]]  # participation rows per name (registry)
    states: dict[str, str]
    versions: list[int]


def _completed_rounds(data: Path) -> int:
    db = sqlite3.connect(f"file:{data / 'run' / 'state.sqlite'}?mode=ro", uri=True, timeout=30)
    try:
        return int(db.execute("SELECT COUNT(*) FROM rounds").fetchone()[0])
    finally:
        db.close()


def _registry(data: Path) -> tuple[dict[str, int], dict[str, str], list[int]]:
    from coordinator.server.registry import Registry

    reg = Registry(data)
    try:
        rows = reg.devices()
        return {d.name: len(reg.participation(d.name)) for d in rows}, {d.name: d.state for d in rows}, [v.version for v in reg.versions()]
    finally:
        reg.close()


@dataclass
class Month:
    """The running programs of the month and the checks of each step."""

    out: Path
    work: Path
    rounds: int
    root: Path = field(init=False)
    port: int = 0
    tls_port: int = 0
    http: int = 0
    data: Path = field(init=False)
    broker: subprocess.Popen[bytes] | None = None
    serve: subprocess.Popen[bytes] | None = None
    clients: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    driver: Any = None
    lines: list[str] = field(default_factory=list)
    steps: int = 0
    matched: int = 0
    shots: int = 0

    # ------------------------------------------------------------------ programs
    def cli(self, *args: str) -> str:
        r = subprocess.run([sys.executable, "-m", "coordinator.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=180)
        if r.returncode != 0:
            raise RuntimeError(f"fedhar-coordinator {' '.join(args)} failed ({r.returncode}): {r.stderr[-2000:]}")
        return r.stdout

    def start_broker(self) -> None:
        exe = find_mosquitto()
        if exe is None:
            raise Missing("mosquitto is not installed (apt-get install mosquitto)")
        sink = open(self.work / "mosquitto.log", "ab")  # noqa: SIM115 - the broker's output for its life
        self.broker = subprocess.Popen([exe, "-c", str(self.root / "broker" / "mosquitto.conf")], stdout=sink, stderr=subprocess.STDOUT)
        for p in (self.port, self.tls_port):
            if not wait_for_port("127.0.0.1", p, 15):
                raise RuntimeError(f"mosquitto did not listen on {p}: {(self.work / 'mosquitto.log').read_text()[-2000:]}")

    def start_serve(self, data: Path) -> None:
        log = self.work / "serve.log"
        mark = log.stat().st_size if log.exists() else 0
        with open(log, "ab") as sink:
            self.serve = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "serve", "--data", str(data)],
                                          stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)  # fmt: skip
        self.wait(lambda: f"status page on http://127.0.0.1:{self.http}/" in log.read_bytes()[mark:].decode(errors="replace"), 120,
                  "the status page of serve")  # fmt: skip

    def stop_serve(self) -> None:
        if self.serve is not None:
            self.serve.send_signal(signal.SIGINT)  # as systemctl stop does
            try:
                self.serve.wait(60)
            except subprocess.TimeoutExpired:
                stop_process(self.serve)
            self.serve = None

    def start_client(self, name: str, subject: int, bundle: Path | None = None, state: str | None = None) -> None:
        """A replaying device: its bundle when given, else the account the previous release gave it (password file)."""
        cmd = [sys.executable, "-m", "edge_client.cli", "--source", f"hapt:{HAPT}/user{subject:02d}.npz",
               "--state-dir", str(self.work / f"state-{state or name}"), "--threads", "1",
               "--tls-ca", str(self.root / "pki" / "ca.crt")]  # fmt: skip
        if bundle is not None:
            cmd += ["--enrolment", str(bundle)]
        else:
            cmd += ["--client-id", name, "--federation", FED, "--broker", f"127.0.0.1:{self.tls_port}", "--username", name,
                    "--password-file", str(self.root / "broker" / "credentials" / f"{name}.password")]  # fmt: skip
        with open(self.work / f"{name}.log", "ab") as sink:
            self.clients[name] = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)

    def stop_client(self, name: str) -> None:
        p = self.clients.pop(name, None)
        if p is not None and p.poll() is None:
            stop_process(p)

    def wait(self, pred: Callable[[], bool], timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return
            for name, p in [("serve", self.serve), *self.clients.items()]:
                if p is not None and p.poll() is not None:
                    raise RuntimeError(f"{name} ended ({p.returncode}) while waiting for {what}; logs in {self.work}")
            time.sleep(0.5)
        raise RuntimeError(f"{what} not within {timeout:.0f} s; logs in {self.work}")

    def participation(self, name: str) -> int:
        return _registry(self.data)[0].get(name, 0)

    def rounds_since(self, name: str, first: int) -> int:
        """How many rounds numbered ``first`` or later ``name`` contributed to (registry)."""
        from coordinator.server.registry import Registry

        reg = Registry(self.data)
        try:
            return sum(1 for p in reg.participation(name) if p.round >= first)
        finally:
            reg.close()

    # ------------------------------------------------------------------ the page
    def truth_then_page(self) -> tuple[Truth, dict[str, Any]]:
        """Read the files, load the page in Chromium and read what it shows, read the files again."""
        c0, (p0, s0, v0) = _completed_rounds(self.data), _registry(self.data)
        self.driver.get(f"http://127.0.0.1:{self.http}/")
        page = read_page(self.driver)
        c1, (p1, _, _) = _completed_rounds(self.data), _registry(self.data)
        return Truth((c0, c1), {n: (p0.get(n, 0), p1.get(n, 0)) for n in p1}, s0, v0), page

    def step(self, slug: str, checks: list[tuple[str, bool]], said: str, focus: str | None = None) -> None:
        """Save the screenshot of the page now loaded (scrolled to the CSS selector ``focus`` when given) and
        print the step's line; ``checks`` are (what, held)."""
        self.steps += 1
        if focus is not None and (found := self.driver.find_elements("css selector", focus)):
            self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", found[0])
        name = f"{self.steps:02d}-{slug}.png"
        if self.driver.save_screenshot(str(self.out / name)):
            self.shots += 1
        bad = [what for what, ok in checks if not ok]
        self.matched += not bad
        line = f"{self.steps:02d} {slug}: matched={'yes' if not bad else 'no'} page: {said}"
        print(line, flush=True)
        for what in bad:
            print(f"   mismatch: {what}", flush=True)
        self.lines.append(line)


def read_page(driver: Any) -> dict[str, Any]:
    """What the loaded status page shows: summary figures, device rows, versions, certificates, audit rows, all text."""

    def text(css: str) -> str | None:
        found = driver.find_elements("css selector", css)
        return str(found[0].text) if found else None

    rows = {}
    for tr in driver.find_elements("css selector", "tr.device"):
        cells = [td.text for td in tr.find_elements("css selector", "td")]
        rows[tr.get_attribute("data-name")] = {"owner": cells[1], "presence": cells[2], "rounds": int(cells[4]), "accuracy": cells[5]}
    versions = [int(tr.find_elements("css selector", "td")[0].text) for tr in driver.find_elements("css selector", "#versions tr")[1:]
                if tr.find_elements("css selector", "td") and tr.find_elements("css selector", "td")[0].text.isdigit()]  # fmt: skip
    certs = {p.get_attribute("data-which"): (p.text, "rate-warn" in (p.get_attribute("class") or ""))
             for p in driver.find_elements("css selector", "p.certificate")}  # fmt: skip
    audit = [[td.text for td in tr.find_elements("css selector", "td")] for tr in driver.find_elements("css selector", "#audit tr")[1:]]
    return {"rounds": int(text("#rounds-completed") or -1), "link": text("#broker-link"), "coordinator": text("#coordinator-state"),
            "last_round": text("#last-round"), "devices": rows, "versions": versions, "certs": certs, "audit": audit,
            "health": [p.text for p in driver.find_elements("css selector", "#health")],
            "body": driver.find_element("tag name", "body").text}  # fmt: skip


def _records_naming(data: Path, name: str) -> int:
    """How many round records of ``data``'s run name ``name`` among the devices evaluated (state.sqlite)."""
    db = sqlite3.connect(f"file:{data / 'run' / 'state.sqlite'}?mode=ro", uri=True, timeout=30)
    try:
        return sum(name in json.loads(s).get("personalisation_clients", {}) for (s,) in db.execute("SELECT summary FROM rounds"))
    finally:
        db.close()


def _version_round(data: Path, version: int) -> int:
    from coordinator.server.registry import Registry

    reg = Registry(data)
    try:
        return next(v.round for v in reg.versions() if v.version == version)
    finally:
        reg.close()


def _within(v: int, bounds: tuple[int, int]) -> bool:
    return bounds[0] <= v <= bounds[1]


def _days_left(crt: Path) -> float:
    from coordinator.broker.certificates import certificate_not_after

    return (certificate_not_after(crt) - time.time()) / 86400


def _cert_checks(m: Month, page: dict[str, Any]) -> list[tuple[str, bool]]:
    """Server certificate and CA on the page against the files: days left, warning exactly when under 30 days."""
    out = []
    for which, path in (("server", m.root / "broker" / "tls" / "server.crt"), ("ca", m.root / "broker" / "tls" / "ca.crt")):
        days = _days_left(path)
        shown = page["certs"].get(which)
        out.append((f"{which} certificate shown with {days:.0f} days left, warned={days < 30}: page {shown}",
                    shown is not None and f"({days:.0f} days left)" in shown[0] and shown[1] == (days < 30)))  # fmt: skip
    return out


def _device_checks(page: dict[str, Any], truth: Truth, names: dict[str, str]) -> list[tuple[str, bool]]:
    """Each named device's row: presence label as expected, rounds equal to its participation rows."""
    out = []
    for name, presence in names.items():
        row = page["devices"].get(name)
        want = truth.device_rounds.get(name, (0, 0))
        out.append((f"{name} row presence {presence!r} and rounds in {want}: page {row}",
                    row is not None and row["presence"].startswith(presence) and _within(row["rounds"], want)))  # fmt: skip
    return out


def _said(page: dict[str, Any], names: list[str]) -> str:
    devs = ", ".join(f"{n} {page['devices'][n]['presence']} {page['devices'][n]['rounds']} rounds" for n in names if n in page["devices"])
    return f"broker {page['link']}, coordinator {page['coordinator']}, {page['rounds']} rounds completed; {devs}"


# ---------------------------------------------------------------------- the month
def run_month(m: Month) -> None:
    """The eight steps in order (module docstring)."""
    m.root, _, m.port, m.tls_port = move_upgrade_fixture(m.work)
    m.data = m.root / "data"
    toml = m.data / "server.toml"
    m.http = free_port()
    toml.write_text(toml.read_text().replace("http_port = 0", f"http_port = {m.http}"))
    old_rounds = _completed_rounds(m.data)
    m.start_broker()
    m.start_serve(m.data)
    m.start_client("dev-a", 1)
    m.start_client("dev-b", 2)

    # 1. the previous release's folder, served on by this one
    m.wait(lambda: _completed_rounds(m.data) >= old_rounds + m.rounds and m.participation("dev-b") > 6, 240,
           f"{m.rounds} round(s) of this release")  # fmt: skip
    truth, page = m.truth_then_page()
    checks = [(f"rounds completed in {truth.rounds}: page {page['rounds']}", _within(page["rounds"], truth.rounds)),
              (f"broker link up, coordinator online: page {page['link']}, {page['coordinator']}",
               page["link"] == "up" and page["coordinator"] == "online"),
              (f"newest version {truth.versions[-1]} listed: page {page['versions']}", truth.versions[-1] in page["versions"]),
              ("dev-c revoked with its 3 rounds of the previous release", page["devices"].get("dev-c", {}).get("rounds") == 3),
              *_device_checks(page, truth, {"dev-a": "online", "dev-b": "online", "dev-c": "revoked"}),
              *_cert_checks(m, page)]  # fmt: skip
    m.step("upgraded", checks, _said(page, ["dev-a", "dev-b", "dev-c"]) + f"; versions {page['versions']}")

    # 2. reissue dev-a: its old password refused at once; the device back with its new bundle, the same history
    old_pw = (m.root / "broker" / "credentials" / "dev-a.password").read_text().strip()
    before = m.participation("dev-a")
    m.cli("reissue", "dev-a", "--data", str(m.data))
    refused = mqtt_login(m.port, "dev-a", old_pw)
    m.stop_client("dev-a")
    m.start_client("dev-a", 1, bundle=m.data / "enrolment" / "dev-a.json")
    first = _completed_rounds(m.data) + 1  # a round opened after the device started again: only its new password got it in
    m.wait(lambda: m.rounds_since("dev-a", first) >= m.rounds, 240, "dev-a's rounds with its new bundle")
    truth, page = m.truth_then_page()
    checks = [(f"old password refused (CONNACK {refused})", refused in REFUSED),
              (f"dev-a kept its {before} earlier rounds: page {page['devices'].get('dev-a')}",
               page["devices"].get("dev-a", {}).get("rounds", 0) >= before + m.rounds),
              (f"newest operator action is the reissue of dev-a: {page['audit'][:1]}",
               bool(page["audit"]) and page["audit"][0][1:3] == ["reissue", "dev-a"]),
              *_device_checks(page, truth, {"dev-a": "online", "dev-b": "online"})]  # fmt: skip
    m.step("reissue", checks, _said(page, ["dev-a", "dev-b"]) + f"; rounds of dev-a before the reissue {before}")

    # 3. rename dev-b: the old name refused, the history under the new name
    old_pw = (m.root / "broker" / "credentials" / "dev-b.password").read_text().strip()
    before = m.participation("dev-b")
    m.cli("rename", "dev-b", NEW_NAME, "--data", str(m.data))
    refused = mqtt_login(m.port, "dev-b", old_pw)
    m.stop_client("dev-b")
    m.start_client(NEW_NAME, 2, bundle=m.data / "enrolment" / f"{NEW_NAME}.json", state="dev-b")
    first = _completed_rounds(m.data) + 1
    m.wait(lambda: m.rounds_since(NEW_NAME, first) >= m.rounds, 240, f"{NEW_NAME}'s rounds under its new name")
    truth, page = m.truth_then_page()
    checks = [(f"old name refused (CONNACK {refused})", refused in REFUSED),
              (f"{NEW_NAME} holds dev-b's {before} earlier rounds: page {page['devices'].get(NEW_NAME)}",
               page["devices"].get(NEW_NAME, {}).get("rounds", 0) >= before + m.rounds),
              (f"newest operator action is the rename: {page['audit'][:1]}",
               bool(page["audit"]) and page["audit"][0][1:3] == ["rename", NEW_NAME]),
              *_device_checks(page, truth, {"dev-a": "online", NEW_NAME: "online", "dev-b": f"renamed to {NEW_NAME}"})]  # fmt: skip
    m.step("rename", checks, _said(page, ["dev-a", NEW_NAME, "dev-b"]) + f"; rounds of dev-b before the rename {before}")

    # 4. the server certificate a few days from expiry (a short-lived one from the same CA, as the test PKI makes)
    near_certificate(m)
    truth, page = m.truth_then_page()
    checks = [*_cert_checks(m, page), ("the server certificate warned", page["certs"].get("server", ("", False))[1])]
    m.step("certificate-near-expiry", checks, f"server certificate: {page['certs'].get('server', ('none',))[0]}", focus="p.certificate")

    # 5. broker renew: a new server certificate from the same CA; the devices keep connecting
    m.cli("broker", "renew", "--out", str(m.root / "broker"), "--ca-key", str(m.root / "pki" / "ca.key"), "--days", "825",
          "--data", str(m.data))  # fmt: skip
    done = _completed_rounds(m.data)
    m.wait(lambda: _completed_rounds(m.data) >= done + 1, 240, "a round after the renewal")
    truth, page = m.truth_then_page()
    checks = [*_cert_checks(m, page), ("the server certificate not warned", not page["certs"].get("server", ("", True))[1]),
              (f"newest operator action is the renewal: {page['audit'][:1]}", bool(page["audit"]) and page["audit"][0][1] == "renew"),
              *_device_checks(page, truth, {"dev-a": "online", NEW_NAME: "online"})]  # fmt: skip
    said = f"server certificate: {page['certs'].get('server', ('none',))[0]}; " + _said(page, ["dev-a", NEW_NAME])
    m.step("renewed", checks, said, focus="p.certificate")

    # 6. backup while serving
    dest = m.work / "backup"
    done_before = _completed_rounds(m.data)  # the backup holds at least these, however long it takes under load
    m.cli("backup", str(dest), "--data", str(m.data))
    kept = dest / "data"
    backed_rounds = _completed_rounds(kept)
    truth, page = m.truth_then_page()
    checks = [(f"newest operator action is the backup: {page['audit'][:1]}", bool(page["audit"]) and page["audit"][0][1] == "backup"),
              (f"the backup holds {backed_rounds} rounds, at least the {done_before} completed as it began, no more than served: "
               f"page {page['rounds']}",
               done_before <= backed_rounds <= page["rounds"]),
              *_device_checks(page, truth, {"dev-a": "online", NEW_NAME: "online"})]  # fmt: skip
    m.step("backup", checks, _said(page, ["dev-a", NEW_NAME]) + f"; backup of {backed_rounds} rounds in {dest.name}/", focus="#audit")

    # 7. restore into a fresh folder and serve from it (the devices stay off: nothing new is learnt)
    m.stop_client("dev-a")
    m.stop_client(NEW_NAME)
    m.stop_serve()
    if m.broker is not None:
        stop_process(m.broker)  # restore puts the broker folder back too; the broker reads it when started again
    m.data = m.work / "restored"
    m.cli("restore", str(dest), "--data", str(m.data), "--force")  # --force: the live broker folder is moved aside, not deleted
    m.start_broker()
    m.start_serve(m.data)
    truth, page = m.truth_then_page()
    in_records = _records_naming(kept, "dev-a")
    checks = [(f"rounds completed {backed_rounds} as backed up: page {page['rounds']}", page["rounds"] == backed_rounds),
              (f"last completed round {backed_rounds - 1}: page {page['last_round']}", page["last_round"] == str(backed_rounds - 1)),
              (f"versions {truth.versions[::-1]} (the newest of round {backed_rounds - 1}): page {page['versions']}",
               bool(page["versions"]) and page["versions"] == truth.versions[::-1][: len(page["versions"])]
               and _version_round(m.data, page["versions"][0]) == backed_rounds - 1),
              (f"dev-a's rounds {in_records} as in the backed-up round records: page {page['devices'].get('dev-a')}",
               page["devices"].get("dev-a", {}).get("rounds") == in_records),
              *_device_checks(page, truth, {"dev-a": "offline", NEW_NAME: "offline", "dev-b": f"renamed to {NEW_NAME}",
                                            "dev-c": "revoked"}),
              (f"newest operator action is the restore: {page['audit'][:1]}",
               bool(page["audit"]) and page["audit"][0][1] == "restore")]  # fmt: skip
    m.step("restored", checks, _said(page, ["dev-a", NEW_NAME, "dev-b", "dev-c"]) + f"; restored into {m.data.name}/")

    # 8. forget dev-a: its name leaves the records, versions, metrics; only the refused name and the audit log keep it
    m.cli("forget", "dev-a", "--data", str(m.data))
    truth, page = m.truth_then_page()
    api = {p: get(m.http, p) for p in ("/api/rounds", "/api/round", "/api/versions", "/metrics", "/api/devices")}
    listed = {d["name"]: d for d in json.loads(api["/api/devices"])}
    row = page["devices"].get("dev-a", {})
    lines_naming = [ln for ln in page["body"].splitlines() if re.search(r"\bdev-a\b", ln)]
    audit_lines = [ln for ln in lines_naming if re.search(r"\b(enrol|reissue|revoke|forget)\b dev-a\b", ln)]
    checks = [*((f"no dev-a in {p}", "dev-a" not in body) for p, body in api.items() if p != "/api/devices"),
              (f"/api/devices keeps the name alone: {listed.get('dev-a')}",
               listed.get("dev-a", {}).get("state") == "forgotten" and listed["dev-a"].get("rounds") == 0
               and all(listed["dev-a"].get(k) is None for k in ("owner", "last_round", "last_accuracy", "last_macro_f1", "n_train"))),
              (f"the page's dev-a row says gone with no rounds: {row}",
               row.get("presence") == "gone (forgotten)" and row.get("rounds") == 0),
              (f"page lines naming dev-a are its row and the audit log only: {lines_naming}",
               len(lines_naming) == 1 + len(audit_lines) and any("forget dev-a" in ln for ln in audit_lines)),
              (f"rounds completed {backed_rounds} still (counts stay, naming no one): page {page['rounds']}",
               page["rounds"] == backed_rounds)]  # fmt: skip
    m.step("forget", checks, f"dev-a {row.get('presence')} {row.get('rounds')} rounds; lines naming dev-a: {len(lines_naming)} "
                             f"(row + {len(audit_lines)} audit); API without dev-a: "
                             + ", ".join(p for p, b in api.items() if p != "/api/devices" and "dev-a" not in b))  # fmt: skip


def near_certificate(m: Month, days: int = 10) -> None:
    """Replace the broker's server certificate by one from the same CA (the fixture's ``pki/ca.key``) valid ``days`` days; reload."""
    pki = m.root / "pki"
    ssl = shutil.which("openssl")
    if ssl is None:
        raise Missing("openssl is not installed (apt-get install openssl)")
    with tempfile.TemporaryDirectory(dir=m.work) as tmp:
        new = Path(tmp) / "server.crt"
        r = subprocess.run([ssl, "x509", "-req", "-in", str(pki / "server.csr"), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
                            "-CAserial", str(Path(tmp) / "ca.srl"), "-CAcreateserial", "-days", str(days),
                            "-extfile", str(pki / "server.ext"), "-out", str(new)], capture_output=True, text=True, timeout=60)  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"openssl failed: {r.stderr}")
        os.replace(new, m.root / "broker" / "tls" / "server.crt")
    if m.broker is not None:
        m.broker.send_signal(signal.SIGHUP)  # Mosquitto reads its certificates again on a reload


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots" / "month", help="screenshots go here (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds to wait for after the upgrade, the reissue and the rename")
    ap.add_argument("--keep", type=Path, default=None, help="keep the working folders (data, broker, logs) here instead of a temporary one")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    a.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fedhar-month-") as tmp:
        work = a.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        m = Month(out=a.out, work=work, rounds=a.rounds)
        rc = 0
        try:
            m.driver = browser()
            run_month(m)
        except Missing as exc:
            print(f"scripted_month: {exc}", file=sys.stderr)
            rc = 2
        except Exception as exc:  # a step that could not run: say which and where its logs are
            print(f"scripted_month: step {m.steps + 1} failed: {exc}", file=sys.stderr)
            for log in sorted(work.glob("*.log")):
                print(f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}", file=sys.stderr)
            rc = 1
        finally:
            if m.driver is not None:
                m.driver.quit()
            for name in list(m.clients):
                m.stop_client(name)
            m.stop_serve()
            if m.broker is not None:
                stop_process(m.broker)
    print(f"steps={m.steps} matched={m.matched} screenshots={m.shots} wall_s={time.monotonic() - t0:.0f}")
    return rc or (0 if m.steps == m.matched else 1)


def browser() -> Any:
    """Headless Chromium through selenium, 1280x900; raises :class:`Missing` without them."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium (pip install '.[test]')")
    if missing:
        raise Missing(f"the page is read in headless Chromium: install {', '.join(missing)} (apt-get install chromium chromium-driver)")
    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


if __name__ == "__main__":
    sys.exit(main())
