"""``python -m simulation.probe``: a quick in-process FedAvg probe for choosing lr, local epochs, batch, lr schedule and rounds.

No broker, no processes: the main job's windows, split, CNN, loss, local SGD and server
strategies as plain function calls; for tuning only (reported figures come from
``fedhar-simulate``).

Settings are chosen on a **validation split carved from the training windows** (leak-free
:func:`har_models.data.splits.block_split`, seed ``split_seed + 1000``): the global model's
macro-F1 on the union of validation parts decides; test figures are printed beside.

The grid is the product of ``--lrs``, ``--epochs``, ``--servers``, ``--batch-sizes`` and
``--schedules`` (``--max-epochs // E`` rounds each), or the ``--candidate`` texts given.
``--centralised`` adds the same CNN trained centrally as the target. ``--json FILE`` writes every curve.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from coordinator import strategies
from coordinator.strategies import FedAvg, Federation, Strategy
from coordinator.strategies.fedopt import FedOpt, ServerOptSettings
from coordinator.updates import ClientUpdate
from har_io.exit_codes import Exit
from har_models.data.splits import DEFAULT_SPLIT, DEFAULT_SPLIT_SEED, SplitSpec, block_split
from har_models.data.subjects import DEFAULT_HAPT, parse_source, subject_sources
from har_models.data.windowing import ChannelStats, WindowSet
from har_models.nn.metrics import summarise
from har_models.nn.model import ArchSpec, init_state
from har_models.nn.training import TrainConfig, balanced_class_weights, evaluate, make_loss, train_local
from har_models.settings import LR_SCHEDULES, LocalTraining, LrSchedule
from har_models.wire.messages import TrainingPlan

log = logging.getLogger("fedhar.probe")


@dataclass(frozen=True)
class ProbeSetting:
    """One point of the search.

    Parameters
    ----------
    rounds : int
        Rounds to run (every round is measured).
    server : str
        A strategy of :func:`probe_servers`.
    server_lr, server_momentum : float
        eta and beta of a server optimiser; ``server_lr`` None: the optimiser's default.
    schedule : LrSchedule
        The client lr across the rounds, as the coordinator applies it.
    """

    lr: float
    local_epochs: int
    rounds: int
    server: str = FedAvg.name
    server_lr: float | None = 1.0
    server_momentum: float = 0.9
    batch_size: int = LocalTraining.batch_size
    schedule: LrSchedule = field(default_factory=LrSchedule)

    @property
    def label(self) -> str:
        """Short name, e.g. ``lr=0.05 E=1 fedavgm(eta=1, beta=0.9)``, with the batch and schedule when not the defaults."""
        if _takes_server_opt(self.server):
            eta = "auto" if self.server_lr is None else f"{self.server_lr:g}"
            srv = f" {self.server}(eta={eta}, beta={self.server_momentum:g})"
        else:
            srv = "" if self.server == FedAvg.name else f" {self.server}"
        extra = "" if self.batch_size == LocalTraining.batch_size else f" B={self.batch_size}"
        extra += "" if self.schedule.is_constant else f" {self.schedule.label()}"
        return f"lr={self.lr:g} E={self.local_epochs}{srv}{extra}"

    def round_lr(self, round_: int) -> float:
        """The client lr of round ``round_`` under :attr:`schedule`."""
        return self.lr * self.schedule.factor(round_, self.rounds)

    def strategy(self) -> Strategy:
        """A fresh strategy object for the server step; ValueError for an unknown name."""
        if _takes_server_opt(self.server):
            return strategies.make_strategy(self.server, ServerOptSettings(lr=self.server_lr, momentum=self.server_momentum))
        return strategies.make_strategy(self.server)


def _takes_server_opt(name: str) -> bool:
    cls = strategies.REGISTRY.get(name)
    return cls is not None and cls.settings_type is ServerOptSettings


def probe_servers() -> tuple[str, ...]:
    """Registered strategies whose clients train plainly (their plan is the base plan), as the probe trains them."""
    return tuple(n for n in strategies.names() if strategies.make_strategy(n).configure_fit(0, TrainingPlan()) == TrainingPlan())


@dataclass
class ClientData:
    """A client's windows for the probe: training (validation carved out), validation and test."""

    train: WindowSet
    val: WindowSet
    test: WindowSet


