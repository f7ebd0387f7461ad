"""The app's settings (:class:`AppConfig`), the constants both of its processes share, and where its data lives (no Kivy or PyTorch)."""

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
"""Present once the broker accepted the stored password (removed with each new one): a refused bundle accepted before was
re-issued, renamed or revoked since; one never accepted is not the device's current bundle."""
ENROLLED_MARK = "credentials/enrolled"
"""Present while the stored password came from an enrolment bundle: a refused login then asks for a new bundle."""


@dataclass
class AppConfig:
    """Settings of the app on one device.

    ``state_dir``: the device's store; ``client_id``: its id (MQTT user name); ``max_windows``: bound of
    the recorded-window log; ``split_seed``: of the 80/20 split; ``username``, ``password_file``,
    ``tls_ca``: as ``fedhar-client`` takes them (the password is read when the agent starts, never
    kept here); ``backend``: :data:`APP_BACKENDS`; ``timeline_days``/``raw_days``: default keep
    periods of the timeline and of its raw samples (about 100 MB a day), those set on the History
    screen win; ``window_size`` (None: :mod:`edge_client.app.window_size` decides) and ``fullscreen``.
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
