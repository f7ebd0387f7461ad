"""The embedded MQTT broker (amqtt, MQTT 3.1.1) for simulations and tests.

It runs in its own process (``python -m simulation.broker --port N``), so its event loop
is never starved by training or evaluation in another process. It listens on loopback
only and allows anonymous access: it is a test harness, not a deployment broker (use
Mosquitto with the configuration from ``firmware_scripts/`` for that).
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
    """``n`` different TCP ports that are free on ``host`` right now (held open together while chosen, so
    two calls of :func:`free_port` in a row cannot return the same port)."""
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
    """Stop a child process: SIGTERM, then SIGKILL if it has not exited after ``grace_s`` seconds.

    Waits for the process after either signal, so it never lingers as a zombie. A process
    that has already exited is left alone.

    Raises
    ------
    subprocess.TimeoutExpired
        Only if the process survives SIGKILL for another ``grace_s`` seconds (stuck in the kernel).
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
    """An application message's payload inside the embedded broker: plain bytes whose ``repr`` is short.

    amqtt 0.12.1 logs every message it forwards with ``logger.debug(f"... {broadcast}")``, and the
    f-string is built before the logger checks its level, so the payload's full ``repr`` (about
    4 bytes of text per payload byte) is made and thrown away for every 1 MB model chunk, even
    with debug logging off. That was three quarters of the broker's CPU while models were on the
    wire. This type is what the broker forwards instead; its bytes are the same.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<payload of {len(self)} bytes>"


def _broker_class() -> type:
    """amqtt's ``Broker`` with two of its defects worked around (amqtt 0.12.1); with another amqtt, the plain one.

    - Every forwarded payload is wrapped in :class:`Payload` (same bytes, short repr).
    - Retained messages go to a connecting client only for its own subscriptions. On every
      connection amqtt walks *all* topic filters any client subscribed to and, for each, every
      retained message, publishing the matches to the newcomer. With 300 clients that is
      over a thousand filters times about 330 retained messages per connection: the clients' start-up
      crawled, the newcomer received other clients' retained statuses, and the walk, which
      awaits inside its loop over the filter dict, failed with "dictionary changed size during
      iteration" while others subscribed, dropping the connection (and the client reconnected).
      A new connection has no subscriptions yet; its own retained messages still come when it
      subscribes, as MQTT 3.1.1 section 3.3.1.3 asks.
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
    """Start the embedded broker in a child process; stop it on exit.

    Parameters
    ----------
    host : str
        Loopback address to bind (default 127.0.0.1).
    port : int, optional
        Port; a free one is picked if omitted.
    log_file : Path, optional
        Where the broker's output goes (default: discarded).
    start_timeout_s : float
        How long to wait for it to accept connections.

    Raises
    ------
    RuntimeError
        If the broker does not accept connections within ``start_timeout_s``.
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

    The same role and interface as :class:`EmbeddedBroker`, for simulations the Python broker
    cannot carry: amqtt 0.12.1 builds each subscriber's packet as a copy and writes it to that
    subscriber's socket buffer without waiting for it to drain, and four minutes into the
    first round of 300 clients with the paper CNN it held 4.1 GB, the round unfinished; with
    Mosquitto that round took 133 s and the broker's RSS stayed under 1.8 GB when sampled.

    Parameters
    ----------
    host, port, log_file, start_timeout_s
        As for :class:`EmbeddedBroker`; the configuration file goes next to ``log_file``
        (or into a temporary folder).

    Raises
    ------
    FileNotFoundError
        If Mosquitto is not installed (``apt-get install mosquitto``).
    RuntimeError
        If it does not accept connections within ``start_timeout_s``.
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
