"""The README's home server with two enrolled devices, run on loopback for 30+ rounds: does it keep learning?

What runs, as the README's "## The home server" has it, on 127.0.0.1 only:

* a CA and a server certificate made with the openssl recipe of ``mosquitto_config.py --help``;
* a Mosquitto configured by ``firmware_scripts/mosquitto_config.py`` (TLS listener for the devices,
  plain loopback listener for the coordinator, one account per device, the ``monitor`` account);
* ``fedhar-coordinator serve --data DATA`` with the README's ``server.toml`` (``min_clients = 2``,
  every federation setting at its default: the paper CNN, FedExP, the quality guard), only the
  schedule compressed: ``min_round_interval_s`` (README 600 s) and ``round_timeout_s`` (default
  900 s) are ``--interval`` and ``--deadline``;
* two devices enrolled with ``fedhar-coordinator enrol`` and started as ``fedhar-client
  --enrolment BUNDLE --source hapt:datasets/hapt/userXX.npz`` with their bundle alone.

Once ``--freeze-after`` rounds have completed and the next round is open, the second device is
frozen (SIGSTOP) for ``--deadline`` + ``--freeze-extra`` seconds (longer than one round deadline),
then continued (SIGCONT). Once ``--restart-after`` rounds have completed and the next round is open,
Mosquitto is stopped and started again on the same configuration (5 s down). While it runs, ``/api/round``, ``/healthz`` and the
``/metrics`` counters are polled every second into ``OUT/poll.jsonl``; the page ``/`` is saved
during the freeze and at the end.

At the end, the personalisation macro-F1 and accuracy per round (from the run's records,
``/api/rounds``) go to ``OUT/curve.csv``; the last line printed is::

    rounds=R final_f1=... best_f1=... worst_f1=... max_drop_from_best=... rounds_without_quorum=N longest_gap_s=...
    deadline_s=... interval_s=...

(figures in per cent; the worst is over rounds after the first, max_drop_from_best the deepest fall
of a round below the best round before it (a collapse shows here), the gap is between two
consecutive completed rounds as the poller saw them, at one-second resolution).

Run: ``python benchmarks/home_federation.py --out /tmp/home-fed`` (about 25 minutes with the
defaults on a 2-core machine). Needs mosquitto, mosquitto_passwd and openssl.
"""

from __future__ import annotations

import argparse
import csv
import getpass
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from simulation.broker import free_ports, stop_process, wait_for_port

ROOT = Path(__file__).resolve().parents[1]
HAPT = ROOT / "datasets" / "hapt"
FEDERATION = "home"
DEVICES = ("phone-anna", "pi-kitchen")


def _run(cmd: list[str], cwd: Path, what: str) -> str:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"{what} failed ({r.returncode}): {r.stderr[-2000:]}")
    return r.stdout


def make_pki(d: Path) -> tuple[Path, Path, Path]:
    """The README's recipe (``mosquitto_config.py --help``) for 127.0.0.1: (ca.crt, server.crt, server.key)."""
    d.mkdir(parents=True, exist_ok=True)
    ssl = shutil.which("openssl") or "openssl"
    _run([ssl, "req", "-x509", "-newkey", "rsa:3072", "-nodes", "-days", "3650", "-subj", "/CN=fedhar CA",
          "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-keyout", "ca.key", "-out", "ca.crt"], d, "openssl CA")  # fmt: skip
    _run([ssl, "req", "-newkey", "rsa:3072", "-nodes", "-subj", "/CN=localhost", "-keyout", "server.key", "-out", "server.csr"], d,
         "openssl server key")  # fmt: skip
    (d / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                                  "extendedKeyUsage=serverAuth\nauthorityKeyIdentifier=keyid,issuer\n")  # fmt: skip
    _run([ssl, "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "825",
          "-extfile", "server.ext", "-out", "server.crt"], d, "openssl server certificate")  # fmt: skip
    return d / "ca.crt", d / "server.crt", d / "server.key"


