"""Command-line pieces shared by ``fedhar-client``, ``fedhar-coordinator`` and ``fedhar-simulate``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import tomli_w

from har_io.broker_config import MQTT_VERSIONS, BrokerConfig
from har_models.settings import from_mapping, to_mapping
from har_models.wire.chunking import DEFAULT_MAX_MESSAGE_BYTES

T = TypeVar("T")
log = logging.getLogger("fedhar.settings")


def option_flag(f: dataclasses.Field[Any]) -> str:
    """The command-line flag of a settings field: its metadata's ``flag`` or ``--field-name``."""
    return str(f.metadata.get("flag") or "--" + f.name.replace("_", "-"))


def cli_fields(cls: type) -> list[dataclasses.Field[Any]]:
    """The fields of settings dataclass ``cls`` offered on the command line."""
    return [f for f in dataclasses.fields(cls) if f.init and f.metadata.get("cli", True)]


def option_fields(cls: type) -> list[tuple[str, dataclasses.Field[Any], Any]]:
    """``(dest, field, type)`` of every command-line option of ``cls``; a ``kind="table"`` field's own fields are options
    with ``dest`` ``"table.field"`` and their own flag (``fedprox.mu`` is ``--prox-mu``)."""
    hints = typing.get_type_hints(cls)
    out: list[tuple[str, dataclasses.Field[Any], Any]] = []
    for f in cli_fields(cls):
        if f.metadata.get("kind") == "table":
            table = hints[f.name] if dataclasses.is_dataclass(hints[f.name]) else type(_default_of(f))  # a table built at run time
            out += [(f"{f.name}.{dest}", g, tp) for dest, g, tp in option_fields(table)]
        else:
            out.append((f.name, f, hints[f.name]))
    return out


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def add_settings_arguments(group: Any, cls: type, title: str = "") -> None:
    """Add one option per field of the settings dataclass ``cls`` (metadata from :func:`har_models.settings.doc`).

    Options default to "not given", so a TOML file (:func:`settings_from`) sits between the dataclass
    defaults and the command line; ``--help`` still shows each dataclass default.
    """
    for dest, f, tp in option_fields(cls):
        md = f.metadata
        default = _default_of(f)
        shown = json.dumps(to_mapping(default)) if dataclasses.is_dataclass(default) else default
        text = md.get("help", "")
        if md.get("unit"):
            text += f" [{md['unit']}]"
        if "default" not in text:  # a help that names its default (e.g. what None means) says it better than "None"
            text += f" (default {shown})"
        kw: dict[str, Any] = {"default": argparse.SUPPRESS, "dest": dest, "help": text}
        if md.get("kind") == "json":
            kw["type"] = _json_object
            kw["metavar"] = "JSON"
        elif tp is bool:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            base = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
            kw["type"] = base[0] if base[0] in (int, float, str) else str
            if md.get("choices"):
                kw["choices"] = md["choices"]
            else:  # the flag's name, not the dotted table path the value lands in
                kw["metavar"] = option_flag(f).lstrip("-").replace("-", "_").upper()
        group.add_argument(option_flag(f), **kw)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}); give an object such as '{{\"eta\": 1.0}}'") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object such as '{\"eta\": 1.0}'")
    return value


def read_settings_file(path: Path) -> dict[str, Any]:
    """Read a TOML settings file (``--config FILE``); ValueError naming the file and line if it is not TOML, OSError."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None


def settings_from(
    cls: type[T], args: argparse.Namespace | None = None, file: Mapping[str, Any] | None = None, what: str = "", **fixed: Any
) -> T:
    """Resolve a settings dataclass: its defaults, then ``file`` (a TOML mapping), then the options given, then ``fixed``.

    A ``kind="table"`` field is a TOML table. Keys of an earlier layout are moved into their tables
    with a warning: by the class's ``migrate(data, what)`` classmethod, and any flat key naming a
    table field by its flag (``prox_mu`` for ``--prox-mu``). Raises ValueError for an unknown key or a
    wrong type (named), a flat key given with its table entry, or a value the dataclass rejects.
    """
    data = dict(file or {})
    migrate = getattr(cls, "migrate", None)
    if migrate is not None:
        data = migrate(data, what or cls.__name__)
    merged: dict[str, Any] = _move_flat_keys(cls, data, what or cls.__name__)
    if args is not None:
        for dest, _, _ in option_fields(cls):
            if not hasattr(args, dest):
                continue
            table, _, name = dest.rpartition(".")
            into = merged
            for part in table.split(".") if table else ():
                into = into.setdefault(part, {})
                if not isinstance(into, dict):
                    raise ValueError(f"{what or cls.__name__}: {part!r} must be a table of settings, got {into!r}")
            into[name] = getattr(args, dest)
    return from_mapping(cls, merged, what or cls.__name__, **fixed)


def _move_flat_keys(cls: type, data: dict[str, Any], what: str) -> dict[str, Any]:
    """``data`` with each flat key named after a table field's flag moved into its table (see :func:`settings_from`)."""
    known = {f.name for f in dataclasses.fields(cls)}
    for dest, f, _ in option_fields(cls):
        table, _, name = dest.rpartition(".")
        flat = option_flag(f)[2:].replace("-", "_")
        if not table or flat not in data or flat in known:
            continue
        into: Any = data
        for part in table.split("."):
            into = into.get(part, {}) if isinstance(into, dict) else None
        if not isinstance(into, dict):
            continue  # from_mapping names the bad table
        new_key = f"[{table}] {name}"
        if name in into:
            raise ValueError(f"{what}: {flat!r} and {new_key} both given; keep only {new_key}")
        log.warning("%s: %r is the old name of %s; read as such (write it in the table)", what, flat, new_key)
        value = data.pop(flat)
        parent = data
        for part in table.split("."):
            parent[part] = dict(parent.get(part, {}))
            parent = parent[part]
        parent[name] = value
    return data


