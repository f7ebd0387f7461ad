"""Leaving the federation from the device: tell the server, then delete what joined the device to it.

A device leaves in three steps (the app's Federation screen, after a confirmation):

1. its agent is stopped (the caller's part: nothing trains or sends from then on);
2. :func:`announce_leaving` publishes, with the device's own broker account, a retained status
   that says it left (:attr:`har_models.wire.messages.ClientStatus.left`): "keep", or
   "forget" when its person also asks the server's operator to delete what the server holds of
   it. The broker's ACL lets only that account write the device's status topic, so nobody else
   can ask in its name; the request deletes nothing by itself: the server notes it and the
   operator runs ``fedhar-coordinator forget NAME`` (docs/protocol.md, "Leaving");
3. :func:`delete_federation_state` deletes the broker password, the enrolled CA certificate and
   the enrolment mark (what the bundle gave), the local model, the FedALA state, the update
   encoding's residual and the last update sent.

Kept on the device: the recorded windows and the Today timeline (the person's own record; a
later enrolment trains on them again) and the list of what left the phone in past rounds.
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
    """The retained status of a device that left: state "offline", ``left`` "forget" or "keep".

    Raises
    ------
    ValueError
        For an invalid client id.
    """
    return ClientStatus(check_client_id(client_id), "offline", sent_unix=time.time() if now_unix is None else now_unix,
                        left="forget" if forget else "keep").to_bytes()  # fmt: skip


def announce_leaving(broker: BrokerConfig, federation: str, client_id: str, forget: bool, wait_s: float = CONNECT_WAIT_S) -> str | None:
    """Publish the device's leaving status (:func:`leaving_status`) with its own account; returns why not, or None when sent.

    The status is retained at QoS 1, so a server that is down now reads it when it starts.

    Parameters
    ----------
    broker : BrokerConfig
        The device's broker settings (its user name, password and CA).
    federation : str
        The federation's name.
    client_id : str
        The device's id (its status topic ``{p}/client/<id>/status``).
    forget : bool
        Whether to ask the server's operator to forget the device.
    wait_s : float
        Bound on the login and on the broker's acknowledgement (seconds).

    Returns
    -------
    str or None
        None when the broker acknowledged the status; else why it was not sent, in words.
    """
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
    """Delete the federation's credentials and the local training state; returns what was deleted, in words.

    Parameters
    ----------
    store : ClientStore
        The device's store: its local model, FedALA state, encoding residual and last update go
        (:meth:`~edge_client.store.ClientStore.forget_run_state`); its windows stay.
    credentials_dir : Path
        The folder of the broker password, the enrolled CA and the enrolment mark (deleted whole).

    Raises
    ------
    OSError
        If a file exists but cannot be deleted (what was deleted before stays deleted).
    """
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
    """What leaving did.

    Attributes
    ----------
    forget : bool
        Whether the person asked the server to forget the device.
    told : bool
        Whether the broker acknowledged the leaving status (the server reads it now or when it starts).
    not_told : str
        Why the server was not told, in words ("" when it was).
    deleted : tuple of str
        What was deleted on the device, in words.
    """

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
