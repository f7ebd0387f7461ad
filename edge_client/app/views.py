"""What the app's screens show, as plain dataclasses the controller reports (no Kivy: the Android service writes them to a file)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edge_client.app.config import AppConfig


@dataclass
class LiveView:
    """What the Live screen shows: the newest window's predicted activity (None: no model or no window yet) and its
    probability, windows predicted since sensing started, the newest window's start (sensor time base), and why there
    is no prediction when there is none."""

    activity: str | None = None
    confidence: float = 0.0
    windows: int = 0
    t_start_ns: int = 0
    note: str = "waiting for the first 3 seconds of movement"


@dataclass
class FederationView:
    """What the Federation screen shows.

    ``state``: "off", "waiting for charger", "not enough data", "connecting", "connected", "training",
    "disconnected"; ``round``: the current one announced (or the last answered); ``last_accuracy``:
    of the last locally trained model on this device's test windows; ``password_set`` (the password
    is never part of a view); ``error``: why the device does not train or connect, in words ("" when
    nothing is wrong); ``restarts``: agent restarts after failures since the settings changed;
    ``retry_in_s``: until the next one; ``sent``: what left the device per round
    (:mod:`edge_client.sent_log`); ``cost``: :func:`edge_client.cost.cost_words`; ``server``:
    :func:`edge_client.server_state.server_words` ("" while not taking part or no status);
    ``server_down``; ``model_version``: the server's number of the model the last update started from.
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
    return FederationView(broker=cfg.broker, client_id=cfg.client_id, federation=cfg.federation, username=cfg.username,
                          password_set=cfg.password_file is not None and cfg.password_file.is_file(),
                          tls_ca=str(cfg.tls_ca) if cfg.tls_ca else None, backend=cfg.backend)  # fmt: skip
