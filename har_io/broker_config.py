"""Where the broker is and how to log in to it: address, credentials, TLS, message size, MQTT version.

:class:`BrokerConfig` is checked when built, so a wrong option stops a program at start with the
option's name; :mod:`har_io.mqtt_link` reads it, nothing here opens a socket.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field

from har_models.wire.chunking import DEFAULT_MAX_MESSAGE_BYTES

MIN_CHUNK_BYTES = 16 * 1024
"""Smallest payload the link cuts chunks to after a broker refused bigger ones, and the smallest ``max_message_bytes`` (bytes)."""

MQTT_VERSIONS = ("auto", "5", "3.1.1")
"""Values of ``BrokerConfig.mqtt_version`` (and ``--mqtt-version``)."""


@dataclass(frozen=True)
class BrokerConfig:
    """Where and how to reach the broker.

    ``username``/``password``: per-device credentials (the ACL lets a device write only under its
    id); ``tls_ca`` enables TLS; ``tls_cert``/``tls_key`` for mutual TLS, both or neither;
    ``keepalive`` in s; ``max_message_bytes``: largest payload published (a smaller MQTT 5 broker
    limit wins); ``mqtt_version`` "auto" tries 5, then 3.1.1; ``enrolled``: the credentials came
    from an enrolment bundle (a refused login then says to ask the operator for a new bundle).

    Raises ValueError for TLS options without ``tls_ca``, a certificate without its key (or the
    reverse), a missing TLS file, an unknown ``mqtt_version`` or a ``max_message_bytes`` too small.
    """

    host: str = "127.0.0.1"
    port: int = 1883
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # never in a log line
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    keepalive: int = 30
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    mqtt_version: str = "auto"
    enrolled: bool = False

    def __post_init__(self) -> None:
        if (self.tls_cert or self.tls_key) and not self.tls_ca:
            raise ValueError(
                "--tls-cert/--tls-key need --tls-ca (the CA certificate that signed the broker's certificate): "
                "without it the connection would not use TLS at all"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key go together (mutual TLS); give both or neither")
        for flag, path in (("--tls-ca", self.tls_ca), ("--tls-cert", self.tls_cert), ("--tls-key", self.tls_key)):
            if path and not os.path.isfile(path):
                raise ValueError(f"{flag} {path}: no such file")
        if self.mqtt_version not in MQTT_VERSIONS:
            raise ValueError(f"mqtt version {self.mqtt_version!r} is unknown; use one of {', '.join(MQTT_VERSIONS)}")
        if self.max_message_bytes < MIN_CHUNK_BYTES:
            raise ValueError(f"--max-message-bytes {self.max_message_bytes} is below the smallest chunk of {MIN_CHUNK_BYTES} bytes")

    @classmethod
    def parse(cls, address: str, **kwargs: object) -> BrokerConfig:
        """From ``HOST:PORT`` (or ``HOST``, port 1883); ValueError for a bad port or an inconsistent option."""
        host, _, port = address.rpartition(":") if ":" in address else (address, "", "1883")
        try:
            p = int(port)
        except ValueError:
            raise ValueError(f"broker address {address!r}: port {port!r} is not a number; use HOST:PORT") from None
        if not 0 < p < 65536 or not host:
            raise ValueError(f"broker address {address!r}: use HOST:PORT with a port in 1..65535")
        return cls(host=host, port=p, **kwargs)  # type: ignore[arg-type]

    @property
    def address(self) -> str:
        """``HOST:PORT``, as messages name the broker."""
        return f"{self.host}:{self.port}"

    def credentials(self) -> tuple[str, str | None] | None:
        """``(username, password)`` to log in with, or None for an anonymous login."""
        return None if self.username is None else (self.username, self.password)

    def tls_context(self) -> ssl.SSLContext | None:
        """The TLS settings (None without ``tls_ca``): the broker's certificate signed by ``tls_ca`` and naming ``host``,
        TLS 1.2 or later, our own certificate with ``tls_cert``. ssl.SSLError or OSError for an unreadable file."""
        if not self.tls_ca:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname and CERT_REQUIRED are its defaults
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_verify_locations(cafile=self.tls_ca)
        if self.tls_cert:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        return ctx
