"""The Raspberry Pi path on an emulated arm64 board booted with systemd (firmware_scripts/pi_emulated/).

One test walks what an operator does, on a Debian bookworm arm64 root file system booted by
``systemd-nspawn --boot`` under qemu-user-static (an ephemeral copy, so every run starts from a
fresh board), against this host's Mosquitto over TLS with per-device accounts:

0. the unit copied by hand before any setup fails with 203 (no program) and stays failed;
1. as README.md ("The home server", step 4) and docs/devices.md tell it: ``fedhar-coordinator
   enrol pi-board`` on the host (its Mosquitto's accounts, reloaded) writes the enrolment bundle,
   and ``pi_setup.sh --enrolment pi-board.json --wheelhouse`` installs offline from it (client id,
   broker, federation, password and CA all from the bundle); scipy is in neither the wheelhouse
   nor the service's venv (no device program needs it); the unit starts and, with nothing
   recorded yet, fails with exit 3 and stays failed (no restart loop);
2. ``fedhar-record`` records two activities from a replayed HAPT session as user ``fedhar``;
3. the restarted unit (``--source recorded:hapt6``, numpy backend) trains 2 rounds next to an
   x86-64 client on the host; the host's coordinator counts both updates in each round;
4. under the board's systemd, a non-retryable exit leaves its unit failed with no restart: a
   missing module (7, client and coordinator), as nothing to train on (3) did in step 1 and
   no program (203) before the setup (step 0);
5. the MPU-6050 driver's emulated-bus tests pass on arm64;
6. ``pi_setup.sh`` again converges (same env file, unit active); ``--uninstall --purge`` removes it.

Under qemu-user systemd cannot mount a unit's credentials (LoadCredential=), so board.sh adds
drop-ins that hand over the same password file (the one pi_setup.sh wrote from the bundle) from
ExecStartPre (see board.sh); the 243 exit of
a missing password file is therefore not checked here, nor 217 (no user fedhar): with the
drop-in, the privileged ExecStartPre fails first, and RestartPreventExitStatus= applies to the
main process only. Needs root, debootstrap,
qemu-user-static, systemd-container, mosquitto, openssl, and the first time the Debian archive
and PyPI (the root file system and the wheelhouse are cached under ~/.cache/fedhar). Skipped
when they are missing, unless FEDHAR_REQUIRE_BOARD=1, and skipped unless FEDHAR_BOARD=1: it does
not run in .ci/run, whose reduced form is test_pi_setup.py, test_pi_headless.py and
test_systemd_units.py. Each step and its output go to a
transcript: FEDHAR_BOARD_TRANSCRIPT (docs/board-run.txt holds one run).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from simulation.broker import free_ports, stop_process, wait_for_port

ROOT = Path(__file__).resolve().parents[1]
BOARD = ROOT / "firmware_scripts" / "pi_emulated" / "board.sh"
WHEELHOUSE_SH = ROOT / "firmware_scripts" / "pi_emulated" / "wheelhouse.sh"
CACHE = Path(os.environ.get("FEDHAR_BOARD_CACHE", Path.home() / ".cache" / "fedhar"))
BOARD_ROOT = Path(os.environ.get("FEDHAR_BOARD_ROOT", CACHE / "pi-rootfs"))
WHEELHOUSE = CACHE / "wheelhouse-aarch64"
FED = "board"
COORDINATOR = "fedhar-board-host"
PI = "pi-board"
X86 = "x86-01"

pytestmark = pytest.mark.slow


def _missing() -> list[str]:
    need = {"debootstrap": "debootstrap", "systemd-nspawn": "systemd-container", "nsenter": "util-linux"}
    need |= {"mosquitto": "mosquitto", "mosquitto_passwd": "mosquitto", "openssl": "openssl"}
    if os.uname().machine != "aarch64":
        need["qemu-aarch64-static"] = "qemu-user-static"
    found = [n for n in need if shutil.which(n) or os.access(f"/usr/sbin/{n}", os.X_OK)]
    out = [f"{n} ({need[n]})" for n in need if n not in found]
    if os.geteuid() != 0:
        out.append("root")
    return out


class Transcript:
    """Each command, its exit status, seconds and output, appended to a text file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# tests/test_pi_board.py, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, host {os.uname().machine}\n")

    def note(self, text: str) -> None:
        with open(self.path, "a") as f:
            f.write(f"\n## {text}\n")

    def run(
        self, cmd: list[str], timeout: float, check: bool = True, show: str | None = None, secret_qr: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd``; with ``secret_qr`` the QR code it prints (it holds a password) is left out of the transcript."""
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        took = time.monotonic() - t0
        out = (r.stdout + r.stderr).rstrip()
        if secret_qr:
            kept = [ln for ln in out.splitlines() if not set(ln) <= set(" \u2580\u2584\u2588")]
            gone = len(out.splitlines()) - len(kept)
            out = "\n".join([f"[the QR code, {gone} lines, left out here: it holds the device's password]", *kept])
        with open(self.path, "a") as f:
            f.write(f"\n$ {show or ' '.join(cmd)}\n{out}\n[exit {r.returncode}, {took:.1f} s]\n")
        if check:
            assert r.returncode == 0, f"{show or cmd}: exit {r.returncode}\n{out[-4000:]}"
        return r


class Board:
    """The booted board: run shell commands in it (board.sh exec)."""

    def __init__(self, t: Transcript) -> None:
        self.t = t

    def sh(self, script: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = ["bash", str(BOARD), "exec", "--root", str(BOARD_ROOT), "--", "/bin/bash", "-c", script]
        return self.t.run(cmd, timeout, check, show=f"[board] {script}")

    def unit(self, name: str) -> dict[str, str]:
        r = self.sh(f"systemctl show -p ActiveState,Result,ExecMainStatus,NRestarts {name}")
        return dict(ln.split("=", 1) for ln in r.stdout.splitlines() if "=" in ln)

    def wait_unit(self, name: str, want: str, timeout_s: float) -> dict[str, str]:
        end = time.monotonic() + timeout_s
        while True:
            props = self.unit(name)
            if props["ActiveState"] == want or time.monotonic() > end:
                return props
            time.sleep(3)


@pytest.fixture
def transcript(tmp_path: Path) -> Transcript:
    return Transcript(Path(os.environ.get("FEDHAR_BOARD_TRANSCRIPT", tmp_path / "board-transcript.txt")).resolve())


def _certificates(d: Path, t: Transcript) -> None:
    d.mkdir()

    def openssl(*args: str) -> None:
        t.run(["openssl", *args], 120, show="openssl " + " ".join(args))

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", "/CN=fedhar board CA",
            "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"))  # fmt: skip
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", str(d / "server.key"), "-out", str(d / "server.csr")
    )
    (d / "ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nkeyUsage=critical,digitalSignature,keyEncipherment\n")
    openssl("x509", "-req", "-in", str(d / "server.csr"), "-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key"), "-CAcreateserial",
            "-days", "30", "-extfile", str(d / "ext"), "-out", str(d / "server.crt"))  # fmt: skip


@pytest.fixture
def booted(tmp_path: Path, transcript: Transcript) -> Iterator[Board]:
    if os.environ.get("FEDHAR_BOARD") != "1" and os.environ.get("FEDHAR_REQUIRE_BOARD") != "1":
        pytest.skip("the emulated board runs on request: FEDHAR_BOARD=1 (minutes; building the board once takes longer)")
    missing = _missing()
    if missing:
        if os.environ.get("FEDHAR_REQUIRE_BOARD") == "1":
            pytest.fail(f"the emulated board needs {', '.join(missing)} (FEDHAR_REQUIRE_BOARD=1)")
        pytest.skip(f"the emulated board needs {', '.join(missing)}")
    t = transcript
    t.note("the board's root file system (cached after the first build) and the aarch64 wheelhouse")
    t.run(["bash", str(BOARD), "build", "--root", str(BOARD_ROOT)], 3600)
    if not any(WHEELHOUSE.glob("numpy-*.whl")):
        pip = str(Path(sys.executable).with_name("pip"))
        t.run(["env", f"PIP={pip}", "bash", str(WHEELHOUSE_SH), str(WHEELHOUSE), "--test"], 1800)
    t.note("boot an ephemeral copy with systemd as PID 1")
    host = tmp_path / "host"
    host.mkdir()
    t.run(["bash", str(BOARD), "boot", "--root", str(BOARD_ROOT), "--ephemeral",
           "--bind-ro", f"{WHEELHOUSE}:/mnt/wheelhouse", "--bind-ro", f"{host}:/mnt/host"], 600)  # fmt: skip
    board = Board(t)
    board.host = host  # type: ignore[attr-defined]
    try:
        board.sh("uname -m; cat /etc/fedhar-board /etc/debian_version; systemctl --version | head -1; python3 --version")
        yield board
    finally:
        board.sh("journalctl -b --no-pager -u 'fedhar-*' | tail -n 80", check=False)
        t.run(["bash", str(BOARD), "stop", "--root", str(BOARD_ROOT)], 300, check=False)


def test_the_pi_path_on_a_booted_arm64_board(booted: Board, tmp_path: Path, transcript: Transcript) -> None:
    t, b = transcript, booted
    host: Path = b.host  # type: ignore[attr-defined]
    assert b.sh("uname -m").stdout.strip() == "aarch64"

    t.note("the host's Mosquitto: TLS on loopback, one account per device (mosquitto_config.py)")
    _certificates(tmp_path / "tls", t)
    out, (port, tls_port) = tmp_path / "broker", free_ports(2)
    t.run([sys.executable, str(ROOT / "firmware_scripts" / "mosquitto_config.py"), "--out", str(out), "--federation", FED,
           "--clients", f"{X86},pi-nomod", "--port", str(port), "--tls-port", str(tls_port), "--tls-bind", "127.0.0.1",
           "--public-host", "127.0.0.1",
           "--broker-user", "root", "--tls-cert", str(tmp_path / "tls" / "server.crt"),
           "--tls-key", str(tmp_path / "tls" / "server.key"), "--tls-ca", str(tmp_path / "tls" / "ca.crt")], 120)  # fmt: skip
    shutil.copy(out / "credentials" / "pi-nomod.password", host / "pi-nomod.password")
    procs: list[subprocess.Popen[bytes]] = []
    mlog = open(tmp_path / "mosquitto.log", "wb")  # noqa: SIM115 - closed in finally
    procs.append(subprocess.Popen([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(out / "mosquitto.conf")],
                                  stdout=mlog, stderr=subprocess.STDOUT))  # fmt: skip
    try:
        assert wait_for_port("127.0.0.1", tls_port, 10) and wait_for_port("127.0.0.1", port, 10)

        t.note("0. before the setup, the unit as copied by hand: no program in /opt/fedhar (203), no restart")
        b.sh("useradd --system --home-dir /nonexistent --shell /usr/sbin/nologin fedhar && "
             "install -d /etc/fedhar && install -m 600 /mnt/host/pi-nomod.password /etc/fedhar/pi-early.password && "
             "printf 'FEDHAR_BROKER=127.0.0.1:1\\nFEDHAR_FEDERATION=x\\nFEDHAR_SOURCE=recorded:hapt6\\nFEDHAR_CLIENT_ARGS=\\n' "
             "> /etc/fedhar/client-pi-early.env && install -m 644 /mnt/fedhar/firmware_scripts/systemd/fedhar-client@.service "
             "/etc/systemd/system/ && systemctl daemon-reload && { systemctl start fedhar-client@pi-early || true; }")  # fmt: skip
        time.sleep(20)  # longer than RestartSec=15
        props = b.unit("fedhar-client@pi-early")
        assert (props["ActiveState"], props["ExecMainStatus"], props["NRestarts"]) == ("failed", "203", "0"), props
        b.sh("journalctl --no-pager -u fedhar-client@pi-early | grep -E 'Failed at step|Main process exited'")
        b.sh("/mnt/fedhar/firmware_scripts/pi_setup.sh --client-id pi-early --uninstall --purge")

        t.note("1. fedhar-coordinator enrol on the host; pi_setup.sh --enrolment on the board (no scipy); nothing recorded yet: exit 3")
        data = tmp_path / "server-data"
        data.mkdir()
        (data / "server.toml").write_text(f'[server]\nname = "{COORDINATOR}"\nbroker_dir = "{out}"\n')
        console = Path(sys.executable).with_name("fedhar-coordinator")
        enrol = [str(console)] if console.exists() else [sys.executable, "-m", "coordinator.cli"]
        r = t.run([*enrol, "enrol", PI, "--owner", "board", "--data", str(data)], 120, secret_qr=True)
        assert f"{PI} enrolled." in r.stdout
        bundle = json.loads((data / "enrolment" / f"{PI}.json").read_text())
        assert (bundle["coordinator"], bundle["federation"], bundle["client_id"]) == (COORDINATOR, FED, PI)
        assert (bundle["host"], bundle["port"]) == ("127.0.0.1", tls_port)
        assert bundle["tls_ca_pem"].strip() == (tmp_path / "tls" / "ca.crt").read_text().strip()
        shutil.copy(data / "enrolment" / f"{PI}.json", host / f"{PI}.json")  # what an operator copies to the Pi
        setup = f"/mnt/fedhar/firmware_scripts/pi_setup.sh --enrolment /mnt/host/{PI}.json --wheelhouse /mnt/wheelhouse"
        r = b.sh(setup, timeout=1800)
        assert f"enrolment bundle /mnt/host/{PI}.json: client {PI} of federation {FED} (coordinator {COORDINATOR}), " \
               f"broker 127.0.0.1:{tls_port}" in r.stdout  # fmt: skip
        # The bundle's password and CA, installed for the unit (root, 0600 for the password); the password never shown.
        files = b.sh(f"stat -c '%a %U %n' /etc/fedhar/{PI}.password /etc/fedhar/{PI}.ca.crt && "
                     f"sha256sum /etc/fedhar/{PI}.password && cat /etc/fedhar/{PI}.ca.crt").stdout  # fmt: skip
        assert f"600 root /etc/fedhar/{PI}.password" in files and f"644 root /etc/fedhar/{PI}.ca.crt" in files
        assert hashlib.sha256(bundle["password"].encode()).hexdigest() + f"  /etc/fedhar/{PI}.password" in files
        assert bundle["tls_ca_pem"].strip() in files
        # No scipy: none in the wheelhouse, none in the service's venv, yet the setup's own check passed.
        r = b.sh("ls /mnt/wheelhouse | grep -ic scipy; /opt/fedhar/.venv/bin/python -c 'import scipy'", check=False)
        assert r.returncode == 1 and r.stdout.strip() == "0" and "ModuleNotFoundError: No module named 'scipy'" in r.stderr, r
        env_first = b.sh(f"cat /etc/fedhar/client-{PI}.env").stdout
        assert f"FEDHAR_BROKER=127.0.0.1:{tls_port}\nFEDHAR_FEDERATION={FED}\n" in env_first
        assert f"FEDHAR_CLIENT_ARGS=--tls-ca /etc/fedhar/{PI}.ca.crt --backend numpy" in env_first
        props = b.wait_unit(f"fedhar-client@{PI}", "failed", 300)
        time.sleep(20)  # longer than RestartSec=15: a restart would have happened by now
        props = b.unit(f"fedhar-client@{PI}")
        assert (props["ActiveState"], props["ExecMainStatus"], props["NRestarts"]) == ("failed", "3", "0"), props

        t.note("2. fedhar-record as the service account, from a replayed HAPT session")
        replay = "replay:hapt:/opt/fedhar/datasets/hapt/user01.npz"
        for activity in ("walking", "sitting"):
            r = b.sh(f"runuser -u fedhar -- /opt/fedhar/.venv/bin/fedhar-record --state-dir /var/lib/fedhar/{PI} "
                     f"--sensor {replay} --replay-speed 50 --seconds 6 --activity {activity}", timeout=600)  # fmt: skip
            assert f"{activity}: " in r.stdout and " new windows" in r.stdout

        t.note("3. the host's coordinator and an x86-64 client; the board's unit restarted on its recorded windows")
        run_dir = tmp_path / "run"
        coord = [sys.executable, "-m", "coordinator.cli", "--broker", f"127.0.0.1:{port}", "--federation", FED,
                 "--username", "coordinator", "--password-file", str(out / "credentials" / "coordinator.password"),
                 "--run-dir", str(run_dir), "--run-id", FED, "--rounds", "2", "--min-clients", "2", "--expected-clients", "2",
                 "--conv-filters", "8", "--dense-units", "32", "--no-progress",
                 "--round-timeout", "1500", "--start-timeout", "900"]  # fmt: skip
        x86 = [sys.executable, "-m", "edge_client.cli", "--client-id", X86, "--broker", f"127.0.0.1:{tls_port}", "--federation", FED,
               "--username", X86, "--password-file", str(out / "credentials" / f"{X86}.password"),
               "--tls-ca", str(tmp_path / "tls" / "ca.crt"), "--source", f"hapt:{ROOT / 'datasets/hapt/user02.npz'}",
               "--state-dir", str(tmp_path / "x86-state"), "--backend", "torch",
               "--exit-after-run", FED, "--max-seconds", "3000"]  # fmt: skip
        clog, xlog = open(tmp_path / "coordinator.log", "wb"), open(tmp_path / "x86.log", "wb")  # noqa: SIM115
        procs.append(subprocess.Popen(coord, cwd=ROOT, stdout=clog, stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen(x86, cwd=ROOT, stdout=xlog, stderr=subprocess.STDOUT))
        t0 = time.monotonic()
        b.sh(f"systemctl restart fedhar-client@{PI}")
        props = b.wait_unit(f"fedhar-client@{PI}", "active", 120)
        assert props["ActiveState"] == "active", props
        b.sh(f"systemctl status --no-pager -n 5 fedhar-client@{PI}", check=False)
        rc = procs[1].wait(3000)
        rounds_s = time.monotonic() - t0
        coordinator_log = (tmp_path / "coordinator.log").read_text()
        with open(t.path, "a") as f:
            f.write(
                f"\n$ fedhar-coordinator (host) ...\n{coordinator_log.rstrip()}\n[exit {rc}, {rounds_s:.1f} s from the unit's restart]\n"
            )
        assert rc == 0, coordinator_log[-3000:]
        assert procs[2].wait(120) == 0, (tmp_path / "x86.log").read_text()[-3000:]
        report = json.loads((run_dir / "report.json").read_text())
        assert [(r["round"], r["selected"], r["updates"], r["missing"]) for r in report["rounds"]] == [(0, 2, 2, []), (1, 2, 2, [])]
        journal = b.sh(f"journalctl --no-pager -u fedhar-client@{PI} | tail -n 40").stdout
        assert f"[{PI}]" in journal and "recorded:hapt6" in journal
        props = b.unit(f"fedhar-client@{PI}")
        assert props["ActiveState"] == "active" and props["NRestarts"] == "0", props  # it waits for the next run
        b.sh(f"systemctl status --no-pager -n 0 fedhar-client@{PI}", check=False)
        # The client's peak resident set after 2 rounds (qemu's own memory included), for docs/devices.md.
        b.sh(f"grep -E 'VmHWM|VmRSS' /proc/$(systemctl show -p MainPID --value fedhar-client@{PI})/status", check=False)

        t.note("4. non-retryable exits under the board's systemd: a missing module (7), client and coordinator")
        b.sh(f"install -m 600 /mnt/host/pi-nomod.password /etc/fedhar/pi-nomod.password && "
             f"sed 's/--backend numpy/--backend torch --threads 2/' /etc/fedhar/client-{PI}.env > /etc/fedhar/client-pi-nomod.env && "
             "systemctl start fedhar-client@pi-nomod || true")  # fmt: skip
        b.sh("install -m 644 /mnt/fedhar/firmware_scripts/systemd/fedhar-coordinator.service /etc/systemd/system/ && "
             "sed 's/^FEDHAR_RUN_ID=.*/FEDHAR_RUN_ID=board/' /mnt/fedhar/firmware_scripts/systemd/coordinator.env.example "
             "> /etc/fedhar/coordinator.env && echo unused > /etc/fedhar/coordinator.password && "
             "chmod 600 /etc/fedhar/coordinator.password && "
             "systemctl daemon-reload && systemctl start fedhar-coordinator || true")  # fmt: skip
        time.sleep(25)  # RestartSec is 15 s (client) and 30 s (coordinator): give the client's a chance to fire
        for unit, status in (("fedhar-client@pi-nomod", "7"), ("fedhar-coordinator", "7")):
            props = b.wait_unit(unit, "failed", 120)
            assert (props["ActiveState"], props["ExecMainStatus"], props["NRestarts"]) == ("failed", status, "0"), (unit, props)
        b.sh("journalctl --no-pager -u fedhar-client@pi-nomod -u fedhar-coordinator | grep -E 'is not installed|Main process exited'")
        time.sleep(10)
        assert b.unit("fedhar-coordinator")["NRestarts"] == "0"

        t.note("5. the MPU-6050 driver's tests against the emulated register map, on arm64")
        b.sh("/opt/fedhar/.venv/bin/pip install -q --no-index --find-links /mnt/wheelhouse pytest && cd /opt/fedhar && "
             "/opt/fedhar/.venv/bin/python -c 'import platform; print(platform.machine(), platform.python_version())' && "
             "/opt/fedhar/.venv/bin/python -m pytest -q -p no:cacheprovider tests/test_mpu6050.py", timeout=1200)  # fmt: skip

        t.note("6. pi_setup.sh again converges; --uninstall removes the instances, then everything")
        b.sh(setup, timeout=1800)
        assert b.sh(f"cat /etc/fedhar/client-{PI}.env").stdout == env_first
        assert b.wait_unit(f"fedhar-client@{PI}", "active", 120)["ActiveState"] == "active"
        b.sh("systemctl disable --now fedhar-coordinator; rm -f /etc/systemd/system/fedhar-coordinator.service "
             "/etc/fedhar/coordinator.env /etc/fedhar/coordinator.password")  # fmt: skip
        b.sh("/mnt/fedhar/firmware_scripts/pi_setup.sh --client-id pi-nomod --uninstall --purge")
        assert b.sh("test -d /opt/fedhar && test -f /etc/systemd/system/fedhar-client@.service", check=False).returncode == 0
        b.sh(f"/mnt/fedhar/firmware_scripts/pi_setup.sh --client-id {PI} --uninstall --purge")
        left = b.sh("ls /opt/fedhar /etc/fedhar /etc/systemd/system/fedhar-client@.service /var/lib/fedhar/pi-board 2>&1; id fedhar 2>&1",
                    check=False).stdout  # fmt: skip
        assert left.count("No such file or directory") == 4 and "no such user" in left, left
    finally:
        for p in reversed(procs):
            stop_process(p)
        mlog.close()