def write_settings_file(path: Path, settings: Mapping[str, Any]) -> None:
    """Write ``settings`` as TOML atomically (the run folder's record of the resolved configuration)."""
    from har_models.files import atomic_write_bytes

    atomic_write_bytes(path, tomli_w.dumps(dict(settings)))


def add_broker_arguments(ap: argparse.ArgumentParser, default: str | None = "127.0.0.1:1883", broker_help: str = "") -> None:
    """Broker address, credentials, TLS and message size options (same names in every program)."""
    g = ap.add_argument_group("broker")
    g.add_argument("--broker", default=default, help=broker_help or "MQTT broker HOST:PORT")
    g.add_argument("--username", default=None, help="MQTT user name (a device's user name is its client id)")
    g.add_argument("--password-file", type=Path, default=None, help="file holding the MQTT password")
    g.add_argument("--tls-ca", default=None, help="CA certificate: connect with TLS")
    g.add_argument("--tls-cert", default=None, help="client certificate (mutual TLS)")
    g.add_argument("--tls-key", default=None, help="client key (mutual TLS)")
    g.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES,
                   help=f"largest MQTT payload to publish; envelopes are chunked to fit. An MQTT 5 broker's stated maximum "
                   f"packet size wins when smaller (default {DEFAULT_MAX_MESSAGE_BYTES})")  # fmt: skip
    g.add_argument("--mqtt-version", choices=MQTT_VERSIONS, default="auto",
                   help="MQTT protocol: auto tries 5 (the broker then states its packet limit) and falls back to 3.1.1 "
                   "(default auto)")  # fmt: skip


def broker_from_args(args: argparse.Namespace, address: str | None = None) -> BrokerConfig:
    """The :class:`BrokerConfig` the options of :func:`add_broker_arguments` describe.

    Raises ValueError for a malformed address or inconsistent TLS options, OSError if the password file cannot be read.
    """
    password = args.password_file.read_text().strip() if args.password_file else None
    return BrokerConfig.parse(address or args.broker, username=args.username, password=password, tls_ca=args.tls_ca,
                              tls_cert=args.tls_cert, tls_key=args.tls_key, max_message_bytes=args.max_message_bytes,
                              mqtt_version=getattr(args, "mqtt_version", "auto"))  # fmt: skip


def setup_logging(level: str) -> None:
    """Log to stderr with timestamps; paho's own logger stays at WARNING."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("paho").setLevel(logging.WARNING)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def add_logging_arguments(ap: argparse.ArgumentParser, progress: bool = True) -> None:
    """Add ``--log-level`` and, with ``progress``, ``--no-progress`` (the options every long-running program has)."""
    ap.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS,
                    help="least severe log messages shown on stderr (default %(default)s; DEBUG adds every message received)")  # fmt: skip
    if progress:
        ap.add_argument("--no-progress", action="store_true",
                        help="no progress bar (for logs and services: the round lines are logged either way)")  # fmt: skip


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :mod:`x`, :func:`~a.b`, :data:`X`
_LITERAL = re.compile(r"``([^`]+)``")


def plain(text: str) -> str:
    """reST markup of a docstring made terminal text: ``x`` and :role:`x` become x (``~a.b`` keeps b)."""
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1] if m.group(0)[m.group(0).index("`") + 1] == "~" else m.group(1), text)
    return _LITERAL.sub(r"\1", text)


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except where there is none or the help already names it; description and epilog
    keep their line breaks (the exit-status table of :mod:`har_io.exit_codes`)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or action.default is False or action.default is argparse.SUPPRESS or "default" in text:
            return text
        return super()._get_help_string(action)
