"""SIGINT reaches ``serve`` as KeyboardInterrupt wherever its main thread is, and during its start that can be inside
any part's ``Thread.start()`` (which waits for the new thread to say it runs). Each thread start of a serve's start
is interrupted in turn, before and after the new thread runs: serve must end with the KeyboardInterrupt (exit 130
from the command line, its cleanup complete), never with an error of its own cleanup, and leave nothing running
or listening: no thread of its parts, no operator socket, no status page port, the data folder's lock let go.

The server runs over in-memory devices; its status page and the page's broker monitor are real (the monitor's
broker address has nothing listening, so its session keeps trying, as it would while a broker is down)."""

from __future__ import annotations

import functools
import socket
import threading
from pathlib import Path

import pytest
from support.serving import LoopGrid, until

from coordinator.server import operator_channel
from coordinator.server.data_lock import DataLock
from har_io.broker_config import BrokerConfig
from har_io.threads import join_started
from simulation.broker import free_port

BROKER = BrokerConfig.parse("127.0.0.1:9")


def _data(tmp_path: Path, http_port: int) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    (d / "server.toml").write_text(
        f"[model]\nconv_filters = 4\ndense_units = 8\n[server]\nhttp_port = {http_port}\n"
        "[schedule]\nmin_clients = 4\nmin_round_interval_s = 3600\n"
    )
    return d


def _none_left(before: set[threading.Thread]) -> bool:
    """No thread alive that was not there before the serve's run."""
    return not {t for t in threading.enumerate() if t.is_alive()} - before


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_join_started_takes_a_thread_whose_start_never_ran_and_does_not_wait_for_itself() -> None:
    never = threading.Thread(target=lambda: None)
    with pytest.raises(RuntimeError, match="before it is started"):
        never.join(0)  # what a stop met before the helper
    assert join_started(never, 0.1) is True and join_started(None, 0.1) is True
    gate = threading.Event()
    running = threading.Thread(target=gate.wait, daemon=True)
    running.start()
    assert join_started(running, 0.05) is False  # still waiting on its gate: not ended
    gate.set()
    assert join_started(running, 5) is True
    seen: list[bool] = []
    own = threading.Thread(target=lambda: seen.append(join_started(threading.current_thread(), 5)))
    own.start()
    own.join(5)
    assert seen == [False]


@pytest.mark.parametrize("thread_ran", [False, True], ids=["before-the-thread-runs", "after-the-thread-runs"])
def test_an_interrupt_in_any_thread_start_of_serve_ends_it_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    thread_ran: bool) -> None:  # fmt: skip
    from coordinator.server.serve import Server

    http_port = free_port()
    data = _data(tmp_path, http_port)
    real_start = threading.Thread.start
    interrupted = 0
    for n in range(40):
        server = Server(data, BROKER, "home", grid=lambda needs: LoopGrid({}), poll_s=0.02)
        before = set(threading.enumerate())
        calls = [0]

        def start(thread: threading.Thread, n: int = n, calls: list[int] = calls) -> None:
            k = calls[0]
            calls[0] += 1
            if k == n:
                if thread_ran:
                    real_start(thread)
                raise KeyboardInterrupt
            real_start(thread)

        monkeypatch.setattr(threading.Thread, "start", start)
        stop = threading.Event()
        stop.set()  # the loop ends at once once everything has started: the start and the cleanup are what is tried
        try:
            server.run(stop)
        except KeyboardInterrupt:
            interrupted += 1
        else:
            assert calls[0] <= n, f"thread start {n} was interrupted, yet serve went on"
        finally:
            monkeypatch.setattr(threading.Thread, "start", real_start)
        until(functools.partial(_none_left, before), 20, f"every thread of serve's parts to end after interrupt {n}: "
              f"{sorted(t.name for t in set(threading.enumerate()) - before)}")  # fmt: skip
        assert not (data / operator_channel.SOCKET_NAME).exists()
        until(lambda: _port_free(http_port), 10, f"the status page port {http_port} let go after interrupt {n}")
        lock = DataLock(data, "test")
        assert lock.try_acquire(), f"the data folder's lock is still held after interrupt {n}"
        lock.release()
        if calls[0] <= n:  # this run started fewer threads than n: every start has been interrupted once
            break
    else:
        raise AssertionError("serve's start made more than 40 threads")
    # the operator socket's thread, the page (its server, its warming), the monitor (its parser, its MQTT session)
    assert interrupted >= 4, interrupted
