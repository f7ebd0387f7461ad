"""The console scripts as a user installs them: a fresh venv per role with only that role's extra.

Each venv gets ``pip install '<checkout>[extra]'`` (a real, non-editable install) and the tests
run its ``bin/fedhar-*`` from a folder outside the checkout, so a dependency missing from an
extra fails here and not on a device:

* ``[pi]``: a Raspberry Pi with the numpy backend (no PyTorch);
* ``[client]``: a device with the PyTorch backend;
* ``[coordinator]``: the home server.

pip's own configuration decides where the wheels come from (PyPI, or a local mirror); the CPU
build of PyTorch comes from https://download.pytorch.org/whl/cpu when configured so. Slow: each
venv installs numpy and scipy, two of them PyTorch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulation.broker import stop_process

ROOT = Path(__file__).resolve().parents[1]
HAPT = ROOT / "datasets" / "hapt"

pytestmark = pytest.mark.slow


def _venv(base: Path, extra: str) -> Path:
    """A venv in ``base`` with ``fedhar[extra]`` installed from this checkout; its ``bin`` folder."""
    subprocess.run([sys.executable, "-m", "venv", str(base)], check=True, timeout=300)
    r = subprocess.run(
        [str(base / "bin" / "pip"), "install", "-q", f"{ROOT}[{extra}]"], capture_output=True, text=True, timeout=1500, cwd=base
    )
    assert r.returncode == 0, f"pip install fedhar[{extra}] failed:\n{r.stderr[-3000:]}"
    return base / "bin"


@pytest.fixture(scope="session")
def pi_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _venv(tmp_path_factory.mktemp("venv-pi"), "pi")


@pytest.fixture(scope="session")
def client_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _venv(tmp_path_factory.mktemp("venv-client"), "client")


@pytest.fixture(scope="session")
def coordinator_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _venv(tmp_path_factory.mktemp("venv-coordinator"), "coordinator")


def _run(cmd: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # A clean environment: nothing of the development venv or the checkout leaks in.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _imports(bin_dir: Path, module: str, cwd: Path) -> bool:
    return _run([str(bin_dir / "python"), "-c", f"import {module}"], cwd).returncode == 0


def test_pi_extra_installs_a_client_without_pytorch(pi_bin: Path, tmp_path: Path) -> None:
    assert not _imports(pi_bin, "torch", tmp_path)  # the extra must not pull a multi-GB torch
    assert not _imports(pi_bin, "scipy", tmp_path)  # the device's resampler ships its filter taps as data
    assert _imports(pi_bin, "smbus2", tmp_path)
    for script in ("fedhar-client", "fedhar-record"):
        r = _run([str(pi_bin / script), "--help"], tmp_path)
        assert r.returncode == 0 and f"usage: {script}" in r.stdout, r.stderr


def test_a_backend_whose_module_is_missing_exits_7_with_the_fix(pi_bin: Path, tmp_path: Path) -> None:
    """Exit 7 is in the unit's RestartPreventExitStatus: the service stays failed instead of restarting forever."""
    cmd = [str(pi_bin / "fedhar-client"), "--client-id", "pi-x", "--source", f"hapt:{HAPT / 'user01.npz'}"]
    cmd += ["--state-dir", str(tmp_path / "state"), "--backend", "torch", "--threads", "2", "--max-seconds", "5"]
    r = _run(cmd, tmp_path)
    assert r.returncode == 7, (r.returncode, r.stderr[-2000:])
    assert "the Python module 'torch' is not installed" in r.stderr and "--backend numpy" in r.stderr
    assert "Traceback" not in r.stderr
    # The coordinator needs its own extra; in a device's venv it says so, with exit 7 too.
    r = _run([str(pi_bin / "fedhar-coordinator"), "--help"], tmp_path)
    assert r.returncode == 7 and "coordinator's extra" in r.stderr and "Traceback" not in r.stderr


def test_client_and_coordinator_extras_run_their_scripts(client_bin: Path, coordinator_bin: Path, tmp_path: Path) -> None:
    assert _imports(client_bin, "torch", tmp_path)
    r = _run([str(client_bin / "fedhar-client"), "--help"], tmp_path)
    assert r.returncode == 0 and "usage: fedhar-client" in r.stdout, r.stderr
    r = _run([str(coordinator_bin / "fedhar-coordinator"), "--help"], tmp_path)
    assert r.returncode == 0 and "usage: fedhar-coordinator" in r.stdout, r.stderr


@pytest.mark.parametrize(("device", "backend"), [("pi", "numpy"), ("client", "torch")])
def test_installed_coordinator_and_device_client_complete_a_round(
    device: str, backend: str, request: pytest.FixtureRequest, coordinator_bin: Path, mosquitto: int, tmp_path: Path
) -> None:
    """The home server's fedhar-coordinator and a device's fedhar-client, each from its own venv, train one round."""
    device_bin: Path = request.getfixturevalue(f"{device}_bin")
    fed = f"inst-{device}"
    coord = [str(coordinator_bin / "fedhar-coordinator"), "--broker", f"127.0.0.1:{mosquitto}", "--federation", fed]
    coord += ["--run-dir", str(tmp_path / "run"), "--run-id", fed, "--rounds", "1", "--min-clients", "1", "--expected-clients", "1"]
    coord += ["--conv-filters", "8", "--dense-units", "32", "--no-progress", "--round-timeout", "240", "--start-timeout", "120"]
    client = [str(device_bin / "fedhar-client"), "--client-id", f"{device}-01", "--broker", f"127.0.0.1:{mosquitto}"]
    client += ["--federation", fed, "--source", f"hapt:{HAPT / 'user01.npz'}", "--state-dir", str(tmp_path / "state")]
    client += ["--backend", backend, "--exit-after-run", fed, "--max-seconds", "300"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    with open(tmp_path / "coordinator.log", "wb") as clog, open(tmp_path / "client.log", "wb") as dlog:
        c = subprocess.Popen(coord, cwd=tmp_path, env=env, stdout=clog, stderr=subprocess.STDOUT)
        d = subprocess.Popen(client, cwd=tmp_path, env=env, stdout=dlog, stderr=subprocess.STDOUT)
        try:
            assert c.wait(300) == 0, (tmp_path / "coordinator.log").read_text()[-3000:]
            assert d.wait(60) == 0, (tmp_path / "client.log").read_text()[-3000:]
        finally:
            stop_process(d)
            stop_process(c)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert [(r["round"], r["updates"], r["selected"]) for r in report["rounds"]] == [(0, 1, 1)]
    assert (tmp_path / "state" / "local_model.safetensors").exists()
