"""Write the upgrade test's fixture: a home server's folders as a previous release leaves them.

The fixture ``tests/fixtures/upgrade-2ffcc27.tar.gz`` was made by this script run with the
code of commit 2ffcc27 (the release before ``backup``, ``restore``, ``reissue``, ``rename`` and
the audit log)::

    git worktree add /tmp/old 2ffcc27
    sed -i 's/"-days", "30"/"-days", "3650"/g' /tmp/old/tests/secured_broker.py
    cd /tmp/old && PYTHONPATH=/tmp/old /path/to/this/tree/.venv/bin/python \\
        /path/to/this/tree/tests/support/make_upgrade_fixture.py --old-tree /tmp/old \\
        --out /path/to/this/tree/tests/fixtures/upgrade-2ffcc27.tar.gz

(the project's venv serves both: ``PYTHONPATH`` makes it import the old code). The ``sed``
gives that release's test broker's CA and server certificate ten years instead of its 30 days,
so the fixture does not expire under the tests (the certificates are the test recipe's, not
what the release writes). It took 30 s on a 2-core machine.

It runs what an operator does, with that release's own commands and test broker
(``tests/secured_broker.py`` of that commit: Mosquitto with TLS, an ACL and one account per
device, the recipe's openssl certificates): ``fedhar-coordinator enroll`` of three devices,
``serve`` with three real ``fedhar-client`` processes (the small CNN, 4 filters and 8 hidden
units), ``revoke`` of one device after it took part, more rounds without it, then SIGINT to
``serve`` as ``systemctl stop`` does. The archive holds ``root/data`` (the data folder),
``root/broker`` (the broker folder) and ``root/pki`` (CA and server certificate), and
``root/made.json`` with the absolute folder the files named when written (the test moves
them elsewhere, as an operator moving a server would) and the broker's ports. Passwords in it
are for tests only.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

FED = "homefed"
DEVICES = ("dev-a", "dev-b", "dev-c")
CONV_FILTERS, DENSE_UNITS = 4, 8


def main(argv: list[str] | None = None) -> int:
    """Make the archive; returns 0, or raises RuntimeError naming the step that failed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-tree", type=Path, required=True, help="checkout of the previous release (commit 2ffcc27)")
    ap.add_argument("--out", type=Path, required=True, help="the .tar.gz to write")
    ap.add_argument("--rounds-after-revoke", type=int, default=2)
    a = ap.parse_args(argv)
    old = a.old_tree.resolve()
    sys.path[:0] = [str(old), str(old / "tests")]
    from secured_broker import secured_mosquitto  # the old release's test broker

    from coordinator.server.registry import Registry

    def newest(data: Path) -> int:
        reg = Registry(data)
        try:
            v = reg.versions()
            return v[-1].version if v else 0
        finally:
            reg.close()

    def took(data: Path, name: str) -> bool:
        reg = Registry(data)
        try:
            return bool(reg.participation(name))
        finally:
            reg.close()

    def cli(*args: str) -> str:
        r = subprocess.run([sys.executable, "-m", "coordinator.cli", *args], capture_output=True, text=True, cwd=old, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"fedhar-coordinator {' '.join(args)} failed: {r.stderr}")
        return r.stdout

    def wait(pred: object, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():  # type: ignore[operator]
                return
            time.sleep(0.5)
        raise RuntimeError(f"timed out waiting for {what}")

    with tempfile.TemporaryDirectory(prefix="fedhar-upgrade-") as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        procs: list[subprocess.Popen[bytes]] = []
        with secured_mosquitto(root, FED, ["spare"]) as b:
            data = root / "data"
            data.mkdir()
            (data / "server.toml").write_text(
                f"conv_filters = {CONV_FILTERS}\ndense_units = {DENSE_UNITS}\nround_timeout_s = 60\nlocal_epochs = 1\n"
                "min_clients = 2\nstatus_refresh_s = 5\n"
                f'[server]\nname = "home-test"\nbroker_dir = "{b.out}"\npublic_host = "127.0.0.1"\nhttp_port = 0\n'
                "keep_versions = 5\n[schedule]\nmin_clients = 2\nmin_round_interval_s = 1\n"
            )
            for name in DEVICES:
                cli("enroll", name, "--owner", "Anna", "--data", str(data))
            try:
                for i, name in enumerate(DEVICES):
                    cmd = [sys.executable, "-m", "edge_client.cli", "--enrolment", str(data / "enrolment" / f"{name}.json"),
                           "--source", f"hapt:{old}/datasets/hapt/user{i + 1:02d}.npz", "--state-dir",
                           str(Path(tmp) / f"s-{name}"), "--threads", "1"]  # fmt: skip
                    procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=old))
                with open(Path(tmp) / "serve.log", "wb") as log:
                    serve = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "serve", "--data", str(data)],
                                             stdout=log, stderr=subprocess.STDOUT, cwd=old)  # fmt: skip
                procs.append(serve)
                wait(lambda: took(data, "dev-c") and newest(data) >= 2, 300, "a round with all three devices")
                cli("revoke", "dev-c", "--data", str(data))
                at = newest(data)
                wait(lambda: newest(data) >= at + a.rounds_after_revoke, 240, "rounds after the revocation")
                serve.send_signal(signal.SIGINT)
                serve.wait(60)
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
                        try:
                            p.wait(20)
                        except subprocess.TimeoutExpired:
                            p.kill()
            made = {"commit": "2ffcc27", "root": str(root), "port": b.port, "tls_port": b.tls_port,
                    "newest_version": newest(data), "devices": list(DEVICES), "revoked": ["dev-c"]}  # fmt: skip
        (root / "made.json").write_text(json.dumps(made, indent=1) + "\n")
        (root / "mosquitto.log").unlink(missing_ok=True)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(a.out, "w:gz") as tar:
            tar.add(root, arcname="root")
    print(f"wrote {a.out} ({a.out.stat().st_size} bytes): {made}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
