"""Command-line pieces shared by ``fedhar-client``, ``fedhar-coordinator`` and ``fedhar-simulate``."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from har_io.mqtt_link import BrokerConfig
from har_models.protocol import DEFAULT_MAX_MESSAGE_BYTES


def add_broker_arguments(ap: argparse.ArgumentParser, default: str | None = "127.0.0.1:1883", broker_help: str = "") -> None:
    """Broker address, credentials, TLS and message size options (same names in every program)."""
    g = ap.add_argument_group("broker")
    g.add_argument("--broker", default=default, help=broker_help or "MQTT broker HOST:PORT")
    g.add_argument("--username", default=None, help="MQTT user name (a device's user name is its client id)")
    g.add_argument("--password-file", type=Path, default=None, help="file holding the MQTT password")
    g.add_argument("--tls-ca", default=None, help="CA certificate: connect with TLS")
    g.add_argument("--tls-cert", default=None, help="client certificate (mutual TLS)")
    g.add_argument("--tls-key", default=None, help="client key (mutual TLS)")
    g.add_argument(
        "--max-message-bytes",
        type=int,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        help=f"largest MQTT payload to publish; envelopes are chunked to fit (default {DEFAULT_MAX_MESSAGE_BYTES})",
    )


def broker_from_args(args: argparse.Namespace, address: str | None = None) -> BrokerConfig:
    """The :class:`BrokerConfig` the options of :func:`add_broker_arguments` describe.

    Raises
    ------
    ValueError
        For a malformed address.
    OSError
        If the password file cannot be read.
    """
    password = args.password_file.read_text().strip() if args.password_file else None
    return BrokerConfig.parse(
        address or args.broker,
        username=args.username,
        password=password,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        max_message_bytes=args.max_message_bytes,
    )


def setup_logging(level: str) -> None:
    """Log to stderr with timestamps; paho's own logger stays at WARNING."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("paho").setLevel(logging.WARNING)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except where there is none or the help already names it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or action.default is False or action.default is argparse.SUPPRESS or "default" in text:
            return text
        return super()._get_help_string(action)
