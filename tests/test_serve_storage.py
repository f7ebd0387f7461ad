"""A full disk is a state of the served federation, not a crash: the server keeps what it holds, says
"disk full: <folder>, <free> of <needed>" in its log once and in :meth:`Server.problems` (the page, ``/healthz``),
and goes on by itself when space returns. The disk is "full" by a write that fails with ENOSPC for a while
(the safetensors writer the run's state uses), first for every model file, then for the version files alone."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.inmemory_grid import device_status
from support.registry_views import kept_versions
from support.serving import LoopGrid, until

import coordinator.state as run_state
from har_io.broker_config import BrokerConfig


@pytest.mark.slow  # two rounds, two faults and their retries: about 6 s
def test_a_full_disk_is_a_state_the_server_leaves_by_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    from coordinator.server.serve import Server

    full: set[str] = set()  # "all": every model write fails; "versions": only the version files'
    real = run_state.save_file

    def save_file(arrays: Any, path: str, metadata: Any = None) -> None:
        if "all" in full or ("versions" in full and "/versions/" in path):
            raise OSError(28, "No space left on device")
        real(arrays, path, metadata=metadata)

    monkeypatch.setattr(run_state, "save_file", save_file)
    data = tmp_path / "data"
    data.mkdir()
    (data / "server.toml").write_text("conv_filters = 4\ndense_units = 8\nmin_clients = 2\n[server]\nhttp_port = 0\n"
                                      "[schedule]\nmin_clients = 2\nmin_round_interval_s = 0\n")  # fmt: skip
    grid = LoopGrid({cid: device_status(cid, 30) for cid in ("dev-a", "dev-b")})
    server = Server(data, BrokerConfig.parse("127.0.0.1:9"), "home", grid=lambda needs: grid, poll_s=0.02, storage_retry_s=0.3)
    full.add("all")
    stop = threading.Event()
    loop = threading.Thread(target=server.run, args=(stop,), daemon=True)
    with caplog.at_level(logging.INFO, logger="fedhar.serve"):
        loop.start()
        try:
            problems = until(server.problems, 20, "the full disk reported")
            assert len(problems) == 1 and problems[0].startswith(f"disk full: {data / 'run' / 'models'}")
            assert " MB free of " in problems[0] and problems[0].endswith(" MB needed")
            time.sleep(1.0)  # a few retries while it stays full: still one state, said once, no version, no exit
            assert loop.is_alive() and kept_versions(data) == []
            assert [p.partition(",")[0] for p in server.problems()] == [problems[0].partition(",")[0]]
            full.clear()  # space returns
            until(lambda: kept_versions(data), 20, "a version kept once there is space")
            until(lambda: server.problems() == [], 20, "the fault over")
            # full again, for the version files only: the round completes in the run's state and its version waits
            full.add("versions")
            done = server.runner.state.last_completed_round()
            until(lambda: any(p.startswith(f"disk full: {data / 'versions'}") for p in server.problems()), 20, "the second fault")
            assert server.runner.state.last_completed_round() == done + 1 and kept_versions(data)[-1][1] == done
            full.clear()
            until(lambda: kept_versions(data)[-1][1] >= done + 1 and not server.problems(), 20, "the version written")
        finally:
            full.clear()
            stop.set()
            loop.join(20)
    assert not loop.is_alive()
    rounds = [r for _, r in kept_versions(data)]
    assert rounds == list(range(rounds[0], rounds[0] + len(rounds)))  # every completed round got its version, in order
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage().split(";")[0][:10] for r in errors] == ["disk full:", "disk full:"]  # said once per fault
    assert not any(r.exc_info for r in caplog.records)  # no traceback
    over = [r.getMessage() for r in caplog.records if "storage fault is over" in r.getMessage()]
    assert len(over) == 2
