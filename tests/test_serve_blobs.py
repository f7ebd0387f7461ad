"""``fedhar-coordinator serve`` with the blob transport: the status page's web server serves the folder store.

Devices fetch models from and upload updates to ``/blobs/`` on the page's port with the URLs the
coordinator signed, while the page itself still asks for its token (docs/scale.md, "Blob transport").
"""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from support.registry_views import kept_versions
from support.small_federation import processes, wait_for
from test_serve import _client, _serve, _settings

from coordinator.server.registry import Registry
from simulation.broker import free_port

TOKEN = "blob-test-token-0123456789"


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.slow
def test_serve_hands_out_models_and_takes_updates_through_its_page_server(tmp_path: Path, mosquitto: int) -> None:
    data = tmp_path / "data"
    page = free_port()
    _settings(data, 'transport = "blobs"', http_port=page)
    toml = data / "server.toml"
    toml.write_text(toml.read_text().replace("[server]\n", f'[server]\ntoken = "{TOKEN}"\n'))
    reg = Registry(data)
    for cid in ("dev-a", "dev-b"):
        reg.enrol(cid, None)
    reg.close()
    serve_log, logs = tmp_path / "serve.log", [tmp_path / "serve.log", tmp_path / "a.log", tmp_path / "b.log"]
    with processes() as procs:
        procs.append(_client("dev-a", 1, tmp_path / "sa", mosquitto, logs[1]))
        procs.append(_client("dev-b", 2, tmp_path / "sb", mosquitto, logs[2]))
        server = _serve(data, mosquitto, serve_log)
        procs.append(server)
        wait_for(lambda: len(kept_versions(data)) >= 2, 240, "two model versions", logs)
        base = f"http://127.0.0.1:{page}"
        assert f"served at {base}/blobs/" in serve_log.read_text()
        objects = list((data / "run" / "blobs" / "objects").iterdir())
        assert objects, "no model object in the store"
        # The page asks for its token; the store asks for the coordinator's signature instead, token or not.
        assert _status(f"{base}/api/devices") == 401
        assert _status(f"{base}/api/devices?token={TOKEN}") == 200
        assert _status(f"{base}/blobs/objects/{objects[0].name}") == 403
        assert _status(f"{base}/blobs/objects/{objects[0].name}?token={TOKEN}") == 403
        server.send_signal(signal.SIGINT)
        assert server.wait(60) == 130
    report = json.loads((data / "run" / "report.json").read_text())
    assert report["config"]["transport"]["kind"] == "blobs"
    assert all(r["updates"] == 2 and r["rejected"] == 0 for r in report["rounds"]) and len(report["rounds"]) >= 2
    for log in logs[1:]:
        assert "the coordinator confirmed the update" in log.read_text()
