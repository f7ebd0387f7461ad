#!/usr/bin/env python3
"""Write a Mosquitto configuration for one fedhar federation: per-device passwords, ACLs, optional TLS.

Usage (from a checkout; needs only Python and the ``mosquitto_passwd`` tool that ships with Mosquitto)::

    python3 firmware_scripts/mosquitto_config.py --federation home --clients phone-anna,pi-kitchen --out broker/

The output folder then holds:

* ``mosquitto.conf``: listeners (plain, and TLS when a certificate is given), no anonymous
  access, the password and ACL files, a packet limit sized for fedhar's chunked models,
  persistence under ``data/``, and the broker's ``pid_file`` (``data/mosquitto.pid``), through which
  a reload finds the running broker;
* ``acl``: the coordinator may read and write the whole federation; the read-only monitor
  account (``--monitor-user``, default ``monitor``) may read the whole federation and write
  nothing, so a status page can watch it without logging in as the coordinator (which would
  disconnect the running coordinator: one session per user name); a device may write only its
  own status, update and program-request topics and read the round, the coordinator's status,
  the global model, and its own personalised model, receipts and programs. Every rule is a
  ``topic`` line under its ``user``; a ``%u`` pattern would apply to the monitor too;
* ``passwd``: hashed by ``mosquitto_passwd`` (this script never hashes a password itself);
* ``credentials/<user>.password``: each user's password (mode 0600), to copy to its device;
* ``tls/``: copies of the ``--tls-cert``, ``--tls-key`` and ``--tls-ca`` files, which
  ``mosquitto.conf`` names (the key mode 0640, group of ``--broker-user`` when run as root), so the
  broker, which reads them after switching to its own account, never depends on where or with
  which permissions they were made (``/root``, a home folder);
* ``fedhar-broker.json``: the settings, so a re-run with only ``--out`` and new ``--clients``
  keeps everything else.

Re-running adds clients and keeps every existing password, unless ``--rotate`` asks for new
ones; ``--revoke`` removes devices. The coordinator's and the monitor's accounts are created on
the first run and on a re-run of a folder that lacks them. Reload a running broker afterwards
(``kill -HUP $(cat <out>/data/mosquitto.pid)``). On that reload Mosquitto 2 closes the live session of
a revoked device (without its last will) and refuses its old password from then on.

This script is a thin wrapper, kept so that existing instructions work: the generator lives in
the package (:mod:`coordinator.broker`), where an installed fedhar runs it as
``fedhar-coordinator broker init|add|remove|rotate|list``; the options here are those of
:func:`coordinator.broker.cli.build_parser`.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This checkout's package first, so the script runs the generator it ships with (not an older installed fedhar's)
# and runs without `pip install`: the generator needs only the standard library.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from coordinator.broker.cli import generator_main as main

if __name__ == "__main__":
    sys.exit(main())
