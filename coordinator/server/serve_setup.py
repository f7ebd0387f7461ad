"""What ``serve`` settles once at start: the federation's settings from ``server.toml``, the run's id, a changed strategy."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from coordinator import state as run_state
from coordinator.config import CoordinatorConfig
from coordinator.rounds import policy_of
from coordinator.server.settings import SERVE_ROUNDS, ServeFile
from har_io.broker_config import BrokerConfig
from har_io.cli import settings_from
from har_models.wire.topics import check_client_id

log = logging.getLogger("fedhar.serve")

CONFIG_NAME = "server.toml"
"""The settings file in the data folder."""


def federation_config(file: ServeFile, data_dir: Path, broker: BrokerConfig, federation: str, run_id: str) -> CoordinatorConfig:
    """The federation's :class:`CoordinatorConfig` from ``server.toml``'s top-level keys.

    ``rounds`` is :data:`SERVE_ROUNDS` (a ``rounds`` key is ignored, with a warning), the run folder is
    ``<data>/run`` and the run resumes. No ``aggregation`` means this release's default. The quality guard
    is on unless ``[guard] enabled = false``: an unattended federation must not hand every device a
    collapsed version. Raises ValueError for an unknown key or bad value, or ``[schedule] min_clients``
    below the round policy's quorum (such a round could not change the model).
    """
    fed = CoordinatorConfig.migrate(dict(file.federation), f"{CONFIG_NAME} (federation settings)")
    fed["guard"] = {"enabled": True, **fed.get("guard", {})}
    if "rounds" in fed:
        log.warning("server.toml: rounds = %r is ignored by serve: a served federation has no last round", fed.pop("rounds"))
    cfg = settings_from(
        CoordinatorConfig, None, file=fed, what=f"{CONFIG_NAME} (federation settings)",
        run_dir=Path(data_dir) / "run", broker=broker, federation=federation, run_id=run_id, rounds=SERVE_ROUNDS, resume=True,
    )  # fmt: skip
    quorum = policy_of(cfg).quorum
    if file.schedule.min_clients < quorum:
        raise ValueError(
            f"{CONFIG_NAME}: [schedule] min_clients = {file.schedule.min_clients} is below the quorum "
            + (f"min_clients = {cfg.min_clients}" if quorum == cfg.min_clients else
               f"ceil([cohort] min_fraction x goal) = {quorum}")
            + "; a round started with fewer devices could not change the model: raise [schedule] min_clients"
        )  # fmt: skip
    return cfg


def run_id_of(data_dir: Path, name: str) -> str:
    """The run id kept in ``<data>/run``, or a new one (``<name>-YYYYmmdd-HHMMSS``) for a new data folder."""
    state = run_state.RunState(Path(data_dir) / "run")
    try:
        kept = state.get("run_id")
    finally:
        state.close()
    if isinstance(kept, str) and kept:
        return kept
    try:
        base = check_client_id(name)
    except ValueError:
        base = "serve"
    return f"{base}-{time.strftime('%Y%m%d-%H%M%S')}"


def archive_strategy_change(run_dir: Path, cfg: CoordinatorConfig, now: float | None = None, named: bool = True) -> str | None:
    """Take up a changed ``aggregation`` at start; the old strategy's name when it changed, else None.

    When ``run_dir/config.toml`` names another strategy: the file is kept as ``config.<stamp>.toml``, each
    round's saved strategy state is renamed ``strategy_state.<old>.<stamp>.safetensors`` (kept, not
    loaded), and ``config.toml`` is rewritten. A change named in ``server.toml`` is logged at INFO; a
    changed default (``named=False``) is a WARNING naming both and the line that keeps the old one.
    Raises OSError if the run folder cannot be written.
    """
    from har_io.cli import read_settings_file, write_settings_file

    path = Path(run_dir) / "config.toml"
    if not path.is_file():
        return None
    try:
        old = read_settings_file(path).get("aggregation")
    except ValueError as exc:
        log.warning("%s is unreadable (%s); it is written again with the settings in force", path, exc)
        write_settings_file(path, cfg.settings())
        return None
    if not isinstance(old, str) or old == cfg.aggregation:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    kept = path.with_name(f"config.{stamp}.toml")
    kept.write_bytes(path.read_bytes())
    moved = 0
    for name in (run_state.STRATEGY_STATE_FILE, run_state.LEGACY_SERVER_OPT_FILE):
        for file in sorted((Path(run_dir) / "models").glob(f"r*/{name}")):
            file.rename(file.with_name(f"strategy_state.{old}.{stamp}.safetensors"))
            moved += 1
    write_settings_file(path, cfg.settings())
    where = (f"{cfg.aggregation} starts from its initial state; the old settings are kept in {kept} and {moved} saved state "
             f"file(s) of {old} renamed to strategy_state.{old}.{stamp}.safetensors")  # fmt: skip
    if named:
        log.info("aggregation changed from %r to %r in server.toml: %s", old, cfg.aggregation, where)
    else:
        log.warning(
            "server.toml names no aggregation, and this release's default is %r, not %r as when this run started: "
            "the federation now uses %r (%s). The default changed because FedAvgM with server step 3 can collapse "
            "a federation of a few devices (docs/tuning/server-step.md). To keep %r, put aggregation = %r in server.toml",
            cfg.aggregation, old, cfg.aggregation, where, old, old,
        )  # fmt: skip
    return old


def changes(old: Any, new: Any, table: str) -> list[str]:
    """``[table] key old -> new`` for each field of the dataclasses ``old`` and ``new`` that differs."""
    return [
        f"[{table}] {f.name} {getattr(old, f.name)!r} -> {getattr(new, f.name)!r}"
        for f in dataclasses.fields(old)
        if getattr(old, f.name) != getattr(new, f.name)
    ]


def setting_words(text: str) -> str:
    """``text`` with each federation flag named as ``serve`` reads it: ``--min-clients`` -> ``min_clients in server.toml``.

    A table's setting (``--prox-mu``) reads ``[strategies.fedprox] mu in server.toml``.
    """
    import re

    from har_io.cli import option_fields, option_flag

    keys = {}
    for dest, f, _ in option_fields(CoordinatorConfig):
        table, _, key = dest.rpartition(".")
        keys[option_flag(f)] = f"[{table}] {key}" if table else key
    return re.sub(r"--[a-z][a-z0-9-]*", lambda m: f"{keys[m.group(0)]} in server.toml" if m.group(0) in keys else m.group(0), text)
