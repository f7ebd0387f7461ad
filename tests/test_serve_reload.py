"""A reload tells the truth: refused when the next start would fail, deferred during a round and said so,
and a changed aggregation taken up at start as a deliberate change (INFO, old settings and state archived)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from support.small_federation import CONV_FILTERS, DENSE_UNITS

from coordinator.server.audit import read_audit
from coordinator.server.serve import Server, archive_strategy_change
from har_io.broker_config import BrokerConfig
from har_io.cli import read_settings_file, write_settings_file

FED = "reloadfed"


def _settings(data: Path, extra: str = "", server: str = "") -> Path:
    data.mkdir(parents=True, exist_ok=True)
    toml = data / "server.toml"
    toml.write_text(
        f"min_clients = 2\n{extra}\n[model]\nconv_filters = {CONV_FILTERS}\ndense_units = {DENSE_UNITS}\n"
        f"[server]\nhttp_port = 8765\n{server}\n[schedule]\nmin_clients = 2\nmin_round_interval_s = 1\n"
    )
    return toml


def _server(data: Path) -> Server:
    return Server(data, BrokerConfig.parse("127.0.0.1:9"), FED)  # not started: no broker needed


def _close(server: Server) -> None:
    server.close()


def test_a_reload_the_next_start_would_refuse_is_refused_now(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    toml = _settings(data)
    server = _server(data)
    toml.write_text(toml.read_text().replace("http_port = 8765\n", 'http_port = 8765\nhttp_bind = "0.0.0.0"\n'))
    with caplog.at_level(logging.INFO, logger="fedhar.serve"):
        assert server.reload() == []
    assert server.server.http_bind == "127.0.0.1"  # the settings in force are kept
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "reload refused: [server] http_bind = '0.0.0.0'" in errors[0].getMessage()
    assert "set [server] token" in errors[0].getMessage()
    entries = read_audit(data)
    assert [e.action for e in entries] == ["reload"]
    assert entries[0].detail.startswith("refused: [server] http_bind = '0.0.0.0' would show the federation")
    # with a token the same bind is accepted, and said to take effect at the next start (the page binds once)
    toml.write_text(toml.read_text().replace('http_bind = "0.0.0.0"\n', 'http_bind = "0.0.0.0"\ntoken = "' + "t" * 24 + '"\n'))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fedhar.serve"):
        assert server.reload() == []  # nothing applied now
    assert server.server.http_bind == "0.0.0.0"  # what the next start will use
    lines = [r.getMessage() for r in caplog.records]
    assert "reload: [server] http_bind '127.0.0.1' -> '0.0.0.0' takes effect at the next start" in lines
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert read_audit(data)[-1].detail.startswith("applied: [server] http_bind '127.0.0.1' -> '0.0.0.0' (at the next start)")
    _close(server)


def test_a_reload_during_an_open_round_says_it_is_deferred_and_when_it_applied(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    toml = _settings(data)
    server = _server(data)
    server.open_round = 7  # what the loop sets while run_round(7) runs
    toml.write_text(toml.read_text().replace("[schedule]\nmin_clients = 2", "[schedule]\nmin_clients = 3"))
    with caplog.at_level(logging.INFO, logger="fedhar.serve"):
        server.request_reload()  # SIGHUP
        assert server.schedule.min_clients == 2  # not yet
        server.open_round = None  # the round closed: the loop reloads
        assert server.reload() == ["[schedule] min_clients 2 -> 3"]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["reload: deferred until round 7 closes", "reload: round 7 closed; the deferred reload is applied now",
                     "reload: [schedule] min_clients 2 -> 3"]  # fmt: skip
    assert [e.detail for e in read_audit(data)] == ["deferred until round 7 closes",
                                                    "applied (deferred until round 7 closed): [schedule] min_clients 2 -> 3"]  # fmt: skip
    # a reload between rounds is applied at once, without a word of deferral
    server.request_reload()
    assert server.reload() == [] and read_audit(data)[-1].detail == "applied: nothing changed"
    _close(server)


def test_a_changed_aggregation_is_a_federation_change_logged_at_info(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    toml = _settings(data, extra='aggregation = "fedavg"')
    server = _server(data)
    toml.write_text(toml.read_text().replace('aggregation = "fedavg"', 'aggregation = "fedprox"'))
    with caplog.at_level(logging.INFO, logger="fedhar.serve"):
        server.reload()
    assert "reload: aggregation 'fedavg' -> 'fedprox' takes effect at the next start" in [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    _close(server)


def test_a_changed_aggregation_at_start_archives_the_old_settings_and_state(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    _settings(data, extra='aggregation = "fedavg"')
    server = _server(data)
    cfg = server.cfg
    _close(server)
    run = data / "run"
    write_settings_file(run / "config.toml", cfg.settings())  # what the first round wrote
    saved = run / "models" / "r0003" / "strategy_state.safetensors"
    saved.parent.mkdir(parents=True)
    saved.write_bytes(b"the old strategy's moments")
    toml = data / "server.toml"
    toml.write_text(toml.read_text().replace('aggregation = "fedavg"', 'aggregation = "fedadam"'))
    with caplog.at_level(logging.INFO):
        server = _server(data)  # the next start
    assert server.cfg.aggregation == "fedadam"
    assert read_settings_file(run / "config.toml")["aggregation"] == "fedadam"
    archived = sorted(run.glob("config.*.toml"))
    assert len(archived) == 1 and read_settings_file(archived[0])["aggregation"] == "fedavg"
    stamp = archived[0].name[len("config.") : -len(".toml")]
    assert not saved.exists()
    assert (saved.parent / f"strategy_state.fedavg.{stamp}.safetensors").read_bytes() == b"the old strategy's moments"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("aggregation changed from 'fedavg' to 'fedadam'" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)
    _close(server)
    # the same strategy at the next start: nothing archived again
    assert archive_strategy_change(run, server.cfg) is None and len(list(run.glob("config.*.toml"))) == 1


@pytest.mark.slow
def test_sighup_to_a_running_serve_refuses_a_page_off_loopback_without_a_token(tmp_path: Path, mosquitto: int) -> None:
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[1]
    data = tmp_path / "data"
    toml = _settings(data)
    toml.write_text(toml.read_text().replace("http_port = 8765", "http_port = 0"))
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "coordinator.cli", "serve", "--data", str(data), "--broker", f"127.0.0.1:{mosquitto}", "--federation", FED]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=root)
    try:

        def wait(text: str) -> None:
            end = time.monotonic() + 60
            while text not in log.read_text():
                assert proc.poll() is None and time.monotonic() < end, f"no {text!r} in the log:\n{log.read_text()}"
                time.sleep(0.1)

        wait("serving federation")
        toml.write_text(toml.read_text().replace("http_port = 0", 'http_port = 8765\nhttp_bind = "0.0.0.0"'))
        proc.send_signal(signal.SIGHUP)
        wait("reload refused: [server] http_bind = '0.0.0.0' would show the federation to the network without a login")
        assert proc.poll() is None  # still serving, with the settings in force
        assert read_audit(data)[-1].action == "reload" and read_audit(data)[-1].detail.startswith("refused: [server] http_bind")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "ERROR" in next(line for line in log.read_text().splitlines() if "reload refused" in line)


@pytest.mark.slow
def test_serve_started_with_sigint_ignored_and_blocked_still_stops_on_sigint(tmp_path: Path, mosquitto: int) -> None:
    """Both are inherited from whatever started it (``trap '' INT``, ``nohup``, a parent that blocked the signal)."""
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[1]
    data = tmp_path / "data"
    toml = _settings(data)
    toml.write_text(toml.read_text().replace("http_port = 8765", "http_port = 0"))
    log = tmp_path / "serve.log"

    def ignore_and_block_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})

    cmd = [sys.executable, "-m", "coordinator.cli", "serve", "--data", str(data), "--broker", f"127.0.0.1:{mosquitto}", "--federation", FED]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=root, preexec_fn=ignore_and_block_sigint)
    try:
        end = time.monotonic() + 60
        while "serving federation" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < end, log.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "fedhar-coordinator serve: stopped; everything completed is kept" in log.read_text()
