"""Shared fixtures: a real Mosquitto on a free loopback port, and a small federation run in this process.

The small federation's command line lives in ``support/small_federation.py`` (the CNN's width, the
deadlines); ``small_simulation`` runs it in the test's temporary folder.

Markers (registered in pyproject.toml, ``--strict-markers``): ``slow`` (a test or module that
takes seconds: whole federations, real programs, clusters; ``pytest -m "not slow"`` is the
fast loop), ``mosquitto`` (needs a real Mosquitto), ``app`` (the Kivy app under Xvfb),
``ray`` (a Ray cluster). The README's test command runs all of them. A test that asks for the
``mosquitto`` fixture gets the ``mosquitto`` marker here; modules that start their own
Mosquitto, the app's and the Ray tests carry theirs in ``pytestmark``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.small_federation import run_simulation

from simulation.broker import LocalMosquitto, find_mosquitto

# Kivy makes its home folder (~/.kivy) and its config on first import without allowing for another process doing
# the same: on a fresh machine, pytest-xdist workers collecting the app's tests at once raced (FileExistsError on
# ~/.kivy). Each test process gets a home of its own, removed at its exit, unless the caller chose one.
if "KIVY_HOME" not in os.environ:
    os.environ["KIVY_HOME"] = tempfile.mkdtemp(prefix="fedhar-tests-kivy-")
    atexit.register(shutil.rmtree, os.environ["KIVY_HOME"], True)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the ``mosquitto`` fixture ``mosquitto``, so ``-m "not mosquitto"`` leaves it out."""
    for item in items:
        if "mosquitto" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.mosquitto)


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[int]:
    """Start ``mosquitto`` on 127.0.0.1:<free port> (:class:`simulation.broker.LocalMosquitto`); yield the port.

    Skipped when Mosquitto is not installed, unless FEDHAR_REQUIRE_MOSQUITTO=1 (set by
    .ci/run), in which case a missing broker fails the test.
    """
    if find_mosquitto() is None:
        if os.environ.get("FEDHAR_REQUIRE_MOSQUITTO") == "1":
            pytest.fail("mosquitto is required (FEDHAR_REQUIRE_MOSQUITTO=1) but not installed; apt-get install mosquitto")
        pytest.skip("mosquitto not installed (apt-get install mosquitto)")
    with LocalMosquitto(log_file=tmp_path / "mosquitto.log", start_timeout_s=10) as broker:
        yield broker.port


@pytest.fixture
def small_simulation(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """A runner for small federations in this test's folder: ``small_simulation(*extra, name="run", run_id=None, **small)``.

    Each call runs :func:`support.small_federation.run_simulation` in ``tmp_path / name`` (``run_id``
    defaults to ``name``) with ``support.small_federation.simulate_args(**small)`` (3 HAPT clients, an
    8-filter / 32-unit CNN, 120 s deadlines, generalisation every round) followed by ``extra``,
    and returns the run's ``report.json``; the run folder stays at ``tmp_path / name`` for
    the test to inspect. A non-zero exit fails the test.
    """

    def run(*extra: str, name: str = "run", run_id: str | None = None, **small: Any) -> dict[str, Any]:
        return run_simulation(tmp_path / name, *extra, run_id=run_id, **small)

    return run


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(ca.crt, other-ca.crt): a CA that signed the test broker's certificate, and an unrelated one (openssl).

    Skips the module's tests where openssl is missing (:func:`support.secured_broker.make_pki`).
    """
    from support.secured_broker import Missing, make_pki

    try:
        ca, _, _, other = make_pki(tmp_path_factory.mktemp("pki"))
    except Missing as exc:
        pytest.skip(str(exc))
    return ca, other


@pytest.fixture
def tls_mosquitto(tmp_path: Path) -> Iterator[Callable[[str, list[str]], Any]]:
    """``start(federation, clients, device_certs=False)``: a Mosquitto with TLS, ACL and one account per client
    (``support/secured_broker.py``); ``device_certs`` adds the device-certificate listener.

    It runs in ``tmp_path / "mqtt"`` until the test ends. Skipped when mosquitto,
    mosquitto_passwd or openssl is missing, unless FEDHAR_REQUIRE_MOSQUITTO=1 (set by
    ``.ci/run``), where that fails the test.
    """
    from contextlib import ExitStack

    from support.secured_broker import Missing, secured_mosquitto

    with ExitStack() as stack:

        def start(federation: str, clients: list[str], device_certs: bool = False) -> Any:
            try:
                return stack.enter_context(secured_mosquitto(tmp_path / "mqtt", federation, clients, device_certs))
            except Missing as exc:
                if os.environ.get("FEDHAR_REQUIRE_MOSQUITTO") == "1":
                    pytest.fail(str(exc))
                pytest.skip(str(exc))

        yield start
