"""A regional broker bridged to the coordinator's: both folders written by one command.

``fedhar-coordinator broker bridge init`` gives the coordinator's broker folder (``upstream``)
an account for the bridge, whose ACL allows exactly the bridged topics
(:func:`coordinator.broker.render.bridge_topics`), and writes the regional folder: a broker
folder like any other (its own device accounts, ACL and TLS, managed later with
``broker add|remove|rotate --out REGIONAL``) whose ``mosquitto.conf`` ends with the bridge
(:func:`coordinator.broker.render.bridge_text`). Devices connect to the regional broker; the
coordinator stays on its own. docs/scale.md, section "Regional brokers".
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from coordinator.broker.accounts import Outcome, generate
from coordinator.broker.files import folder_lock, write_file
from coordinator.broker.passwords import read_password
from coordinator.broker.settings import TLS_DIR, UPSTREAM_SECRET, SetupError, read_settings
from har_models.wire.topics import check_client_id

BRIDGE_PREFIX = "bridge-"
"""A bridge account's user name is this prefix and the region's name (e.g. ``bridge-north``)."""


def bridge_user(name: str) -> str:
    """The upstream account of the regional broker called ``name``: ``bridge-<name>``.

    Raises
    ------
    SetupError
        If the result is not a valid id (letters, digits, ``_ . -``; at most 64 characters).
    """
    try:
        return check_client_id(BRIDGE_PREFIX + name)
    except ValueError as exc:
        raise SetupError(f"--name {name!r}: {exc}") from None


def init_bridge(
    regional: Path,
    upstream_dir: Path,
    upstream: str,
    name: str,
    given: dict[str, Any],
    clients: list[str],
    upstream_ca: Path | None = None,
    mosquitto_passwd: str | None = None,
) -> tuple[Outcome, Outcome]:
    """Write (or update) the bridged pair: the bridge account in ``upstream_dir``, the regional folder ``regional``.

    Re-running keeps every password (the bridge's too) and the regional folder's devices and
    settings; ``broker rotate --out UPSTREAM bridge-NAME`` followed by this command again gives
    the bridge a new password on both sides.

    Parameters
    ----------
    regional : Path
        The regional broker's folder (created if missing).
    upstream_dir : Path
        The coordinator's broker folder, written by ``fedhar-coordinator broker init``.
    upstream : str
        ``HOST:PORT`` where the regional broker reaches the coordinator's broker (its TLS
        listener when ``upstream_ca`` is given).
    name : str
        The region's name; the bridge logs in upstream as ``bridge-<name>``.
    given : dict
        The regional broker's own settings from the command line (keys of
        :data:`~coordinator.broker.settings.DEFAULTS`, None = not given); its federation is
        the upstream folder's.
    clients : list of str
        Device ids to add to the regional broker.
    upstream_ca : Path, optional
        CA certificate (PEM) that signed the upstream broker's certificate; the bridge then uses
        TLS and checks the host name of ``upstream`` against the certificate. Copied into the
        regional folder's ``tls/upstream-ca.crt``.
    mosquitto_passwd : str, optional
        Path of ``mosquitto_passwd``.

    Returns
    -------
    (Outcome, Outcome)
        What was done to the upstream folder, then to the regional one.

    Raises
    ------
    SetupError
        If ``upstream_dir`` is not a broker folder, the two folders are the same, ``given``
        names another federation than the upstream's, a device id is a service account's, the
        address is not ``HOST:PORT``, the CA cannot be read, or ``mosquitto_passwd`` fails.
    """
    regional = regional.expanduser().resolve()
    upstream_dir = upstream_dir.expanduser().resolve()
    if regional == upstream_dir:
        raise SetupError(f"--out and --upstream-dir are both {regional}: the regional broker needs its own folder")
    up = read_settings(upstream_dir)
    if given.get("federation") not in (None, up.federation):
        raise SetupError(f"--federation {given['federation']!r}: the upstream broker serves federation {up.federation!r}; leave it out")
    user = bridge_user(name)
    up_outcome = generate(upstream_dir, {"bridge_users": tuple(sorted({*up.bridge_users, user}))}, [],
                          mosquitto_passwd=mosquitto_passwd)  # fmt: skip
    password = read_password(upstream_dir, user)

    regional.mkdir(parents=True, exist_ok=True)
    (regional / "credentials").mkdir(mode=0o700, exist_ok=True)
    ca_copy: str | None = None
    with folder_lock(regional):
        write_file(regional / UPSTREAM_SECRET, password + "\n", 0o600)
        if upstream_ca is not None:
            src = upstream_ca.expanduser().resolve()
            if not src.is_file():
                raise SetupError(f"--upstream-ca {upstream_ca}: no readable file there")
            tls = regional / TLS_DIR
            tls.mkdir(mode=0o700, exist_ok=True)
            dst = tls / "upstream-ca.crt"
            if src != dst:
                shutil.copyfile(src, dst)
                dst.chmod(0o644)
            ca_copy = str(dst)
    regional_given = {**given, "federation": up.federation, "upstream": upstream, "upstream_user": user}
    if ca_copy is not None:
        regional_given["upstream_ca"] = ca_copy
    reg_outcome = generate(regional, regional_given, clients, mosquitto_passwd=mosquitto_passwd)
    return up_outcome, reg_outcome
