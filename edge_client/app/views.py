"""What the app's screens show, as plain dataclasses the controller reports: :class:`LiveView` and :class:`FederationView`.

Nothing here imports Kivy: the Android service writes these views to a file the UI reads (:mod:`edge_client.app.service`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edge_client.app.config import AppConfig


@dataclass
class LiveView:
    """What the Live screen shows.

    Attributes
    ----------
    activity : str or None
        Predicted activity of the newest window (None: no model or no window yet).
    confidence : float
        Its probability, 0..1.
    windows : int
        Windows predicted since sensing started (one per 1.28 s hop).
    t_start_ns : int
        Start of the newest window, in the sensor's time base.
    note : str
        Why there is no prediction, when there is none.
    """

    activity: str | None = None
    confidence: float = 0.0
    windows: int = 0
    t_start_ns: int = 0
    note: str = "waiting for the first 3 seconds of movement"


@dataclass
class FederationView:
    """What the Federation screen shows.

    Attributes
    ----------
    broker : str
        ``host:port``.
    state : str
        "off", "waiting for charger", "not enough data", "connecting", "connected",
        "training", "disconnected".
    round : int or None
        Current round announced by the coordinator (or the last one this device answered).
    last_accuracy : float or None
        Accuracy of the last locally trained model on this device's test windows, 0..1.
    take_part, charge_only, charging : bool
    client_id, federation : str
        Who the device is and which federation it joins.
    username : str or None
        Broker user name (None: anonymous).
    password_set : bool
        Whether a password is stored (the password itself is never part of a view).
    tls_ca : str or None
        CA certificate file; None: no TLS.
    backend : str
        Training backend asked for (one of :data:`APP_BACKENDS`).
    error : str
        Why the device does not train or connect, in words ("" when nothing is wrong):
        a refused login, a certificate the CA did not sign, an unreachable broker, too few
        windows, a missing backend.
    restarts : int
        Times the agent was started again after a failure since the settings last changed.
    retry_in_s : float or None
        Seconds until the next restart of a failed agent (None: none pending).
    sent : list of dict
        What left the device, round by round (:mod:`edge_client.sent_log`), oldest first.
    cost : list of str
        What sensing and rounds cost the device, and the battery's drain, in words
        (:func:`edge_client.cost.cost_words`).
    server : str
        The home server's state in words (:func:`edge_client.server_state.server_words`): "home
        server offline since 14:02", "waiting for 2 more devices", "next round at about 14:30";
        "" while the device does not take part or no status has arrived.
    server_down : bool
        True while the home server is offline or stopped refreshing its status.
    model_version : int or None
        The server's number of the shared model version the last update started from (None: the
        server did not say, or no update yet).
    """

    broker: str = "127.0.0.1:1883"
    state: str = "off"
    round: int | None = None
    last_accuracy: float | None = None
    take_part: bool = False
    charge_only: bool = True
    charging: bool = True
    client_id: str = ""
    federation: str = "default"
    username: str | None = None
    password_set: bool = False
    tls_ca: str | None = None
    backend: str = "auto"
    error: str = ""
    restarts: int = 0
    retry_in_s: float | None = None
    sent: list[dict[str, Any]] = field(default_factory=list)
    cost: list[str] = field(default_factory=list)
    server: str = ""
    server_down: bool = False
    model_version: int | None = None


def settings_view(cfg: AppConfig) -> FederationView:
    """The Federation screen's view of the settings in ``cfg`` (the state fields at their defaults)."""
    return FederationView(
        broker=cfg.broker,
        client_id=cfg.client_id,
        federation=cfg.federation,
        username=cfg.username,
        password_set=cfg.password_file is not None and cfg.password_file.is_file(),
        tls_ca=str(cfg.tls_ca) if cfg.tls_ca else None,
        backend=cfg.backend,
    )
