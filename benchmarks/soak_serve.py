"""Soak test of the home server: a served federation that keeps learning through churn and faults.

``fedhar-coordinator serve`` runs as the home server runs it (README, "The home server"): its
data folder, a Mosquitto with TLS, an ACL and one account per device (written by
``firmware_scripts/mosquitto_config.py``), devices enrolled with ``fedhar-coordinator enrol``
and run as real ``fedhar-client`` processes from their bundles, each replaying one HAPT subject
(``datasets/hapt/userNN.npz``). The CNN is tiny (4 filters, 8 units) and the schedule compressed
(``--deadline`` seconds per round attempt, ``--interval`` seconds between rounds).

A plan drawn from ``--seed`` acts at completed-round marks:

* fixed faults at fractions of ``--rounds`` (``--faults`` chooses which): a device whose update is
  finite but 100x too large (``oversized``, tests/support/oversized_update_client.py) from 15 % until
  ``--oversized-rounds`` of its updates were counted (clipped or not; at most three times as many rounds
  after it connected); a device frozen with SIGSTOP for about one deadline (``freeze``, 25 %);
  Mosquitto stopped and started again on the same ports (``broker``, 40 %); ``serve`` reloaded with
  SIGHUP after a change of ``[schedule] min_round_interval_s`` (``reload``, 55 %); ``serve`` killed
  with SIGKILL and started again (``kill``, 70 %);
* every ``--churn-every`` rounds, one random device action: join (start an enrolled device that is
  off, or enrol a new one up to ``--devices-max``), leave (SIGTERM), freeze (SIGSTOP for 0.3 to 1.2
  deadlines), restart (SIGTERM, start again), revoke and re-enrol (``revoke``, then ``enrol`` under
  a new name, as a reset phone joins again). At least two working devices stay on at all times.

Figures come from the run's ``state.sqlite`` (each completed round's time and record; the
``round_failed`` and ``rollback`` events), ``/proc/<pid>/status`` (the coordinator's VmHWM) and
the data folder's size. A *stall* is a wait for a completed round longer than one deadline, two
intervals and 5 s of a round's own work (``stall_limit_s``), counted from the later of the previous
completed round and the end of the last fault before it: a device back from a freeze or gone, the
broker started again, a started or restarted program (device or ``serve``) connected to the broker.
The figures are printed LAST as one line of ``key=value``:

    python benchmarks/soak_serve.py --rounds 300 --seed 1 --out /tmp/soak

Baseline: none; the figures are absolute (a stall count of 0 is the goal, and the guard must
reject or roll back the oversized device's rounds).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from support.secured_broker import SecuredBroker, configure, start  # noqa: E402

from simulation.broker import stop_process  # noqa: E402

FED = "soak"
HAPT = ROOT / "datasets" / "hapt"
FAULTS = ("freeze", "oversized", "broker", "reload", "kill")
CHURN = ("join", "leave", "freeze", "restart", "revoke")
SCALE = 100.0  # how many times too large the faulty device's update is
GRACE_S = 5.0  # a round's own work beyond its deadline and interval (announce, aggregate, evaluate, keep the version)


@dataclass
class Device:
    """One enrolled device: its name, HAPT subject, process (None while off) and whether its updates are oversized."""

    name: str
    subject: int
    oversized: bool = False
    proc: subprocess.Popen[bytes] | None = None
    frozen_until: float | None = None

    @property
    def on(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def working(self) -> bool:
        return self.on and self.frozen_until is None and not self.oversized


@dataclass
class Soak:
    """The running federation and what happened to it."""

    out: Path
    args: argparse.Namespace
    broker: SecuredBroker | None = None
    broker_proc: subprocess.Popen[bytes] | None = None
    serve_proc: subprocess.Popen[bytes] | None = None
    devices: dict[str, Device] = field(default_factory=dict)
    recoveries: list[float] = field(default_factory=list)  # unix times at which a fault ended
    peak_rss_kib: int = 0
    actions: list[str] = field(default_factory=list)
    next_subject: int = 1
    revoked: set[str] = field(default_factory=set)
    oversized_until: int | None = None  # completed rounds at which the oversized device leaves at the latest
    oversized_on = False  # it joined and has not left yet
    pending: dict[Path, int] = field(default_factory=dict)  # log -> its connections when a program was (re)started

    def expect_connect(self, log: Path) -> None:
        """The program writing ``log`` was (re)started or lost its broker: its next connection ends a fault."""
        self.pending[log] = _connections(log)

    def connects_due(self) -> None:
        for log, before in list(self.pending.items()):
            if _connections(log) > before:
                del self.pending[log]
                self.recoveries.append(time.time())

    @property
    def data(self) -> Path:
        return self.out / "data"

    def note(self, text: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} round {self.completed()}: {text}"
        self.actions.append(line)
        print(line, flush=True)

    # --- the broker and the coordinator -------------------------------------------------------
    def start_broker(self) -> None:
        assert self.broker is not None
        self.broker_proc = start(self.broker)

    def start_serve(self) -> None:
        self.expect_connect(self.out / "serve.log")
        with open(self.out / "serve.log", "ab") as log:
            self.serve_proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "serve", "--data", str(self.data)],
                                               stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)  # fmt: skip

    def sample_rss(self) -> None:
        p = self.serve_proc
        if p is None or p.poll() is not None:
            return
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_rss_kib = max(self.peak_rss_kib, int(line.split()[1]))

    def cli(self, *argv: str) -> int:
        """``fedhar-coordinator ARGV`` in this process (enrol, revoke), its output to cli.log."""
        from coordinator.cli import main

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            rc = main(list(argv))
        with open(self.out / "cli.log", "a") as log:
            log.write(f"$ fedhar-coordinator {' '.join(argv)} -> {rc}\n{buf.getvalue()}\n")
        return rc

    # --- devices -----------------------------------------------------------------------------------
    def enrol(self, base: str | None = None, oversized: bool = False) -> Device:
        subject = self.next_subject
        self.next_subject = self.next_subject % 30 + 1
        name = base or f"dev-{subject:02d}"
        k = 2
        while name in self.devices:
            name = f"{base or f'dev-{subject:02d}'}-r{k}"
            k += 1
        rc = self.cli("enrol", name, "--owner", "soak", "--data", str(self.data))
        if rc != 0:
            raise RuntimeError(f"enrol {name} exited {rc}; see {self.out / 'cli.log'}")
        keep = self.out / "bundles" / f"{name}.json"  # serve deletes a bundle once its device has joined
        keep.parent.mkdir(exist_ok=True)
        keep.write_bytes((self.data / "enrolment" / f"{name}.json").read_bytes())
        dev = Device(name, subject, oversized)
        self.devices[name] = dev
        return dev

    def start_device(self, dev: Device) -> None:
        client = ["--enrolment", str(self.out / "bundles" / f"{dev.name}.json"), "--source", f"hapt:{HAPT}/user{dev.subject:02d}.npz",
                  "--state-dir", str(self.out / "states" / dev.name), "--threads", "1"]  # fmt: skip
        env = dict(os.environ)
        if dev.oversized:
            cmd = [sys.executable, "-m", "support.oversized_update_client", "--scale", str(SCALE), *client]
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
        else:
            cmd = [sys.executable, "-m", "edge_client.cli", *client]
        self.expect_connect(self.out / "logs" / f"{dev.name}.log")
        with open(self.out / "logs" / f"{dev.name}.log", "ab") as log:
            dev.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)

    def stop_device(self, dev: Device) -> None:
        if dev.proc is not None:
            if dev.frozen_until is not None:
                dev.proc.send_signal(signal.SIGCONT)
                dev.frozen_until = None
            stop_process(dev.proc)
        dev.proc = None

    def freeze(self, dev: Device, seconds: float) -> None:
        assert dev.proc is not None
        dev.proc.send_signal(signal.SIGSTOP)
        dev.frozen_until = time.time() + seconds
        self.note(f"{dev.name} frozen (SIGSTOP) for {seconds:.1f} s")

    def thaw_due(self) -> None:
        now = time.time()
        for dev in self.devices.values():
            if dev.frozen_until is not None and now >= dev.frozen_until and dev.proc is not None:
                dev.proc.send_signal(signal.SIGCONT)
                dev.frozen_until = None
                self.recoveries.append(now)
                self.note(f"{dev.name} runs again (SIGCONT)")

    def oversized_counted(self) -> int:
        """Completed rounds that counted an update of the oversized device (its name in the record's personalisation_clients)."""
        return sum(1 for rec in self.records() if "dev-oversized" in (rec.get("personalisation_clients") or {}))

    def oversized_clipped(self) -> int:
        """Updates of the oversized device the guard clipped (``clipped_update`` events)."""
        db = self.data / "run" / "state.sqlite"
        q = "SELECT COUNT(*) FROM events WHERE kind = 'clipped_update' AND client = 'dev-oversized'"
        try:
            with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as con:
                return int(con.execute(q).fetchone()[0])
        except sqlite3.Error:
            return 0

    def records(self) -> list[dict[str, Any]]:
        """The completed rounds' records, in the order they completed (none while the database cannot be read)."""
        db = self.data / "run" / "state.sqlite"
        try:
            with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as con:
                return [json.loads(s) for (s,) in con.execute("SELECT summary FROM rounds ORDER BY completed")]
        except sqlite3.Error:
            return []

    def working(self) -> list[Device]:
        return [d for d in self.devices.values() if d.working]

    # --- progress ---------------------------------------------------------------------------------
    def completed(self) -> int:
        db = self.data / "run" / "state.sqlite"
        if not db.exists():
            return 0
        try:
            with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as con:
                return int(con.execute("SELECT COUNT(*) FROM rounds").fetchone()[0])
        except sqlite3.Error:
            return 0


def _connections(log: Path) -> int:
    """How many times the program writing ``log`` has connected to the broker (its MQTT link logs each connection)."""
    try:
        return log.read_text(errors="replace").count(": connected to ")
    except OSError:
        return 0


def settings(deadline: float, interval: float, broker_dir: Path, buffer_size: int = 0) -> str:
    """server.toml of the soak: the tiny CNN, one local epoch, the compressed schedule, the guard on (serve's default);
    ``buffer_size`` > 0: buffered rounds of that K (coordinator/rounds/buffered.py)."""
    return (f"min_clients = 2\n[model]\nconv_filters = 4\ndense_units = 8\n[training]\nlocal_epochs = 1\n"
            f"[timing]\nround_timeout_s = {deadline}\nstart_timeout_s = {deadline}\nstatus_refresh_s = 2\n"
            + (f"[buffer]\nsize = {buffer_size}\n" if buffer_size else "") +
            f'[server]\nname = "soak-home"\nbroker_dir = "{broker_dir}"\npublic_host = "127.0.0.1"\nhttp_port = 0\nkeep_versions = 20\n'
            f"[schedule]\nmin_clients = 2\nmin_round_interval_s = {interval}\n")  # fmt: skip


def fixed_plan(rounds: int, faults: list[str]) -> dict[int, list[str]]:
    """Completed-round marks of the fixed faults: round -> fault names."""
    at = {"oversized": 0.15, "freeze": 0.25, "broker": 0.40, "reload": 0.55, "kill": 0.70}
    plan: dict[int, list[str]] = {}
    mark = 1
    for f in sorted(faults, key=at.__getitem__):  # one fault per mark, in the order above, from round 2 on
        mark = max(mark + 1, int(at[f] * rounds))
        plan[mark] = [f]
    return plan


def churn(soak: Soak, rng: random.Random) -> None:
    """One random device action, keeping at least two working devices on."""
    args = soak.args
    on = [d for d in soak.devices.values() if d.on and not d.oversized]
    off = [d for d in soak.devices.values() if not d.on and not d.oversized and d.name not in soak.revoked]
    working = soak.working()
    choices = []
    if len(on) < args.devices_max:
        choices.append("join")
    if len(working) > 2:
        choices += ["leave", "freeze", "restart", "revoke"]
    if not choices:
        return
    what = rng.choice(choices)
    if what == "join":
        dev = rng.choice(off) if off and rng.random() < 0.7 else soak.enrol()
        soak.start_device(dev)
        soak.note(f"{dev.name} joins (HAPT subject {dev.subject})")
        return
    dev = rng.choice(working)
    if what == "leave":
        soak.stop_device(dev)
        soak.recoveries.append(time.time())
        soak.note(f"{dev.name} leaves (SIGTERM)")
    elif what == "freeze":
        soak.freeze(dev, args.deadline * rng.uniform(0.3, 1.2))
    elif what == "restart":
        soak.stop_device(dev)
        soak.start_device(dev)
        soak.note(f"{dev.name} restarted")
    else:
        rc = soak.cli("revoke", dev.name, "--data", str(soak.data))
        soak.recoveries.append(time.time())
        if dev.proc is not None:
            try:
                dev.proc.wait(30)  # the broker closes its session; the client exits 4 (refused)
            except subprocess.TimeoutExpired:
                stop_process(dev.proc)
        dev.proc = None
        soak.revoked.add(dev.name)
        new = soak.enrol(base=dev.name.split("-r")[0])
        new.subject = dev.subject
        soak.start_device(new)
        soak.note(f"{dev.name} revoked (exit {rc}) and re-enrolled as {new.name}")


def fixed_fault(soak: Soak, what: str) -> None:
    args = soak.args
    if what == "oversized":
        dev = soak.enrol(base="dev-oversized", oversized=True)
        soak.start_device(dev)
        soak.note(f"{dev.name} joins: its updates are {SCALE:g}x too large, until {args.oversized_rounds} of them were counted")
        soak.oversized_on = True
    elif what == "freeze":
        soak.freeze(max(soak.working(), key=lambda d: d.name), args.deadline)
    elif what == "broker":
        assert soak.broker_proc is not None
        stop_process(soak.broker_proc)
        soak.note("Mosquitto stopped")
        time.sleep(2.0)
        soak.start_broker()
        soak.recoveries.append(time.time())
        for log in [soak.out / "serve.log", *(soak.out / "logs" / f"{d.name}.log" for d in soak.devices.values() if d.on)]:
            soak.expect_connect(log)
        soak.note("Mosquitto started again")
    elif what == "reload":
        toml = soak.data / "server.toml"
        toml.write_text(toml.read_text().replace(f"min_round_interval_s = {args.interval}", f"min_round_interval_s = {args.interval * 2}"))
        assert soak.serve_proc is not None
        soak.serve_proc.send_signal(signal.SIGHUP)
        soak.note(f"SIGHUP to serve after [schedule] min_round_interval_s {args.interval} -> {args.interval * 2}")
    elif what == "kill":
        assert soak.serve_proc is not None
        soak.sample_rss()
        soak.serve_proc.send_signal(signal.SIGKILL)
        soak.serve_proc.wait(30)
        soak.note("serve killed (SIGKILL)")
        time.sleep(1.0)
        soak.start_serve()
        soak.note("serve started again")


def figures(soak: Soak, started: float, ended: float) -> dict[str, Any]:
    """The soak's figures from the run's database, the plan's recoveries and the coordinator's memory.

    The wait from the last completed round to ``ended`` (the end of the run, unix s) counts as a gap too, so a
    federation stuck at its end shows as a stall.
    """
    args = soak.args
    db = soak.data / "run" / "state.sqlite"
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as con:
        rows = con.execute("SELECT round, completed, summary FROM rounds ORDER BY completed").fetchall()
        failed = con.execute("SELECT COUNT(*) FROM events WHERE kind = 'round_failed'").fetchone()[0]
        rollbacks = con.execute("SELECT COUNT(*) FROM events WHERE kind = 'rollback'").fetchone()[0]
        rejected = con.execute("SELECT COUNT(*) FROM events WHERE kind = 'rejected'").fetchone()[0]
        clipped = con.execute("SELECT COUNT(*) FROM events WHERE kind = 'clipped_update'").fetchone()[0]
    times = [started] + [float(t) for _, t, _ in rows] + [ended]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    allowed = args.deadline + args.interval * 2 + GRACE_S  # after the reload the interval is doubled
    waits, stalls = [], 0
    for a, b in itertools.pairwise(times[1:]):  # from the first completed round on (the start is set-up)
        anchor = max([a, *(t for t in soak.recoveries if a < t < b)])
        waits.append(b - anchor)
        stalls += b - anchor > allowed
    pers, updates, stale = [], 0, 0
    for _, _, summary in rows:
        rec = json.loads(summary)
        p = rec.get("personalisation") or {}
        pers.append(float(p.get("macro_f1", math.nan)))
        updates += int(rec.get("updates", 0))
        stale += len(rec.get("stale", {}))
    warm = min(20, len(pers) // 5)
    after = [f for f in pers[warm:] if not math.isnan(f)]
    size = sum(f.stat().st_size for f in soak.data.rglob("*") if f.is_file())
    scale = 100.0 if pers and max(abs(x) for x in pers if not math.isnan(x)) <= 1.0 else 1.0
    return {
        "rounds_completed": len(rows),
        "longest_gap_s": round(max(gaps[1:], default=math.nan), 1),
        "longest_wait_after_fault_s": round(max(waits, default=math.nan), 1),
        "deadline_s": args.deadline,
        "stall_limit_s": allowed,
        "oversized_counted": soak.oversized_counted(),
        "oversized_clipped": soak.oversized_clipped(),
        "clipped_updates": clipped,
        "rollbacks": rollbacks,
        "rejected_updates": rejected,
        "rounds_without_quorum": failed,
        "pers_f1_final": round(pers[-1] * scale, 1) if pers else math.nan,
        "pers_f1_worst": round(min(after) * scale, 1) if after else math.nan,
        "pers_f1_mean": round(sum(after) / len(after) * scale, 1) if after else math.nan,
        "updates_per_min": round(updates / max(1e-9, (ended - started) / 60), 1),
        "stale_updates": stale,
        "warmup_rounds": warm,
        "coordinator_peak_rss_mib": round(soak.peak_rss_kib / 1024, 1),
        "data_mib": round(size / 2**20, 1),
        "wall_min": round((time.time() - started) / 60, 1),
        "stalls": stalls,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="fedhar-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    soak = Soak(out, args)
    rng = random.Random(args.seed)
    soak.next_subject = rng.randint(1, 30)
    soak.broker = configure(out / "mqtt", FED, ["spare"])
    soak.data.mkdir(exist_ok=True)
    (soak.data / "server.toml").write_text(settings(args.deadline, args.interval, soak.broker.out, args.buffer_size))
    soak.start_broker()
    plan = fixed_plan(args.rounds, [f for f in args.faults.split(",") if f])
    try:
        for _ in range(args.devices_start):
            soak.start_device(soak.enrol())
        soak.start_serve()
        started = time.time()
        soak.note(f"serve started with {args.devices_start} devices; plan {plan}")
        done_marks: set[int] = set()
        last = -1
        end = time.monotonic() + args.max_minutes * 60
        while time.monotonic() < end:
            time.sleep(0.25)
            soak.thaw_due()
            soak.connects_due()
            soak.sample_rss()
            n = soak.completed()
            if soak.serve_proc is not None and soak.serve_proc.poll() is not None:
                raise RuntimeError(f"serve exited {soak.serve_proc.returncode}; see {out / 'serve.log'}")
            if n >= args.rounds and len(done_marks) == len(plan) and not soak.oversized_on:
                break
            if n == last:
                continue
            last = n
            log = out / "logs" / "dev-oversized.log"
            if soak.oversized_on and soak.oversized_until is None and log not in soak.pending:
                soak.oversized_until = n + 3 * args.oversized_rounds  # counted from its connection: a start takes seconds
            if (
                soak.oversized_on
                and soak.oversized_until is not None
                and (n >= soak.oversized_until or soak.oversized_counted() >= args.oversized_rounds)
            ):
                for dev in soak.devices.values():
                    if dev.oversized and dev.on:
                        soak.stop_device(dev)
                        soak.recoveries.append(time.time())
                        soak.note(f"{dev.name} leaves")
                soak.oversized_on = False
            for mark in sorted(plan):
                if n >= mark and mark not in done_marks:
                    done_marks.add(mark)
                    for what in plan[mark]:
                        fixed_fault(soak, what)
            if args.churn_every and n > 0 and n % args.churn_every == 0:
                churn(soak, rng)
        else:
            soak.note(f"--max-minutes {args.max_minutes} reached")
        soak.sample_rss()
        soak.thaw_due()
        ended = time.time()
    finally:
        if soak.serve_proc is not None:
            stop_process(soak.serve_proc, grace_s=60)  # SIGTERM, as systemd stops it (a background job ignores SIGINT)
        for dev in soak.devices.values():
            soak.stop_device(dev)
        if soak.broker_proc is not None:
            stop_process(soak.broker_proc)
    return figures(soak, started, ended)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--rounds",
        type=int,
        default=300,
        help="completed rounds to run, at least: the run goes on until the plan's faults are done (default %(default)s)",
    )
    ap.add_argument("--seed", type=int, default=1, help="seed of the device plan (default %(default)s)")
    ap.add_argument("--devices-max", type=int, default=8, help="most devices on at once, 2 to 8 (default %(default)s)")
    ap.add_argument("--devices-start", type=int, default=3, help="devices at the start (default %(default)s)")
    ap.add_argument("--out", default=None, help="folder for the data folder, broker and logs (default a new temporary folder)")
    ap.add_argument("--deadline", type=float, default=20.0, help="round_timeout_s, seconds (default %(default)s)")
    ap.add_argument("--interval", type=float, default=0.5, help="[schedule] min_round_interval_s, seconds (default %(default)s)")
    ap.add_argument("--faults", default=",".join(FAULTS), help=f"fixed faults, comma-separated from {','.join(FAULTS)} (default all)")
    ap.add_argument(
        "--churn-every", type=int, default=6, help="a random device action every N completed rounds; 0: none (default %(default)s)"
    )
    ap.add_argument(
        "--oversized-rounds",
        type=int,
        default=10,
        help="the oversized device leaves once this many of its updates were counted (default %(default)s)",
    )
    ap.add_argument("--buffer-size", type=int, default=0,
                    help="K of buffered rounds (FedBuff, coordinator/rounds/buffered.py); 0: synchronous rounds (default %(default)s)")
    ap.add_argument("--max-minutes", type=float, default=120.0, help="stop after this long whatever the rounds (default %(default)s)")
    args = ap.parse_args(argv)
    if not 2 <= args.devices_max <= 8 or not 2 <= args.devices_start <= args.devices_max:
        ap.error("--devices-max must be in 2..8 and --devices-start in 2..--devices-max")
    unknown = set(args.faults.split(",")) - set(FAULTS) - {""}
    if unknown:
        ap.error(f"--faults: unknown {sorted(unknown)}; choose from {','.join(FAULTS)}")
    got = run(args)
    print(" ".join(f"{k}={v}" for k, v in got.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
