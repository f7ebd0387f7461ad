"""The embedded MQTT broker (amqtt, MQTT 3.1.1) for simulations and tests.

It runs in its own process (``python -m simulation.broker --port N``), on loopback with
anonymous access: a test harness, not a deployment broker (use Mosquitto, ``firmware_scripts/``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from har_io.exit_codes import Exit

log = logging.getLogger("fedhar.broker")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` different TCP ports free on ``host`` right now (held open together while chosen)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]


def wait_for_port(host: str, port: int, timeout_s: float) -> bool:
    """True once something accepts TCP connections on ``host:port`` (polls for ``timeout_s``)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def stop_process(process: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """Stop a child process: SIGTERM, then SIGKILL after ``grace_s`` s, reaping it either way (an exited one is left alone).

    subprocess.TimeoutExpired only if it survives SIGKILL for another ``grace_s`` s.
    """
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(grace_s)


class Payload(bytes):
    """A payload inside the embedded broker: the same bytes with a short ``repr``.

    amqtt 0.12.1 builds a debug f-string of every forwarded message whatever the log level; the
    full ``repr`` of 1 MB chunks was three quarters of the broker's CPU.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<payload of {len(self)} bytes>"


def _broker_class() -> type:
    """amqtt's ``Broker`` with two of its defects worked around (amqtt 0.12.1); with another amqtt, the plain one.

    - Every forwarded payload is wrapped in :class:`Payload`.
    - A connecting client gets retained messages only for its own subscriptions (MQTT 3.1.1
      section 3.3.1.3): amqtt walked every client's filters on each connection (1000 filters x 330
      messages at 300 clients), sent others' retained statuses, and failed with "dictionary changed
      size during iteration", dropping the connection.
    """
    from amqtt.broker import Broker

    if not all(callable(getattr(Broker, n, None)) for n in ("_broadcast_message", "_publish_retained_messages_for_subscription")):
        return Broker

    class _Broker(Broker):
        async def _broadcast_message(self, session: Any, topic: str | None, data: Any, force_qos: int | None = None) -> None:
            if isinstance(data, (bytes, bytearray)) and not isinstance(data, Payload):
                data = Payload(data)
            await super()._broadcast_message(session, topic, data, force_qos)

        async def _publish_retained_messages_for_subscription(self, subscription: tuple[str, int], session: Any) -> None:
            subscribers = getattr(self, "_subscriptions", {}).get(subscription[0], ())
            if any(s.client_id == session.client_id for s, _ in subscribers):
                await super()._publish_retained_messages_for_subscription(subscription, session)

    return _Broker


def broker_config(host: str, port: int) -> dict[str, Any]:
    """amqtt's configuration of the embedded broker: one TCP listener on ``host:port``, anonymous access."""
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}"}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }


def make_broker(host: str, port: int) -> Any:
    """The embedded broker (not started; ``await broker.start()`` in an event loop), payloads wrapped in :class:`Payload`."""
    return _broker_class()(broker_config(host, port))


async def _serve(host: str, port: int) -> None:
    broker = make_broker(host, port)
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("embedded broker listening on %s:%d", host, port)
    await stop.wait()
    await broker.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Run the embedded broker until SIGTERM/SIGINT."""
    ap = argparse.ArgumentParser(description="fedhar embedded MQTT broker (amqtt, loopback, anonymous)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("amqtt", "transitions"):
        logging.getLogger(name).setLevel(logging.ERROR)
    asyncio.run(_serve(args.host, args.port))
    return Exit.OK


class EmbeddedBroker:
    """Start the embedded broker in a child process on ``host:port`` (a free port if omitted); stop it on exit.

    ``log_file``: the broker's output (default discarded). RuntimeError if it does not accept
    connections within ``start_timeout_s``.
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int | None = None, log_file: Path | None = None, start_timeout_s: float = 30.0
    ):
        self.host = host
        self.port = port or free_port(host)
        self.log_file = log_file
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> EmbeddedBroker:
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        self.process = subprocess.Popen(
            [sys.executable, "-m", "simulation.broker", "--host", self.host, "--port", str(self.port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        if not wait_for_port(self.host, self.port, self.start_timeout_s) or self.process.poll() is not None:
            self.stop()
            raise RuntimeError(f"embedded broker did not start on {self.host}:{self.port}; see {self.log_file or 'its output'}")
        return self

    def stop(self) -> None:
        """Terminate the broker process (SIGTERM, then SIGKILL after 5 s)."""
        if self.process is not None:
            stop_process(self.process)

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def find_mosquitto() -> str | None:
    """Path of the ``mosquitto`` executable (PATH, then /usr/sbin where Debian puts it), or None."""
    import shutil

    found = shutil.which("mosquitto")
    return found or ("/usr/sbin/mosquitto" if os.path.exists("/usr/sbin/mosquitto") else None)


class LocalMosquitto(EmbeddedBroker):
    """Start Mosquitto on a loopback port as a child process (anonymous, no persistence); stop it on exit.

    As :class:`EmbeddedBroker`, for loads amqtt cannot carry (it buffers a copy per subscriber: 4.1 GB
    and no finished round for 300 clients with the paper CNN, where Mosquitto took 133 s under 1.8 GB;
    docs/benchmarks-server.md). The configuration goes next to ``log_file``. FileNotFoundError without
    Mosquitto; RuntimeError if it does not accept connections in time.
    """

    _tmp: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> LocalMosquitto:

        exe = find_mosquitto()
        if exe is None:
            raise FileNotFoundError("mosquitto is not installed (apt-get install mosquitto), or use the embedded broker")
        if self.log_file:
            folder = self.log_file.parent
        else:
            self._tmp = tempfile.TemporaryDirectory(prefix="fedhar-mosquitto-")  # removed by stop()
            folder = Path(self._tmp.name)
        conf = folder / "mosquitto.conf"
        # No persistence: a simulation starts afresh.
        conf.write_text(f"listener {self.port} {self.host}\nallow_anonymous true\npersistence false\nlog_dest stdout\n")
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        self.process = subprocess.Popen([exe, "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT)
        if not wait_for_port(self.host, self.port, self.start_timeout_s) or self.process.poll() is not None:
            self.stop()
            raise RuntimeError(f"mosquitto did not start on {self.host}:{self.port}; see {self.log_file or 'its output'}")
        return self

    def stop(self) -> None:
        """Terminate Mosquitto (SIGTERM, then SIGKILL after 5 s) and remove its temporary configuration folder, if any."""
        super().stop()
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            tmp.cleanup()


LOCAL_BROKERS: dict[str, type[EmbeddedBroker]] = {"amqtt": EmbeddedBroker, "mosquitto": LocalMosquitto}
"""The brokers a simulation can start on loopback (``fedhar-simulate --local-broker``), by name."""


if __name__ == "__main__":
    sys.exit(main())
