"""The broker seen from one device: what it retains of it, and its live session.

:func:`clear_device_topics` deletes a device's retained status and personalised models (through a
session that may write there: the coordinator's own, or, when no ``serve`` runs on the data folder,
a login as the coordinator under the folder's lock). :func:`close_session` ends the live connection of
a device enrolled by certificate: Mosquitto re-reads its password file on a reload and closes the
sessions of removed accounts, but a session that logged in by certificate
(``use_identity_as_username``) is not checked again, so a revoked or forgotten device would stay
connected until it leaves. Logging in once under its name (the account the device has beside its
certificate; the listeners take the user name as the client id) takes its session over: Mosquitto
closes the device's connection, and this one then leaves cleanly.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from har_io.broker_config import BrokerConfig
    from har_io.mqtt_link import MqttLink
    from har_models.wire.topics import Topics

log = logging.getLogger("fedhar.server.broker")


def clear_device_topics(link: MqttLink, topics: Topics, name: str, timeout: float = 60.0) -> list[str]:
    """Delete what the broker retains of device ``name``: its status and its personalised model chunks.

    Publishes an empty retained message on ``{p}/client/<name>/status`` and on every retained
    ``{p}/client/<name>/model/<i>`` (found with :meth:`MqttLink.sweep_retained`, which waits until
    retained messages stop arriving). ``link`` must be logged in with an account that may write
    there: the coordinator's (``topic readwrite {p}/#`` in the generated ACL). Call it after
    :meth:`BrokerAdmin.remove_device`, once the device can no longer publish its status again.

    Parameters
    ----------
    link : MqttLink
        A connected link (the coordinator's).
    topics : Topics
        The federation's topics.
    name : str
        The device's client id.
    timeout : float
        Bound on the sweep and on each acknowledgement (seconds).

    Returns
    -------
    list of str
        The topics cleared: the status topic first, then the model chunks found (sorted).

    Raises
    ------
    ValueError
        For an invalid client id (a ``+`` or ``#`` would widen the sweep to other devices).
    TimeoutError, BrokerRefused
        As :meth:`MqttLink.publish` (not connected, or not acknowledged in time).
    """
    from har_models.wire.topics import check_client_id

    check_client_id(name)
    status = topics.client_status(name)
    link.clear_retained([status], timeout=timeout)
    models = link.sweep_retained([topics.client_model(name, "+")], timeout=timeout)
    log.info("cleared the retained status and %d model chunk(s) of %s", len(models), name)
    return [status, *models]


def close_session(broker: BrokerConfig, name: str, wait_s: float = 15.0) -> bool:
    """End device ``name``'s live session by logging in once under its name (``broker``: loopback, its user and password).

    The login takes the session over (the listeners use the user name as the client id, one session
    per name), so Mosquitto closes the device's connection; this session then disconnects with a clean
    session, leaving nothing behind. Call it after the device's certificate is revoked and the broker
    reloaded, so the device cannot log in again. True when the login went through.
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
