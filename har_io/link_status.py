"""The state of an MQTT link's connection, and why an attempt failed, in words a person can act on."""

from __future__ import annotations

import errno
import socket
import ssl
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkStatus:
    """The state of a link's connection, as a screen or a log shows it (:meth:`har_io.mqtt_link.MqttLink.status`).

    ``error``: why the last attempt failed in plain words, None once connected; ``failures`` since
    the last connection; ``fatal``: refused for good (login, TLS); ``retry_in_s``: paho's wait before
    the next attempt, None when connected, fatal or before any failure.
    """

    connected: bool
    error: str | None
    failures: int
    fatal: bool
    retry_in_s: float | None


AUTH_REFUSALS = frozenset(
    {"Bad user name or password", "Not authorized", "Bad authentication method", "Banned", "Client identifier not valid"}
)
"""CONNACK reason names of a login the broker will not take (retrying cannot help)."""
TRANSIENT_TLS_ERRORS = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLWantReadError, ssl.SSLWantWriteError, ssl.SSLSyscallError)
"""TLS errors of a connection that broke off, not of a certificate: paho tries again after them."""


def describe_refusal(reason: str) -> str:
    """Plain words for a CONNACK refusal named ``reason`` (paho's name): ``"login refused: ..."`` for a login the broker
    will not take, else ``"broker refused the connection: ..."``."""
    if reason == "Not authorized":  # what Mosquitto answers to a wrong password, an unknown or a revoked user
        return "login refused: not authorised (check the user name and password)"
    if reason in AUTH_REFUSALS:
        return f"login refused: {reason.lower()}"
    return f"broker refused the connection: {reason.lower()}"


def describe_connect_failure(exc: BaseException, host: str, port: int, timeout_s: float | None = None, tls: bool = False) -> str:
    """Plain words for why opening a connection to ``host:port`` raised ``exc`` (TCP, DNS or TLS; ``tls``: a reset in the
    handshake hints at a plain port), e.g. ``"DNS: unknown host 'HOST'"``, ``"broker unreachable: connection refused at
    HOST:PORT"``, ``"TLS: certificate verify failed (wrong CA?)"``; else ``"connection failed: <type>: <message>"``."""
    where = f"{host}:{port}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        text = str(exc.verify_message or exc).lower()
        if "hostname" in text or "ip address mismatch" in text:
            return f"TLS: the broker's certificate is not valid for {host!r} (wrong host name?)"
        if "expired" in text:
            return "TLS: the broker's certificate has expired"
        return "TLS: certificate verify failed (wrong CA?)"
    if isinstance(exc, TRANSIENT_TLS_ERRORS):
        return "TLS: the broker ended the handshake (plain MQTT port, or it refused our certificate?)"
    if isinstance(exc, ssl.SSLError):
        reason = str(exc.reason or exc).lower().replace("_", " ")
        if "wrong version number" in reason or "record layer failure" in reason:
            return f"TLS: {where} does not speak TLS (a plain MQTT port?)"
        return f"TLS: {reason}"
    if isinstance(exc, socket.gaierror):
        return f"DNS: unknown host {host!r}"
    if isinstance(exc, ConnectionRefusedError):
        return f"broker unreachable: connection refused at {where}"
    if isinstance(exc, ConnectionResetError) and tls:  # Mosquitto resets a TLS hello on a plain listener
        return f"TLS: the broker at {where} reset the connection in the handshake (a plain MQTT port?)"
    if isinstance(exc, TimeoutError):
        within = f" within {timeout_s:g} s" if timeout_s else ""
        return f"broker unreachable: no answer from {where}{within}"
    if isinstance(exc, OSError):
        words = exc.strerror or errno.errorcode.get(exc.errno or 0, "") or str(exc)
        return f"broker unreachable: {words[:1].lower()}{words[1:]} ({where})"
    return f"connection failed: {type(exc).__name__}: {exc}"


def describe_early_close(host: str, port: int, reason: str, tls: bool) -> str:
    """Plain words for a broker that closed the connection after TCP connect and before its CONNACK.

    ``reason`` is paho's disconnect reason name; without TLS the likeliest cause is a TLS port.
    """
    why = "" if reason in ("", "Unspecified error", "Success") else f" ({reason})"
    hint = "" if tls else "; a TLS port? then give --tls-ca"
    return f"the broker at {host}:{port} closed the connection before accepting it{why}{hint}"
