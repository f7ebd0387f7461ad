"""What each program's real ``--help`` prints (subprocess), and the app's start-up output.

Every option has a help text; no reST markup or "(default None)" reaches the terminal;
``fedhar-record --activity`` lists the activities; ``fedhar-app`` logs each line once and,
without Kivy, names the extra to install instead of a traceback.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from har_models.data.labels import LABEL_SETS

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = {
    "fedhar-client": "edge_client.cli",
    "fedhar-coordinator": "coordinator.cli",
    "fedhar-simulate": "simulation.simulate",
    "fedhar-study": "simulation.study",
    "fedhar-compare": "simulation.compare",
    "fedhar-record": "edge_client.record_cli",
    "fedhar-app": "edge_client.app.main",
}


def _run(args: list[str], **kw) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100")
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env, **kw)


def _help(program: str) -> str:
    r = _run(["-m", PROGRAMS[program], "--help"])
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def _options_without_help(text: str) -> list[str]:
    """Options whose line in --help has nothing after the flag (and no continuation line)."""
    body = text[text.index("options:") :].split("exit status")[0].splitlines()
    bare = []
    for i, line in enumerate(body):
        m = re.match(r"^  (-{1,2}[\w-]+)(?: [A-Z_.{}, -]+)?$", line.rstrip())
        nxt = body[i + 1] if i + 1 < len(body) else ""
        if m and not nxt.startswith(" " * 10):
            bare.append(m.group(1))
    return bare


@pytest.mark.slow
@pytest.mark.parametrize("program", ["fedhar-client", "fedhar-coordinator", "fedhar-simulate"])
def test_every_option_has_help_and_no_default_none(program):
    text = _help(program)
    assert _options_without_help(text) == []
    assert "(default None)" not in text and "default: None" not in text
    if program != "fedhar-client":
        assert re.search(r"--no-progress\s+no progress bar", text)
    assert re.search(r"--log-level \{DEBUG,INFO,WARNING,ERROR\}\s+least severe log messages", text)


@pytest.mark.slow
def test_server_lr_says_what_its_default_is():
    text = " ".join(_help("fedhar-coordinator").split())
    assert ("--server-lr SERVER_LR server optimiser step size eta (fedavgm/fedadam/fedyogi), or the cap eta_max of "
            "FedExP's adaptive step (>= 1); default: the optimiser's own (FedExP 1 up to 15 clients, 2 from 30; FedAvgM 3.0") in text


@pytest.mark.slow
@pytest.mark.parametrize("program", ["fedhar-study", "fedhar-compare", "fedhar-simulate"])
def test_descriptions_have_no_rest_markup(program):
    text = _help(program)
    assert "``" not in text and ":mod:" not in text and ":func:" not in text
    if program == "fedhar-study":
        assert "each cell a real fedhar-simulate run" in text


def test_record_lists_the_activities():
    text = " ".join(_help("fedhar-record").split())
    for name, labels in LABEL_SETS.items():
        assert f"{name}: {', '.join(labels.names)}" in text


def test_app_help_lists_its_exit_codes():
    text = _help("fedhar-app")
    assert "  7  a Python module the run needs is not installed" in text and "Kivy, the app extra" in text


def test_app_without_kivy_names_the_extra(tmp_path):
    code = (
        "import sys; sys.modules['kivy'] = None\n"  # blocks `import kivy` with ModuleNotFoundError, as if not installed
        "from edge_client.app.main import main\n"
        f"sys.exit(main(['--state-dir', {str(tmp_path)!r}]))\n"
    )
    r = _run(["-c", code])
    assert r.returncode == 7, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    # fedhar is not on PyPI: the hint installs this checkout's extra with this interpreter's pip
    assert f"-m pip install -e '{ROOT}[app]'" in r.stderr and "fedhar[app]" not in r.stderr


def test_app_logs_each_line_once(tmp_path):
    """Python's logging as main() sets it up, then Kivy imported in prepare_kivy's environment: one copy of each line."""
    code = (
        "import logging\n"
        "logging.basicConfig(level='INFO', format='%(levelname)s %(name)s: %(message)s')\n"
        "from edge_client.app.main import prepare_kivy\n"
        "prepare_kivy()\n"
        "import kivy\n"
        "from kivy.logger import Logger\n"
        "Logger.info('Probe: kivy-marker')\n"
        "logging.getLogger('fedhar.app').info('fedhar-marker')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIVY_")}
    env |= {"PYTHONPATH": str(ROOT), "KIVY_HOME": str(tmp_path / "kivy")}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout + r.stderr
    assert out.count("kivy-marker") == 1 and out.count("fedhar-marker") == 1, out[-2000:]
    assert out.count("Kivy: v") == 1 and "\x1b[" not in out  # Kivy's own coloured console handler is not installed


def test_cut_buffer_alarm_becomes_one_note():
    from edge_client.app.main import _CutBufferNote

    rec = logging.LogRecord("kivy", logging.CRITICAL, __file__, 1, "Cutbuffer: Unable to find any valuable Cutbuffer provider. x", (), None)
    assert _CutBufferNote().filter(rec) and rec.levelno == logging.INFO and rec.getMessage().startswith("Cutbuffer: no middle-click")
    other = logging.LogRecord("kivy", logging.CRITICAL, __file__, 1, "Window: Unable to find any valuable Window provider", (), None)
    assert _CutBufferNote().filter(other) and other.levelno == logging.CRITICAL


def test_enrol_is_spelt_one_way_and_enroll_is_its_alias(capsys):
    from coordinator.cli import main

    for word in ("enrol", "enroll"):
        with pytest.raises(SystemExit) as done:
            main([word, "--help"])
        assert done.value.code == 0
        text = capsys.readouterr().out
        assert text.startswith("usage: fedhar-coordinator enrol [-h]") and "--owner OWNER" in text, word
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert "fedhar-coordinator enrol NAME" in top and "(alias: enroll)" in top and "enroll NAME" not in top


def _record_with_bus(tmp_path, bus_error: str) -> subprocess.CompletedProcess[str]:
    """fedhar-record with a stand-in smbus2 whose SMBus(1) raises ``bus_error`` as the real one does when opening /dev/i2c-1."""
    code = (
        "import sys, types\n"
        "m = types.ModuleType('smbus2')\n"
        f"def SMBus(n):\n    raise {bus_error}\n"
        "m.SMBus = SMBus\nsys.modules['smbus2'] = m\n"
        "from edge_client.record_cli import main\n"
        f"sys.exit(main(['--state-dir', {str(tmp_path)!r}, '--activity', 'walking', '--seconds', '1']))\n"
    )
    return _run(["-c", code])


def test_record_without_the_i2c_bus_says_one_line_and_no_traceback(tmp_path):
    cases = {
        "FileNotFoundError(2, 'No such file or directory', '/dev/i2c-1')": "/dev/i2c-1 does not exist: enable I2C",
        "PermissionError(13, 'Permission denied', '/dev/i2c-1')": "/dev/i2c-1 is not readable by this user: add it to group i2c",
        "OSError(19, 'No such device', '/dev/i2c-1')": "/dev/i2c-1 cannot be opened: No such device",
    }
    for error, words in cases.items():
        r = _record_with_bus(tmp_path, error)
        assert r.returncode == 3, r.stderr
        assert r.stderr.splitlines() == [f"fedhar-record: {r.stderr.split(': ', 1)[1].strip()}"] and words in r.stderr, r.stderr
        assert r.stdout == ""
    code = (
        "import sys\nsys.modules['smbus2'] = None\nfrom edge_client.record_cli import main\n"
        f"sys.exit(main(['--state-dir', {str(tmp_path)!r}, '--activity', 'walking', '--seconds', '1']))\n"
    )
    r = _run(["-c", code])
    assert r.returncode == 3 and len(r.stderr.splitlines()) == 1, r.stderr
    assert f"needs smbus2, which is not installed: {sys.executable} -m pip install -e '{ROOT}[pi]'" in r.stderr