class Broker:
    """Mosquitto on the generated configuration; :meth:`restart` stops it and starts it again on the same ports."""

    def __init__(self, conf: Path, ports: tuple[int, int], log: Path):
        self.conf, self.ports, self.log = conf, ports, log
        self.exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as sink:
            self.proc = subprocess.Popen([self.exe, "-c", str(self.conf), "-v"], stdout=sink, stderr=subprocess.STDOUT)
        for p in self.ports:
            if not wait_for_port("127.0.0.1", p, 15):
                raise SystemExit(f"mosquitto did not listen on {p}; see {self.log}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def restart(self, down_s: float) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


_COUNTERS = re.compile(r"^(fedhar_(?:rounds_completed_total|rounds_without_quorum_total|rollbacks_total|broker_link_up|"
                       r"seconds_since_last_round|round_attempts_sum|round_attempts_count)) (\S+)$", re.M)  # fmt: skip


def _poll(http: int) -> dict[str, Any]:
    code, body = _get(http, "/api/round")
    cur = json.loads(body) if code == 200 else {"error": body[:200]}
    hcode, hbody = _get(http, "/healthz")
    _, metrics = _get(http, "/metrics")
    return {"t": time.time(), "round": cur, "healthz": hcode, "healthz_body": hbody[:400],
            "metrics": {k: float(v) for k, v in _COUNTERS.findall(metrics)}}  # fmt: skip


def _save_page(http: int, out: Path, name: str) -> None:
    for path, suffix in (("/", ".html"), ("/api/round", ".round.json"), ("/healthz", ".healthz.json"), ("/metrics", ".metrics.txt")):
        code, body = _get(http, path)
        (out / f"{name}{suffix}").write_text(f"{body}" if code else f"unreachable: {body}")


def plot(curve: list[tuple[int, Any, Any, int, Any]], events: list[tuple[float, str]], completed_at: dict[int, float], path: Path) -> None:
    """Personalisation macro-F1 and accuracy per round and the received version's start macro-F1 (%), with the freeze
    and the broker restart marked at the first round completed after them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [c[0] for c in curve]
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=120)
    ax.plot(rounds, [100 * c[1] for c in curve], marker="o", ms=3, label="personalisation macro-F1")
    ax.plot(rounds, [100 * c[2] for c in curve], marker="s", ms=3, label="personalisation accuracy")
    ax.plot(rounds, [100 * c[4] if c[4] is not None else float("nan") for c in curve], ls=":", color="grey",
            label="start macro-F1 (the received version)")  # fmt: skip
    for t, what in events:
        if what.startswith(("SIGSTOP", "broker stopped")):
            r = min((r for r, at in completed_at.items() if at >= t), default=rounds[-1])
            ax.axvline(r, color="grey", ls="--", lw=0.8)
            ax.annotate(what.split(" in round")[0].replace("broker stopped", "broker restart"), (r, 3), rotation=90, fontsize=7,
                        ha="right", va="bottom")  # fmt: skip
    ax.set_xlabel("round")
    ax.set_ylabel("%")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("Two enrolled devices, served federation, README defaults (schedule compressed)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def summarise(out: Path, deadline: float, interval: float, draw: bool) -> str:
    """Write OUT/curve.csv (and OUT/curve.png with ``draw``) from a finished run's files; return the figures line.

    Reads OUT/rounds.json (``/api/rounds`` at the end; else the run's ``data/run/report.json``), OUT/poll.jsonl
    (when each round was first seen completed, the rounds-without-quorum counter) and OUT/events.json if any.
    """
    if (out / "rounds.json").exists():
        rounds = json.loads((out / "rounds.json").read_text())
    else:
        rounds = json.loads((out / "data" / "run" / "report.json").read_text())["rounds"]
    curve = []
    for rec in rounds:
        pers, start = rec.get("personalisation") or {}, rec.get("start") or {}
        curve.append((int(rec["round"]), pers.get("macro_f1"), pers.get("accuracy"), int(rec.get("attempts", 1)), start.get("macro_f1")))
    with open(out / "curve.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["round", "personalisation_macro_f1", "personalisation_accuracy", "attempts", "start_macro_f1"])
        w.writerows(curve)
    completed_at: dict[int, float] = {}
    failed = sum(c[3] - 1 for c in curve)
    for line in (out / "poll.jsonl").read_text().splitlines():
        snap = json.loads(line)
        last = snap["round"].get("last_completed")
        if isinstance(last, int):
            for r in range(last + 1):
                completed_at.setdefault(r, snap["t"])
        failed = max(failed, int(snap["metrics"].get("fedhar_rounds_without_quorum_total", 0)))
    events = [(e["t"], e["what"]) for e in json.loads((out / "events.json").read_text())] if (out / "events.json").exists() else []
    times = [completed_at[r] for r in sorted(completed_at)]
    gaps = [b - t for t, b in itertools.pairwise(times)]
    f1 = [c[1] for c in curve if c[1] is not None]
    drop = max(max(f1[: i + 1]) - x for i, x in enumerate(f1))  # the deepest fall below the best round so far
    if draw:
        plot(curve, events, completed_at, out / "curve.png")
    return (f"rounds={len(curve)} final_f1={100 * f1[-1]:.1f} best_f1={100 * max(f1):.1f} worst_f1={100 * min(f1[1:] or f1):.1f} "
            f"max_drop_from_best={100 * drop:.1f} rounds_without_quorum={failed} longest_gap_s={max(gaps, default=0):.0f} "
            f"deadline_s={deadline:.0f} interval_s={interval:.0f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="working folder (made; must not exist, but with --summarise)")
    ap.add_argument("--rounds", type=int, default=32, help="stop once this many rounds have completed")
    ap.add_argument("--interval", type=float, default=20.0, help="[schedule] min_round_interval_s (README 600)")
    ap.add_argument("--deadline", type=float, default=60.0, help="round_timeout_s (default 900)")
    ap.add_argument("--freeze-after", type=int, default=8, help="freeze the second device in the round after this many")
    ap.add_argument("--freeze-extra", type=float, default=25.0, help="the freeze lasts the deadline plus this (s)")
    ap.add_argument("--restart-after", type=int, default=18, help="restart Mosquitto in the round after this many")
    ap.add_argument("--subjects", default="1,2", help="the two devices' HAPT subjects")
    ap.add_argument("--plot", action="store_true", help="draw OUT/curve.png (matplotlib)")
    ap.add_argument("--max-minutes", type=float, default=45.0, help="give up after this long")
    ap.add_argument("--summarise", action="store_true", help="only write the curve and the figures of the finished run in --out")
    a = ap.parse_args(argv)
    out: Path = a.out
    if a.summarise:
        print(summarise(out, a.deadline, a.interval, a.plot))
        return 0
    out.mkdir(parents=True)
    subjects = [int(s) for s in a.subjects.split(",")]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    py = sys.executable

    ca, crt, key = make_pki(out / "pki")
    port, tls_port, http = free_ports(3)
    broker_dir = out / "broker"
    _run([py, str(ROOT / "firmware_scripts" / "mosquitto_config.py"), "--out", str(broker_dir), "--federation", FEDERATION,
          "--tls-cert", str(crt), "--tls-key", str(key), "--tls-ca", str(ca), "--public-host", "127.0.0.1",
          "--broker-user", getpass.getuser(), "--port", str(port), "--tls-port", str(tls_port), "--tls-bind", "127.0.0.1"],
         ROOT, "mosquitto_config.py")  # fmt: skip
    broker = Broker(broker_dir / "mosquitto.conf", (port, tls_port), out / "mosquitto.log")
    broker.start()

    data = out / "data"
    data.mkdir()
    # The README's server.toml; only the schedule compressed, and the page on a free port.
    (data / "server.toml").write_text(
        f"[timing]\nround_timeout_s = {a.deadline}\n\n"
        f'[server]\nbroker_dir = "{broker_dir}"\nhttp_port = {http}\n\n'
        f"[schedule]\nmin_clients = 2\nmin_round_interval_s = {a.interval}\n"
    )
    coord = [py, "-m", "coordinator.cli"]
    for name in DEVICES:
        _run([*coord, "enrol", name, "--owner", name.split("-")[1].title(), "--data", str(data)], ROOT, f"enrol {name}")

    procs: list[subprocess.Popen[bytes]] = []
    poll_log = open(out / "poll.jsonl", "a")  # noqa: SIM115 - closed in finally
    events: list[tuple[float, str]] = []
    try:
        with open(out / "serve.log", "ab") as sink:
            procs.append(subprocess.Popen([*coord, "serve", "--data", str(data)], stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT,
                                          env=env))  # fmt: skip
        devices: list[subprocess.Popen[bytes]] = []
        for name, k in zip(DEVICES, subjects, strict=True):
            cmd = [py, "-m", "edge_client.cli", "--enrolment", str(data / "enrolment" / f"{name}.json"),
                   "--source", f"hapt:{HAPT / f'user{k:02d}.npz'}", "--state-dir", str(out / f"state-{name}")]  # fmt: skip
            with open(out / f"{name}.log", "ab") as sink:
                devices.append(subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT, env=env))
        procs.extend(devices)

        start = time.time()
        frozen_until: float | None = None
        froze = restarted = False
        saved_failed = saved_rerun = False
        while time.time() - start < a.max_minutes * 60:
            if any(p.poll() is not None for p in procs):
                bad = [p.args for p in procs if p.poll() is not None]
                raise SystemExit(f"a process ended early: {bad}; see the logs in {out}")
            snap = _poll(http)
            poll_log.write(json.dumps(snap) + "\n")
            poll_log.flush()
            cur = snap["round"]
            last = cur.get("last_completed")
            done = (last + 1) if isinstance(last, int) else 0
            if done >= a.rounds:
                break
            if not froze and done >= a.freeze_after and cur.get("state") == "training":
                devices[1].send_signal(signal.SIGSTOP)
                froze, frozen_until = True, time.time() + a.deadline + a.freeze_extra
                events.append((time.time(), f"SIGSTOP {DEVICES[1]} in round {cur.get('round')}"))
                time.sleep(3)
                _save_page(http, out, "page-freeze-open")
            if frozen_until is not None or (froze and not saved_rerun):
                if not saved_failed and snap["metrics"].get("fedhar_rounds_without_quorum_total", 0) > 0:
                    saved_failed = True
                    _save_page(http, out, "page-after-failed-quorum")
                if saved_failed and not saved_rerun and cur.get("state") == "training":
                    saved_rerun = True
                    _save_page(http, out, "page-rerun-open")
                if frozen_until is not None and time.time() >= frozen_until:
                    _save_page(http, out, "page-freeze-end")
                    devices[1].send_signal(signal.SIGCONT)
                    events.append((time.time(), f"SIGCONT {DEVICES[1]}"))
                    frozen_until = None
            if not restarted and done >= a.restart_after and cur.get("state") == "training":  # mid-round
                events.append((time.time(), f"broker stopped after {done} rounds"))
                broker.restart(5.0)
                events.append((time.time(), "broker started again"))
                restarted = True
            time.sleep(1.0)
        _save_page(http, out, "page-end")
        code, body = _get(http, "/api/rounds")
        rounds = json.loads(body) if code == 200 else []
    finally:
        poll_log.close()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        broker.stop()
    (out / "events.json").write_text(json.dumps([{"t": t, "what": w} for t, w in events], indent=1))
    (out / "rounds.json").write_text(json.dumps(rounds))
    print(summarise(out, a.deadline, a.interval, a.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
