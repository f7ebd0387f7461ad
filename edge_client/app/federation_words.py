"""The Federation screen's sentences: why the device is or is not training, and each failure with its fix (no Kivy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edge_client.app.config import CREDENTIALS_DIR, MIN_TRAIN_WINDOWS, TRAIN_FRACTION, AppConfig
from edge_client.app.joining import accepted_before, enrolled
from edge_client.app.views import FederationView
from har_io.refusal_words import bundle_login_refused, bundle_wrong_ca


def taking_part_words(v: FederationView) -> str:
    """Why the device is or is not training now, in one sentence for the person holding it."""
    if v.state == "off":
        return "Not taking part: switch on \"Take part in training\" to help train the shared model"
    if v.state == "waiting for charger":
        return "Not training now: the phone is not charging, and you chose to train only while charging"
    if v.server_down and v.state == "connected":
        return f"Taking part, but no rounds now: {v.server}"
    if v.state == "training":
        return f"Training round {v.round} on this phone now"
    if v.state == "connected":
        if v.server:
            return f"Taking part: connected; {v.server}" + (f"; last round {v.round}" if v.round is not None else "")
        return "Taking part: connected, waiting for the server's next round" + (f" (last round {v.round})" if v.round is not None else "")
    if v.state == "connecting":
        return f"Taking part: connecting to the server at {v.broker}"
    if v.state == "disconnected":
        return f"Taking part, but the server at {v.broker} cannot be reached now; trying again"
    return f"Not training: {v.error}" if v.error else f"Not training ({v.state})"


def not_enough_data(n_train: int) -> str:
    """The words shown when too few windows are recorded: how many there are and how many are needed."""
    need = MIN_TRAIN_WINDOWS - n_train
    recorded = -(-need * 10 // int(TRAIN_FRACTION * 10))  # 80 % of recorded windows train: record a bit more than missing
    return (
        f"nothing to train on: {n_train} training windows recorded, {MIN_TRAIN_WINDOWS} needed; "
        f"record about {recorded} more windows ({recorded * 2.56 / 60:.1f} min of an activity)"
    )


def missing_backend(backend: str, exc: ImportError) -> str:
    """The words shown when the training backend cannot be imported."""
    name = getattr(exc, "name", None) or str(exc)
    which = "the client's default training backend" if backend == "auto" else f"the {backend} training backend"
    return f"{which} cannot run here: module {name!r} is not installed; choose the numpy backend, or install it"


def describe_refusal(kind: str, text: str, cfg: AppConfig) -> str:
    """A broker's refusal (``BrokerRefused.kind`` and message) in the screen's words; a password or CA from an enrolment
    bundle was never typed here, so those words give the operator's fix (:mod:`har_io.refusal_words`)."""
    user = cfg.username if cfg.username else "(none)"
    if kind == "auth":
        if enrolled(cfg.state_dir):
            return f"login refused: {bundle_login_refused(user, accepted_before(cfg.state_dir))}"
        return f"login refused: the broker does not accept user {user!r} with this password; check the user name and password"
    if kind == "tls":
        if "not signed by" in text or "verify failed" in text.lower():
            if enrolled(cfg.state_dir) and cfg.tls_ca is not None and Path(cfg.tls_ca).parent == cfg.state_dir / CREDENTIALS_DIR:
                return f"wrong CA certificate: {bundle_wrong_ca(user, str(cfg.tls_ca))}"
            return f"wrong CA certificate: the broker's certificate is not signed by {cfg.tls_ca}; choose the CA that signed it"
        return f"TLS failed: {text}"
    return text


def connection_cause(agent: Any, cfg: AppConfig) -> str | None:
    """Why ``agent`` is not connected, in words; None when connected or nothing is known yet.

    A final refusal (the link's ``fatal``) in the app's words naming the user and the CA, else the
    cause of the last failed attempt (:attr:`edge_client.agent.EdgeAgent.connection`).
    """
    link = getattr(agent, "_link", None)
    if link is None:
        return None
    fatal = getattr(link, "fatal", None)
    if fatal is not None:
        return describe_refusal(str(getattr(fatal, "kind", "")), str(fatal), cfg)
    status = agent.connection
    if status.connected:
        return None
    return status.error
