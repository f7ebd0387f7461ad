"""A regional broker bridged to the coordinator's: both folders written by one command.

``fedhar-coordinator broker bridge init`` gives the coordinator's broker folder an account whose ACL
allows exactly the bridged topics, and writes the regional folder (its own devices, ACL and TLS,
managed later like any other) whose ``mosquitto.conf`` ends with the bridge. docs/scale.md, "Regional brokers".
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from coordinator.broker.accounts import Outcome, generate
from coordinator.broker.files import folder_lock, write_file
from coordinator.broker.passwords import read_password
from coordinator.broker.settings import TLS_DIR, UPSTREAM_SECRET, SetupError, checked_id, read_settings

BRIDGE_PREFIX = "bridge-"
"""A bridge account's user name is this prefix and the region's name (e.g. ``bridge-north``)."""


def bridge_user(name: str) -> str:
    """The upstream account of the regional broker called ``name``: ``bridge-<name>``; SetupError if not a valid id."""
    return checked_id(BRIDGE_PREFIX + name, f"--name {name!r}")


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
    """Write (or update) the bridged pair: the bridge account in ``upstream_dir``, the regional folder ``regional``; both outcomes.

    Re-running keeps every password; ``broker rotate --out UPSTREAM bridge-NAME`` and this command again
    renew the bridge's. ``given`` holds the regional broker's own settings (its federation is the
    upstream's); ``upstream_ca`` makes the bridge use TLS (copied to ``tls/upstream-ca.crt``).

    Raises SetupError if ``upstream_dir`` is not a broker folder, the folders are the same, ``given``
    names another federation, a device id is a service account's, the address is not ``HOST:PORT``, the
    CA cannot be read, or ``mosquitto_passwd`` fails.
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
