"""The federation's Mosquitto: accounts, ACL and configuration, as ``fedhar-coordinator broker`` and for the home server.

* :mod:`~coordinator.broker.settings`: :class:`BrokerSettings`, their checks, the folder's
  layout and its manifest (what a re-run keeps);
* :mod:`~coordinator.broker.render`: the text of ``acl`` and ``mosquitto.conf`` (pure);
* :mod:`~coordinator.broker.files`: files with the owner, group and mode the broker reads them
  by, replaced atomically under the folder's lock;
* :mod:`~coordinator.broker.passwords`: passwords made, hashed by ``mosquitto_passwd``, kept in
  ``credentials/``;
* :mod:`~coordinator.broker.certificates`: the openssl recipe and the broker's copies in ``tls/``;
* :mod:`~coordinator.broker.device_ca`: the device CA that signs and revokes the certificates of
  devices enrolled by certificate (``--device-cert-port``);
* :mod:`~coordinator.broker.accounts`: the folder written at once (:func:`generate`) or one
  device at a time (:func:`add_device`, :func:`remove_device`);
* :mod:`~coordinator.broker.bridge`: a regional broker for devices bridged to the coordinator's
  (:func:`init_bridge`; docs/scale.md, "Regional brokers");
* :mod:`~coordinator.broker.report`: what a run did, as text or JSON;
* :mod:`~coordinator.broker.cli`: ``fedhar-coordinator broker init|add|remove|rotate|list|bridge`` and the
  one-command form that ``firmware_scripts/mosquitto_config.py`` keeps.

Nothing here needs more than the standard library, ``har_models``' file and topic helpers and
Mosquitto's ``mosquitto_passwd``: an operator's machine without the coordinator extra can run it.
"""

from coordinator.broker.accounts import Outcome, add_device, configured_devices, generate, remove_device
from coordinator.broker.bridge import init_bridge
from coordinator.broker.passwords import find_mosquitto_passwd, password_file, read_password
from coordinator.broker.render import acl_text, bridge_text, bridge_topics, config_text
from coordinator.broker.settings import DEFAULTS, BrokerSettings, SetupError, read_settings

__all__ = [
    "DEFAULTS",
    "BrokerSettings",
    "Outcome",
    "SetupError",
    "acl_text",
    "add_device",
    "bridge_text",
    "bridge_topics",
    "config_text",
    "configured_devices",
    "find_mosquitto_passwd",
    "generate",
    "init_bridge",
    "password_file",
    "read_password",
    "read_settings",
    "remove_device",
]