def load_clients(sources: dict[str, str], split: SplitSpec, val_fraction: float = 0.2) -> dict[str, ClientData]:
    """Each client's train/test under ``split``, with a leak-free validation block carved from its train part.

    ValueError if ``val_fraction`` is outside (0, 1).
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"load_clients: val_fraction must be in (0, 1), got {val_fraction}")
    out = {}
    for cid, text in sources.items():
        src = parse_source(text, split)
        train, test = src.train_test()
        assert train.t_start_ns is not None
        tr, va = block_split(train.y, train.t_start_ns, val_fraction, split.seed + 1000)
        out[cid] = ClientData(train.subset(tr), train.subset(va), test)
    return out


def _spec_and_unions(clients: dict[str, ClientData], conv_filters: int, dense_units: int) -> tuple[ArchSpec, WindowSet, WindowSet]:
    """The CNN (normalised with the union of the training parts' channel statistics) and the union validation and test sets."""
    labels = next(iter(clients.values())).train.labels
    stats = None
    for c in clients.values():
        if len(c.train):
            s = ChannelStats.of(c.train.x)
            stats = s if stats is None else stats + s
    assert stats is not None
    mean, std = stats.mean_std()
    spec = ArchSpec(n_classes=len(labels), conv_filters=conv_filters, dense_units=dense_units, input_mean=mean, input_std=std)
    val = WindowSet.concat([c.val for c in clients.values()], labels)
    test = WindowSet.concat([c.test for c in clients.values()], labels)
    return spec, val, test


def run_centralised(
    clients: dict[str, ClientData], epochs: int, lr: float = LocalTraining.lr, batch_size: int = LocalTraining.batch_size,
    conv_filters: int = ArchSpec.conv_filters, dense_units: int = ArchSpec.dense_units, seed: int = 1,
) -> list[dict[str, Any]]:
    """The same CNN trained centrally on the union of the clients' training parts, ``epochs`` passes.

    Rows as :func:`run_setting`'s, ``round`` counting passes.
    """
    spec, val, test = _spec_and_unions(clients, conv_filters, dense_units)
    labels = spec.n_classes
    train = WindowSet.concat([c.train for c in clients.values()], next(iter(clients.values())).train.labels)
    loss = make_loss(balanced_class_weights(train.y, labels))
    state = init_state(spec, seed)
    rows = []
    for e in range(epochs):
        t0 = time.monotonic()
        state = train_local(spec, state, train, TrainConfig(1, lr, batch_size, seed=seed * 1000 + e), loss).state
        train_s = time.monotonic() - t0
        gv, gt = summarise(evaluate(spec, state, val)), summarise(evaluate(spec, state, test))
        rows.append({"round": e, "val_f1": gv["macro_f1"], "val_acc": gv["accuracy"], "test_f1": gt["macro_f1"],
                     "test_acc": gt["accuracy"], "seconds": train_s, "lr": lr})
        log.info("centralised pass %d: val F1 %.3f, test F1 %.3f (%.0f s)", e, gv["macro_f1"], gt["macro_f1"], train_s)
    return rows


def run_setting(
    clients: dict[str, ClientData], p: ProbeSetting, conv_filters: int = ArchSpec.conv_filters,
    dense_units: int = ArchSpec.dense_units, seed: int = 1,
) -> list[dict[str, Any]]:
    """Strategy ``p.server`` for ``p.rounds`` rounds; one row per round.

    Rows: ``{"round", "val_f1", "val_acc", "test_f1", "test_acc", "seconds", "lr", "server_eta"}``
    (``server_eta``: a server optimiser's step that round, else None); fewer rounds when a server
    optimiser diverged (logged).
    """
    spec, val, test = _spec_and_unions(clients, conv_filters, dense_units)
    state = init_state(spec, seed)
    losses = {cid: make_loss(balanced_class_weights(c.train.y, spec.n_classes)) for cid, c in clients.items()}
    server = p.strategy()
    rows = []
    for r in range(p.rounds):
        t0 = time.monotonic()
        updates = []
        for k, (cid, c) in enumerate(clients.items()):
            if not len(c.train):
                continue
            cfg = TrainConfig(p.local_epochs, p.round_lr(r), p.batch_size, seed=seed * 1_000_003 + r * 1009 + k)
            trained = train_local(spec, state, c.train, cfg, losses[cid]).state
            updates.append(ClientUpdate(cid, r, 0, len(c.train), len(c.test), trained, None))
        try:
            state = server.aggregate_fit(r, Federation(spec, spec, state), updates).global_state
        except ValueError as exc:  # a diverged server step: this setting's curve ends here
            log.warning("%s round %d: %s; the setting stops", p.label, r, exc)
            break
        train_s = time.monotonic() - t0
        gv, gt = summarise(evaluate(spec, state, val)), summarise(evaluate(spec, state, test))
        eta_t = server.last_eta if isinstance(server, FedOpt) else None
        rows.append({"round": r, "val_f1": gv["macro_f1"], "val_acc": gv["accuracy"], "test_f1": gt["macro_f1"],
                     "test_acc": gt["accuracy"], "seconds": train_s, "lr": p.round_lr(r), "server_eta": eta_t})
        log.info("%s round %d: val F1 %.3f, test F1 %.3f, server step %s (%.0f s)", p.label, r, gv["macro_f1"],
                 gt["macro_f1"], "-" if eta_t is None else f"{eta_t:.2f}", train_s)
    return rows


def choose(results: Sequence[tuple[ProbeSetting, list[dict[str, Any]]]], max_epochs: int) -> tuple[ProbeSetting, int, dict[str, Any]]:
    """The (setting, rounds) with the highest validation macro-F1 among those with ``rounds x E <= max_epochs``.

    Ties go to fewer epochs; a setting whose lr changes across rounds counts only at its last
    round. ValueError if nothing fits the budget.
    """
    best: tuple[float, int, ProbeSetting, int, dict[str, Any]] | None = None
    for p, rows in results:
        for row in rows:
            if not p.schedule.is_constant and row["round"] != p.rounds - 1:
                continue
            epochs = (row["round"] + 1) * p.local_epochs
            if epochs > max_epochs:
                continue
            key = (row["val_f1"], -epochs)
            if best is None or key > (best[0], best[1]):
                best = (row["val_f1"], -epochs, p, row["round"] + 1, row)
    if best is None:
        raise ValueError(f"choose: no setting fits {max_epochs} local epochs")
    return best[2], best[3], best[4]


def parse_servers(text: str) -> list[tuple[str, float | None, float]]:
    """``(name, eta, beta)`` of each ``NAME[:ETA[:BETA]]`` in the comma-separated ``--servers`` text.

    A left-out eta or beta is the coordinator's default for that optimiser (FedExP: None, its cap
    sized by the number of clients). ValueError for an unknown name or a bad number.
    """
    out = []
    for part in text.split(","):
        name, *nums = part.split(":")
        if name not in probe_servers():
            raise ValueError(f"unknown server {name!r}; choose {', '.join(probe_servers())}")
        default = strategies.make_strategy(name)
        opt = default if isinstance(default, FedOpt) else None
        auto = opt is not None and opt.sized_cap  # FedExP's default cap follows the number of clients: keep it
        eta = float(nums[0]) if nums else (None if auto else opt.eta if opt else ProbeSetting.server_lr)
        beta = float(nums[1]) if len(nums) > 1 else (opt.beta if opt else ProbeSetting.server_momentum)
        out.append((name, eta, beta))
    return out


def parse_schedule(text: str) -> LrSchedule:
    """The :class:`LrSchedule` of ``constant``, ``cosine[:WARMUP[:FLOOR]]`` or ``step[:WARMUP[:EVERY[:GAMMA]]]``; ValueError if invalid."""
    kind, *nums = text.strip().split(":")
    if kind not in LR_SCHEDULES:
        raise ValueError(f"unknown lr schedule {kind!r}; choose {', '.join(LR_SCHEDULES)}")
    names = {"constant": ("warmup_rounds",), "cosine": ("warmup_rounds", "min_factor"),
             "step": ("warmup_rounds", "step_every", "step_gamma")}[kind]
    if len(nums) > len(names):
        raise ValueError(f"lr schedule {text!r}: {kind} takes at most {len(names)} numbers ({', '.join(names)})")
    kw: dict[str, Any] = {}
    for name, num in zip(names, nums, strict=False):
        try:
            kw[name] = int(num) if name in ("warmup_rounds", "step_every") else float(num)
        except ValueError:
            raise ValueError(f"lr schedule {text!r}: {name} {num!r} is not a number") from None
    return LrSchedule(kind, **kw)  # type: ignore[arg-type]


_CANDIDATE_KEYS = ("server", "lr", "E", "batch", "schedule", "rounds")


def parse_candidate(text: str, max_epochs: int) -> ProbeSetting:
    """The :class:`ProbeSetting` of one ``--candidate`` text: space-separated ``KEY=VALUE``.

    Keys ``server``, ``lr``, ``E``, ``batch``, ``schedule``, ``rounds`` (default ``max_epochs // E``);
    others are the main job's defaults. ValueError for an unknown key or a bad value.
    """
    from coordinator.strategies import DEFAULT_AGGREGATION

    kv: dict[str, str] = {}
    for part in text.split():
        key, eq, value = part.partition("=")
        if not eq or key not in _CANDIDATE_KEYS:
            raise ValueError(f"candidate {text!r}: {part!r} is not KEY=VALUE with KEY one of {', '.join(_CANDIDATE_KEYS)}")
        kv[key] = value
    try:
        (srv, eta, beta), = parse_servers(kv.get("server", DEFAULT_AGGREGATION))
        e = int(kv.get("E", LocalTraining.local_epochs))
        rounds = int(kv["rounds"]) if "rounds" in kv else max(1, max_epochs // max(1, e))
        p = ProbeSetting(float(kv.get("lr", LocalTraining.lr)), e, rounds, srv, eta, beta,
                         int(kv.get("batch", LocalTraining.batch_size)), parse_schedule(kv.get("schedule", "constant")))
    except ValueError as exc:
        raise ValueError(f"candidate {text!r}: {exc}") from None
    if p.local_epochs < 1 or p.rounds < 1 or p.batch_size < 1 or not p.lr > 0:
        raise ValueError(f"candidate {text!r}: need E >= 1, rounds >= 1, batch >= 1 and lr > 0")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the grid; print the curves and the chosen setting. 0 ok, 2 usage."""
    ap = argparse.ArgumentParser(prog="python -m simulation.probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default=DEFAULT_SPLIT, help="paper | blocks (default %(default)s)")
    ap.add_argument("--split-seed", type=int, default=DEFAULT_SPLIT_SEED)
    ap.add_argument("--clients", type=int, default=0)
    ap.add_argument("--lrs", default="0.01,0.03,0.1", help="client learning rates (default %(default)s)")
    ap.add_argument("--epochs", default="1", help="local epochs E to try (default %(default)s)")
    ap.add_argument("--servers", default=FedAvg.name, help=f"NAME[:ETA:BETA], comma-separated; NAME one of "
                    f"{', '.join(probe_servers())} (ETA and BETA: a server optimiser's; left out: the coordinator's defaults)")
    ap.add_argument("--batch-sizes", default=str(LocalTraining.batch_size), help="local batch sizes (default %(default)s)")
    ap.add_argument("--schedules", default="constant", help="client lr across rounds, comma-separated: constant, "
                    "cosine[:WARMUP[:FLOOR]], step[:WARMUP[:EVERY[:GAMMA]]] (default %(default)s)")
    ap.add_argument("--candidate", action="append", default=[], metavar="'KEY=VALUE ...'",
                    help="one candidate (repeat the option for more) instead of the grid; keys: " + ", ".join(_CANDIDATE_KEYS))
    ap.add_argument("--centralised", action="store_true",
                    help="also train the CNN centrally on the union of the training windows for --max-epochs passes")
    ap.add_argument("--max-epochs", type=int, default=10, help="budget in rounds x E (default %(default)s)")
    ap.add_argument("--conv-filters", type=int, default=ArchSpec.conv_filters)
    ap.add_argument("--dense-units", type=int, default=ArchSpec.dense_units)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        split = SplitSpec.parse(args.split, seed=args.split_seed)
        lrs = [float(x) for x in args.lrs.split(",")]
        eps = [int(x) for x in args.epochs.split(",")]
        servers = parse_servers(args.servers)
        batches = [int(x) for x in args.batch_sizes.split(",")]
        schedules = [parse_schedule(x) for x in args.schedules.split(",")]
        if args.candidate:
            settings = [parse_candidate(c, args.max_epochs) for c in args.candidate]
        else:
            settings = [ProbeSetting(lr, e, max(1, args.max_epochs // e), srv, eta, beta, b, sch)
                        for lr, e, (srv, eta, beta), b, sch in itertools.product(lrs, eps, servers, batches, schedules)]
    except ValueError as exc:
        print(f"probe: {exc}", file=sys.stderr)
        return Exit.USAGE
    sources = subject_sources("hapt", DEFAULT_HAPT)
    if args.clients:
        sources = dict(list(sources.items())[: args.clients])
    t0 = time.monotonic()
    clients = load_clients(sources, split)
    results: list[tuple[ProbeSetting, list[dict[str, Any]]]] = []
    central: list[dict[str, Any]] = []

    def dump(extra: dict[str, Any]) -> None:
        if args.json is None:
            return
        doc: dict[str, Any] = {"split": split.text, "wall_seconds": time.monotonic() - t0, **extra,
                               "curves": [{"setting": asdict(q), "label": q.label, "rows": r} for q, r in results]}
        if central:
            doc["centralised"] = {"epochs": args.max_epochs, "rows": central}
        args.json.write_text(json.dumps(doc, indent=2))

    if args.centralised:
        central = run_centralised(clients, args.max_epochs, conv_filters=args.conv_filters, dense_units=args.dense_units,
                                  seed=args.seed)
        dump({})
    for p in settings:
        results.append((p, run_setting(clients, p, args.conv_filters, args.dense_units, args.seed)))
        dump({})  # after every setting, so a stopped search keeps what it measured
    best, rounds, row = choose(results, args.max_epochs)
    wall = time.monotonic() - t0
    dump({"chosen": {**asdict(best), "rounds": rounds}})
    if central:
        print(f"{'centralised':45s} " + " ".join(f"{r['val_f1']:.3f}/{r['test_f1']:.3f}" for r in central))
    for p, rows in results:
        print(f"{p.label:45s} " + " ".join(f"{r['val_f1']:.3f}/{r['test_f1']:.3f}" for r in rows))
    print(f"probe: split={split.text} settings={len(results)} wall_s={wall:.0f} chosen='{best.label}' rounds={rounds} "
          f"val_f1={row['val_f1']:.4f} test_f1={row['test_f1']:.4f} test_acc={row['test_acc']:.4f}")
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main())
