"""The app's settings (:class:`AppConfig`), the constants both of its processes share, and where its data lives.

Nothing here imports Kivy or PyTorch: the UI, the Android sensing service and the tests read the same settings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from har_models.data.labels import LabelSet

MIN_TRAIN_WINDOWS = 10
"""Fewest recorded training windows before the device offers to take part."""

TRAIN_FRACTION = 0.8
"""Share of the recorded windows that become training windows (the rest are the local test set)."""

APP_BACKENDS = ("auto", "torch", "executorch", "executorch-android", "numpy")
"""Training backends the app's settings may name; "auto" leaves the choice to the client."""

PASSWORD_FILE = "credentials/mqtt.password"
"""Where the app keeps the broker password, relative to its private folder (mode 0600, folder 0700)."""

CREDENTIALS_DIR = "credentials"
"""The app's folder of secrets and certificates, relative to its private folder (mode 0700): the password and an enrolled CA."""
ACCEPTED_MARK = "credentials/accepted"
"""Present once the broker accepted the stored password (removed with each new one): a refused bundle that the broker
accepted before was re-issued, renamed or revoked since; one it never accepted is not the device's current bundle."""
ENROLLED_MARK = "credentials/enrolled"
"""Present while the stored password came from an enrolment bundle (a typed password removes it): a refused login
then asks for a new bundle, since nobody on the device typed anything to check."""


@dataclass
class AppConfig:
    """Settings of the app on one device.

    Parameters
    ----------
    state_dir : Path
        The device's store (windows, model, recorded log); survives restarts.
    labels : LabelSet
        Activities the owner can record.
    client_id : str
        The device's id in the federation (its MQTT user name).
    broker : str
        ``host:port`` of the broker.
    federation : str
        Federation name (topic prefix).
    max_windows : int
        Bound of the recorded-window log (see :class:`~edge_client.window_log.WindowLog`).
    split_seed : int
        Seed of the 80/20 split of recorded windows.
    username, password_file, tls_ca : optional
        Broker credentials, as ``fedhar-client`` takes them (the password is read from its
        file when the agent starts, never kept in the settings).
    backend : str
        Training backend, one of :data:`APP_BACKENDS` ("auto": the client's own choice).
    timeline_days : float
        Days the recognised timeline and the corrections are kept (90).
    raw_days : float
        Days the raw samples behind the timeline are kept: how long a stretch can be corrected
        into training windows (2; about 100 MB a day of sensing). Both are defaults: the keep
        periods set on the History screen are kept with the timeline and win.
    window_size : (int, int) or None
        The window's width and height in pixels; None: Kivy's 800x600 where it fits the
        display, else the display's usable size (:mod:`edge_client.app.window_size`).
    fullscreen : bool
        Open the window full screen (the display's own resolution).
    """

    state_dir: Path
    labels: LabelSet
    client_id: str
    broker: str = "127.0.0.1:1883"
    federation: str = "default"
    max_windows: int = 20_000
    split_seed: int = 1
    username: str | None = None
    password_file: Path | None = None
    tls_ca: Path | None = None
    backend: str = "auto"
    timeline_days: float = 90.0
    raw_days: float = 2.0
    window_size: tuple[int, int] | None = None
    fullscreen: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def default_data_dir() -> Path:
    """The platform's folder for app data: the app's private storage on Android, else ``$XDG_DATA_HOME`` or ~/.local/share."""
    try:
        from android.storage import app_storage_path  # python-for-android only

        return Path(app_storage_path())
    except ImportError:
        return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
