"""The coordinator's memory under a junk upload (issue 37 item 2): a 1 GiB body at a signed upload URL, then notices.

The folder blob store and its HTTP server run in this process, as in ``fedhar-coordinator run``; ``curl`` in another
process streams 1 GiB of zeros to a grant sized for the small CNN's update (the store cuts it at the grant's size and
closes the connection), then a notice that announces 1 GiB and one for a slot holding junk within the bound are read
by the blob carrier's cheapest-checks-first reader. A thread samples this process's RSS every 5 ms throughout.

The last line is ``junk_upload_rss_delta_mb=<peak RSS during the uploads minus RSS before, MB>`` (the goal: within 20).
Baseline: the RSS measured in the same process just before the uploads.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coordinator.transport import Refused, update_bound  # noqa: E402
from coordinator.transport.blobs import read_noticed  # noqa: E402
from coordinator.transport.folder_store import BlobServer, FolderBlobStore  # noqa: E402
from har_io.blobs import upload_slot  # noqa: E402
from har_models.nn.arch import ArchSpec  # noqa: E402
from har_models.wire.blob_messages import BlobNotice  # noqa: E402


class Peak:
    """This process's peak RSS (bytes) while it runs, sampled every ``every_s`` seconds."""

    def __init__(self, every_s: float = 0.005):
        self.proc, self.every_s, self.peak = psutil.Process(), every_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.every_s)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--junk-mb", type=int, default=1024, help="size of the junk body (default %(default)s MB)")
    args = ap.parse_args(argv)
    if shutil.which("curl") is None:
        print("this benchmark streams the junk with curl: apt-get install curl", file=sys.stderr)
        return 2
    spec = ArchSpec(n_classes=6, conv_filters=16, dense_units=32)
    limit = update_bound(spec, guidance=False)
    with tempfile.TemporaryDirectory() as tmp:
        store = FolderBlobStore(Path(tmp) / "blobs", "", b"k" * 32)
        server = BlobServer(store)
        server.start()
        try:
            slot = upload_slot("run", 3, 0, "junk")
            store.accept({slot.rsplit("/", 1)[0] + "/"})
            url = store.upload_url(slot, time.time() + 600, limit)
            rss0 = psutil.Process().memory_info().rss
            t0 = time.monotonic()
            with Peak() as peak:
                junk = subprocess.Popen(["head", "-c", str(args.junk_mb << 20), "/dev/zero"], stdout=subprocess.PIPE)
                curl = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-T", "-", "-H",
                                       "Content-Type: application/octet-stream", url], stdin=junk.stdout,
                                      capture_output=True, text=True, timeout=600)  # fmt: skip
                junk.kill()
                took = time.monotonic() - t0
                refusals = []
                for size in (args.junk_mb << 20, min(limit, 4096)):
                    if size <= limit:  # a slot holding junk within the bound: refused after its first bytes
                        (store.folder / slot).parent.mkdir(parents=True, exist_ok=True)
                        (store.folder / slot).write_bytes(b"\0" * size)
                    notice = BlobNotice("run", 3, 0, hashlib.sha256(b"x").hexdigest(), size)
                    try:
                        read_noticed(store, "junk", notice, limit)
                    except Refused as exc:
                        refusals.append(exc.reason)
        finally:
            server.stop()
    print(f"a {args.junk_mb} MB junk body to a grant of {limit} bytes: HTTP {curl.stdout or curl.returncode} after {took:.1f} s; "
          f"notices refused as {', '.join(refusals)}")
    print(f"RSS before {rss0 / 1e6:.1f} MB, peak during {peak.peak / 1e6:.1f} MB")
    print(f"junk_upload_rss_delta_mb={(peak.peak - rss0) / 1e6:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
