"""Leaving the federation from the device: tell the server, then delete what joined the device to it.

After the caller stopped the agent, :func:`announce_leaving` publishes with the device's own
account a retained status that it left (``left`` "keep", or "forget": the operator is asked to
delete what the server holds of it; only that account may write the topic, and the request
deletes nothing by itself, docs/protocol.md "Leaving"); :func:`delete_federation_state` deletes the
credentials and the local training state. The recorded windows, the timeline and the list of
what left the phone stay.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from edge_client.store import ClientStore
from har_io.broker_config import BrokerConfig
from har_models.wire.messages import ClientStatus
from har_models.wire.topics import Topics, check_client_id

log = logging.getLogger("fedhar.leave")

CONNECT_WAIT_S = 10.0
"""How long :func:`announce_leaving` waits for the broker to accept the login (seconds)."""

MODEL_FILES = ("local_model.safetensors", "ala_state.safetensors", "encoding_residual.safetensors", "last_update.bin")
"""The local training state in the store's folder (:class:`edge_client.store.ClientStore`)."""


def leaving_status(client_id: str, forget: bool, now_unix: float | None = None) -> bytes:
    """The retained status of a device that left: state "offline", ``left`` "forget" or "keep"; ValueError for a bad id."""
    return ClientStatus(check_client_id(client_id), "offline", sent_unix=time.time() if now_unix is None else now_unix,
                        left="forget" if forget else "keep").to_bytes()  # fmt: skip


def announce_leaving(broker: BrokerConfig, federation: str, client_id: str, forget: bool, wait_s: float = CONNECT_WAIT_S) -> str | None:
    """Publish the device's leaving status with its own account (retained, QoS 1: a server that is down reads it when it
    starts); returns None once the broker acknowledged it, else why not, in words. ``wait_s`` bounds the login and the
    acknowledgement."""
    from har_io.mqtt_link import MqttLink

    topics = Topics(federation)
    link = MqttLink(broker, f"fedhar-leave-{client_id}")
    try:
        if not link.start(wait_s=wait_s):
            why = link.fatal or link.connect_error or f"no answer from {broker.host}:{broker.port} in {wait_s:.0f} s"
            return f"the server was not told: {why}"
        link.publish(topics.client_status(client_id), leaving_status(client_id, forget), retain=True, timeout=wait_s)
    except (OSError, RuntimeError, TimeoutError, ValueError) as exc:
        return f"the server was not told: {exc}"
    finally:
        link.stop()
    log.info("told the server that %s left%s", client_id, " and asks to be forgotten" if forget else "")
    return None


def delete_federation_state(store: ClientStore, credentials_dir: Path) -> list[str]:
    """Delete the credentials folder (password, enrolled CA, enrolment mark) and the store's local training state
    (its windows stay); returns what was deleted, in words. OSError if a file cannot be deleted."""
    done = []
    if credentials_dir.exists():
        shutil.rmtree(credentials_dir)
        done.append("the broker password and certificate of the enrolment")
    had = [name for name in MODEL_FILES if (store.folder / name).exists()]
    store.forget_run_state()
    if had:
        done.append("the local model and its training state" if "local_model.safetensors" in had else "the local training state")
    return done


@dataclass(frozen=True)
class LeaveOutcome:
    """What leaving did: whether the person asked the server to forget the device, whether the broker acknowledged the
    status, why the server was not told ("" when it was), and what was deleted, in words."""

    forget: bool
    told: bool
    not_told: str = ""
    deleted: tuple[str, ...] = ()


def leave_words(outcome: LeaveOutcome, client_id: str) -> str:
    """The screen's account of :class:`LeaveOutcome`, for the person who left (two or three sentences)."""
    deleted = " and ".join(outcome.deleted) if outcome.deleted else "nothing was left to delete"
    words = f"You left the federation. Deleted from this phone: {deleted}."
    if outcome.told and outcome.forget:
        words += f" The server was asked to forget {client_id}; its operator deletes what it holds of this phone."
    elif outcome.told:
        words += " The server was told that this phone left."
    else:
        ask = f" Ask the server's operator to forget {client_id}." if outcome.forget else ""
        words += f" {outcome.not_told[:1].upper()}{outcome.not_told[1:]}.{ask}"
    return words + " To join again, enrol with a new bundle."
