"""The broker seen from one device: what it retains of it, and its live session.

:func:`clear_device_topics` deletes a device's retained status and models through a session that may
write there (the coordinator's). :func:`close_session` ends the live connection of a device enrolled
by certificate: Mosquitto's reload closes removed password accounts' sessions but does not check a
certificate session again, so one login under the device's name takes its session over.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from har_io.broker_config import BrokerConfig
    from har_io.mqtt_link import MqttLink
    from har_models.wire.topics import Topics

log = logging.getLogger("fedhar.server.broker")


def clear_device_topics(link: MqttLink, topics: Topics, name: str, timeout: float = 60.0) -> list[str]:
    """Delete what the broker retains of device ``name``: its status, then its personalised model chunks; the topics cleared.

    ``link`` must be the coordinator's (it may write ``{p}/#``); call it once the device can no longer
    publish. Raises ValueError for an invalid id (``+``/``#`` would widen the sweep), TimeoutError or
    BrokerRefused as :meth:`MqttLink.publish`.
    """
    from har_models.wire.topics import check_client_id

    check_client_id(name)
    status = topics.client_status(name)
    link.clear_retained([status], timeout=timeout)
    models = link.sweep_retained([topics.client_model(name, "+")], timeout=timeout)
    log.info("cleared the retained status and %d model chunk(s) of %s", len(models), name)
    return [status, *models]


def close_session(broker: BrokerConfig, name: str, wait_s: float = 15.0) -> bool:
    """End device ``name``'s live session by logging in once under its name (loopback); True when the login went through.

    Call it after the certificate is revoked and the broker reloaded, so the device cannot log in again.
    """
    import paho.mqtt.client as mqtt

    got: list[int] = []
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=name, clean_session=True)
    c.username_pw_set(broker.username, broker.password)

    def on_connect(client: object, userdata: object, flags: object, rc: object, props: object = None) -> None:
        got.append(int(getattr(rc, "value", rc)))  # type: ignore[call-overload]

    c.on_connect = on_connect
    try:
        c.connect(broker.host, broker.port)
    except OSError as exc:
        log.warning("the live session of %s was not closed: the broker cannot be reached (%s)", name, exc)
        return False
    c.loop_start()
    end = time.monotonic() + wait_s
    while not got and time.monotonic() < end:
        time.sleep(0.05)
    c.disconnect()
    c.loop_stop()
    if got[:1] != [0]:
        log.warning("the live session of %s was not closed: the login under its name was refused (%s)", name, got[:1] or "no answer")
        return False
    log.info("closed the live session of %s (its certificate is revoked)", name)
    return True


def messages_for(link: MqttLink, wait_s: float, poll_s: float = 0.1) -> Iterator[tuple[str, bytes, bool]]:
    """``(topic, payload, retained)`` of each message ``link`` receives within ``wait_s`` seconds from now."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            yield link.inbox.get(timeout=poll_s)
        except queue.Empty:
            continue
