"""The main job's work in Flower's simulation engine: the Flower side of ``benchmarks/bench_vs_flower.py``.

Runs in a venv with the ``bench-flower`` and ``client`` extras (``flwr[simulation]`` 1.42.0 and
its Ray), never in the project's own: no fedhar program imports Flower. The benchmark starts it
as a subprocess; run by hand it is

    FLOWER_VENV/bin/python benchmarks/flower_job.py --clients 4 --rounds 2 --conv-filters 8 --dense-units 32 --out f.json

What it does, and where each piece comes from:

- clients: the first ``--clients`` HAPT subjects (:func:`har_models.data.subjects.subject_sources`,
  subjects without windows dropped as ``fedhar-simulate`` drops them), one Flower SuperNode
  each, node k holding the k-th client id in sorted order. Each client's train/test windows
  are :meth:`SubjectSource.train_test` under ``--split`` (the main job's leak-free ``blocks``
  split by default), read once per Ray actor process and kept there;
- model: the project's CNN (:class:`har_models.nn.model.ArchSpec`), input normalisation from
  the summed training statistics of all clients in client-id order (as the coordinator sums
  the clients' reported :class:`ChannelStats`), initial weights :func:`init_state` with
  ``--seed``;
- a client's round: evaluate the received model on its own test windows, then
  :func:`har_models.nn.training.train_local` with E, lr, batch, balanced class weights and the
  main job's per-client seed (:func:`edge_client.trainer.derive_seed` of the seed, the client id
  and the 0-based round), then evaluate the trained model, and reply with the trained model,
  its training-window count and both confusion matrices (what the main job's client does, less
  its store and MQTT);
- the server: Flower's built-in ``FedAvgM`` (``flwr.serverapp.strategy``) with ``--server-lr``
  and ``--server-momentum``, every node trained every round, no client-side evaluation round;
  the global model evaluated on the union of the clients' test splits after every round
  (:class:`coordinator.evaluation.Evaluator`), and in the rounds the main job measures
  generalisation (every ``--generalisation-every`` rounds and the last) every trained model on
  it too;
- the engine: Flower's simulation runtime with its Ray backend, ``--actors`` client actors of
  ``--actor-cpus`` CPU each (Ray is given ``actors x actor-cpus`` CPUs), each client round with
  ``--threads`` PyTorch threads. Models move between the server app and the actors in memory
  (Flower's in-memory link state and Ray's object store), never through a broker or files.

``--order project`` replaces only the averaging inside FedAvgM: replies sorted by client id
and averaged in float64 with the project's :func:`coordinator.aggregation.weighted_average`
(Flower averages in float32 in the order the replies arrive); the server step (pseudo-gradient,
momentum, step) stays Flower's. With it the figures can be compared with the main job's digit
for digit (``bench_vs_flower.py`` prints the difference).

``--out FILE`` gets a JSON document: the settings, ``rounds`` (per round: ``round`` 0-based,
``global`` accuracy/macro-F1/weighted-F1 on the union test set, ``personalisation`` and, when
measured, ``generalisation`` as the main job's report has them, ``seconds`` since the previous
round ended, ``train_seconds`` the clients' summed :func:`train_local` time), ``final``,
``wall_seconds`` (this process, imports to the end) and the versions of Flower, Ray and PyTorch.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

T_START = time.monotonic()
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import numpy as np  # noqa: E402

log = logging.getLogger("fedhar.bench.flower")

ORDERS = ("flower", "project")
"""Averaging inside FedAvgM: Flower's own (float32, reply order) or the project's (client-id order, float64)."""


@dataclass(frozen=True)
class JobSettings:
    """The job both sides run (the README's first command by default).

    Attributes
    ----------
    clients, rounds : int
        HAPT subjects used (the first N; 0 = all) and federated rounds.
    conv_filters, dense_units : int
        F and H of the CNN (196 and 1024 in the paper).
    local_epochs, lr, batch_size : int, float, int
        E, the client SGD learning rate, windows per step.
    seed, split, split_seed : int, str, int
        The federation's seed (initial model, per-client training seeds), the train/test split
        and its seed.
    server_lr, server_momentum : float
        FedAvgM's eta and beta.
    generalisation_every : int
        Rounds between generalisation measurements (the main job's default 5; 0 = last only).
    update_encoding : {"float32", "float16", "int8_delta"}
        What a client's reply carries, as the main job's clients upload it: each client encodes
        its trained model with :func:`har_models.wire.update_encoding.encode_update` against the
        received model (int8_delta's residual kept in the node's ``context.state`` across rounds,
        as a device keeps it in its store) and decodes it with ``decode_update``, so the server
        averages the tensors the main job's coordinator averages. The reply itself stays float32
        (Flower moves arrays in memory; this job does not shrink them).
    """

    clients: int = 30
    rounds: int = 15
    conv_filters: int = 196
    dense_units: int = 1024
    local_epochs: int = 1
    lr: float = 0.1
    batch_size: int = 32
    seed: int = 1
    split: str = "blocks"
    split_seed: int = 1
    server_lr: float = 1.0
    server_momentum: float = 0.5
    generalisation_every: int = 5
    update_encoding: str = "float32"

    def generalisation_due(self, round_: int) -> bool:
        """Whether the main job measures generalisation in 0-based round ``round_`` (as :func:`coordinator.round.evaluate_round`)."""
        every = self.generalisation_every
        return round_ == self.rounds - 1 or (every > 0 and (round_ + 1) % every == 0)


_SOURCES: dict[int, dict[str, str]] = {}
"""--clients -> :func:`job_sources`, per process (dropping empty subjects reads every subject's windows: seconds)."""


def job_sources(s: JobSettings) -> dict[str, str]:
    """Client id -> HAPT source text, sorted by id, as ``fedhar-simulate --clients N`` picks them (empty subjects dropped).

    Cached in this process, so a client round in an actor does not read every subject again.
    """
    from har_models.data.subjects import DEFAULT_HAPT, drop_empty_sources, subject_sources

    if s.clients not in _SOURCES:
        sources = subject_sources("hapt", DEFAULT_HAPT)
        if s.clients:
            sources = dict(list(sources.items())[: s.clients])
        kept, _ = drop_empty_sources(sources)
        _SOURCES[s.clients] = dict(sorted(kept.items()))
    return _SOURCES[s.clients]


def _split(s: JobSettings) -> Any:
    from har_models.data.splits import SplitSpec

    return SplitSpec.parse(s.split, seed=s.split_seed)


_CLIENT_DATA: dict[tuple[str, str, int], Any] = {}
"""(source, split, split seed) -> (train, test) windows, per process: an actor reads a client's windows once."""


def client_windows(source: str, s: JobSettings) -> Any:
    """``(train, test)`` WindowSets of one client, cached in this process."""
    from har_models.data.subjects import parse_source

    key = (source, s.split, s.split_seed)
    if key not in _CLIENT_DATA:
        _CLIENT_DATA[key] = parse_source(source, _split(s)).train_test()
    return _CLIENT_DATA[key]


def settings_from_config(config: Any) -> JobSettings:
    """The :class:`JobSettings` a train message's ConfigRecord carries (field names as keys)."""
    return JobSettings(**{k: config[k] for k in JobSettings.__dataclass_fields__})


# ---- the ClientApp (runs in the Ray actors) ---------------------------------------------------------------------


def client_train(msg: Any, context: Any) -> Any:
    """One client's round in a Flower ClientApp: evaluate received, train, evaluate trained; reply with the model.

    Parameters
    ----------
    msg : flwr.app.Message
        Content ``arrays`` (ArrayRecord of the global model, float32) and ``config``
        (ConfigRecord: the :class:`JobSettings` fields, ``arch`` JSON, ``server-round`` 1-based).
    context : flwr.app.Context
        ``node_config["partition-id"]`` k: this node is the k-th client id in sorted order.

    Returns
    -------
    flwr.app.Message
        ``arrays`` (the trained model), ``metrics`` (``num-examples`` = training windows,
        ``client-index`` = k, ``cm-received`` and ``cm-trained`` flattened (C*C,) counts,
        ``train-seconds``).
    """
    import torch
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

    from edge_client.trainer import derive_seed
    from har_models.nn.model import ArchSpec
    from har_models.nn.training import TrainConfig, balanced_class_weights, evaluate, make_loss, train_local

    config = msg.content["config"]
    s = settings_from_config(config)
    torch.set_num_threads(int(config["threads"]))
    k = int(context.node_config["partition-id"])
    cid, source = list(job_sources(s).items())[k]
    train, test = client_windows(source, s)
    spec = ArchSpec.from_json(str(config["arch"]))
    received = {name: torch.from_numpy(a.numpy()) for name, a in msg.content["arrays"].items()}
    cm_received = evaluate(spec, received, test)
    round0 = int(config["server-round"]) - 1  # the main job counts rounds from 0
    cfg = TrainConfig(epochs=s.local_epochs, lr=s.lr, batch_size=s.batch_size, seed=derive_seed(s.seed, cid, round0, 0))
    result = train_local(spec, received, train, cfg, make_loss(balanced_class_weights(train.y, spec.n_classes)))
    cm_trained = evaluate(spec, result.state, test)
    trained = {name: t.numpy() for name, t in result.state.items()}
    if s.update_encoding != "float32":
        trained = _through_encoding(trained, {n: t.numpy() for n, t in received.items()}, s.update_encoding, context)
    arrays = ArrayRecord({name: Array(a) for name, a in trained.items()})
    metrics = MetricRecord({
        "num-examples": len(train),
        "client-index": k,
        "cm-received": [int(v) for v in cm_received.ravel()],
        "cm-trained": [int(v) for v in cm_trained.ravel()],
        "train-seconds": float(result.seconds),
    })
    return Message(content=RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)


RESIDUAL_RECORD = "int8-delta-residual"
"""The ``context.state`` record that holds a node's int8_delta residual e between rounds."""


def _through_encoding(
    trained: dict[str, np.ndarray], received: dict[str, np.ndarray], encoding: str, context: Any
) -> dict[str, np.ndarray]:
    """The trained tensors as the main job's coordinator sees them after ``encoding`` (float32 arrays, names unchanged).

    Encodes with :func:`har_models.wire.update_encoding.encode_update` against ``received``
    (int8_delta: with the residual e of the node's previous round from ``context.state``, and
    e' stored back), then decodes with ``decode_update`` against the same reference, as
    :func:`edge_client.trainer.encode_for_upload` and the coordinator do.
    """
    from flwr.app import Array, ArrayRecord

    from har_models.wire.update_encoding import decode_update, encode_update

    residual: dict[str, np.ndarray] = {}
    if RESIDUAL_RECORD in context.state:
        residual = {n: a.numpy() for n, a in context.state[RESIDUAL_RECORD].items()}
    coded, meta, new_residual = encode_update(trained, received, encoding, residual)
    if encoding == "int8_delta":
        context.state[RESIDUAL_RECORD] = ArrayRecord({n: Array(np.ascontiguousarray(a)) for n, a in new_residual.items()})
    return dict(decode_update(coded, meta, received))


def make_client_app() -> Any:
    """The Flower ClientApp whose ``train`` is :func:`client_train`."""
    from flwr.clientapp import ClientApp

    app = ClientApp()
    app.train()(client_train)
    return app


# ---- the ServerApp (runs in this process) -----------------------------------------------------------------------


def _square(flat: list[int], n: int) -> np.ndarray:
    return np.asarray(flat, dtype=np.int64).reshape(n, n)


def _personalisation(contents: list[Any], n_classes: int) -> dict[str, float]:
    """Mean over clients of the trained models on their own test windows (the main job's personalisation figure)."""
    from har_models.nn.metrics import mean_over_clients

    ordered = sorted(contents, key=lambda c: int(c["metrics"]["client-index"]))
    return mean_over_clients([_square(list(c["metrics"]["cm-trained"]), n_classes) for c in ordered])


def make_strategies() -> tuple[type, type]:
    """``(JobFedAvgM, ProjectOrderFedAvgM)``: Flower's FedAvgM with the main job's evaluations; and with the project's averaging.

    Both measure, in the rounds due, generalisation (each trained model on the union test set)
    and always personalisation before aggregating; the second also sorts the replies by client
    id and averages them with :func:`coordinator.aggregation.weighted_average` (float64, then
    float32) in place of Flower's float32 sum in arrival order. The FedAvgM server step is
    Flower's own in both (``FedAvgM.aggregate_train`` calls the average through ``super()``).
    """
    import torch
    from flwr.app import Array, ArrayRecord
    from flwr.serverapp.strategy import FedAvg, FedAvgM

    from coordinator.aggregation import weighted_average
    from har_models.nn.metrics import mean_over_clients
    from har_models.nn.training import evaluate

    class JobFedAvgM(FedAvgM):
        """Flower's FedAvgM plus the main job's personalisation and generalisation measures."""

        def __init__(self, job: JobRun, **kw: Any):
            super().__init__(**kw)
            self.job = job

        def aggregate_train(self, server_round: int, replies: Iterable[Any]) -> tuple[Any, Any]:
            replies = list(replies)
            contents = [m.content for m in replies if not m.has_error()]
            r0 = server_round - 1
            row = self.job.row(r0)
            spec = self.job.spec
            if contents:
                row["train_seconds"] = round(sum(float(c["metrics"]["train-seconds"]) for c in contents), 3)
                row["personalisation"] = _personalisation(contents, spec.n_classes)
                if self.job.settings.generalisation_due(r0):
                    ordered = sorted(contents, key=lambda c: int(c["metrics"]["client-index"]))
                    states = [{n: torch.from_numpy(a.numpy()) for n, a in c["arrays"].items()} for c in ordered]
                    union = self.job.evaluator.union_test
                    row["generalisation"] = mean_over_clients([evaluate(spec, st, union) for st in states])
            return super().aggregate_train(server_round, replies)

    class ProjectOrderAverage(FedAvg):
        """FedAvg's aggregate_train with the project's averaging: client-id order, float64 accumulation."""

        def aggregate_train(self, server_round: int, replies: Iterable[Any]) -> tuple[Any, Any]:
            valid, _ = self._check_and_log_replies(replies, is_train=True)
            if not valid:
                return None, None
            contents = sorted((m.content for m in valid), key=lambda c: int(c["metrics"]["client-index"]))
            states = [{n: torch.from_numpy(a.numpy()) for n, a in c["arrays"].items()} for c in contents]
            avg = weighted_average(states, [float(c["metrics"][self.weighted_by_key]) for c in contents])
            arrays = ArrayRecord({n: Array(t.numpy()) for n, t in avg.items()})
            return arrays, self.train_metrics_aggr_fn(contents, self.weighted_by_key)

    class ProjectOrderFedAvgM(JobFedAvgM, ProjectOrderAverage):
        """JobFedAvgM whose average (the ``super()`` call inside FedAvgM.aggregate_train) is :class:`ProjectOrderAverage`'s."""

    return JobFedAvgM, ProjectOrderFedAvgM


class JobRun:
    """The server side's state of one run: settings, data, the spec, and the per-round figures it records.

    Parameters
    ----------
    settings : JobSettings
    order : {"flower", "project"}
    threads : int
        PyTorch threads of each client round (sent in the train config).
    """

    def __init__(self, settings: JobSettings, order: str, threads: int):
        from coordinator.evaluation import Evaluator
        from har_models.data.subjects import union_test_set
        from har_models.data.windowing import ChannelStats
        from har_models.nn.model import ArchSpec

        if order not in ORDERS:
            raise ValueError(f"--order must be one of {ORDERS}, got {order!r}")
        self.settings, self.order, self.threads = settings, order, threads
        self.sources = job_sources(settings)
        if len(self.sources) < 2:
            raise ValueError(f"need at least 2 clients with windows, got {len(self.sources)}; raise --clients")
        stats = None
        for source in self.sources.values():  # client-id order, as the coordinator sums the clients' reports
            train, _ = client_windows(source, settings)
            if len(train):
                st = ChannelStats.from_json(json.loads(json.dumps(ChannelStats.of(train.x).to_json())))
                stats = st if stats is None else stats + st
        if stats is None:
            raise ValueError("no client has training windows")
        mean, std = stats.mean_std()
        labels = client_windows(next(iter(self.sources.values())), settings)[0].labels
        self.spec = ArchSpec(n_classes=len(labels), conv_filters=settings.conv_filters, dense_units=settings.dense_units,
                             input_mean=mean, input_std=std)  # fmt: skip
        self.evaluator = Evaluator(union_test_set(self.sources, split=_split(settings)))
        self.rows: dict[int, dict[str, Any]] = {}
        self._last = time.monotonic()

    def row(self, r0: int) -> dict[str, Any]:
        """The record of 0-based round ``r0`` (created empty)."""
        return self.rows.setdefault(r0, {"round": r0})

    def evaluate_global(self, server_round: int, arrays: Any) -> Any:
        """Flower's ``evaluate_fn``: the global model on the union test set after each round (not before the first)."""
        import torch
        from flwr.app import MetricRecord

        if server_round == 0:
            self._last = time.monotonic()
            return None
        state = {n: torch.from_numpy(a.numpy()) for n, a in arrays.items()}
        figures = self.evaluator.global_metrics(self.spec, state)
        row = self.row(server_round - 1)
        row["global"] = figures
        now = time.monotonic()
        row["seconds"] = round(now - self._last, 3)
        self._last = now
        log.info("flower round %d: global acc %.4f macro-F1 %.4f (%.1f s)", server_round - 1, figures["accuracy"],
                 figures["macro_f1"], row["seconds"])  # fmt: skip
        return MetricRecord({k: float(v) for k, v in figures.items()})

    def server_main(self, grid: Any, context: Any) -> None:
        """The ServerApp's main: FedAvgM (Flower's, or with the project's averaging) over every node, ``rounds`` rounds."""
        from flwr.app import Array, ArrayRecord, ConfigRecord

        from har_models.nn.model import init_state

        job_cls, project_cls = make_strategies()
        cls = project_cls if self.order == "project" else job_cls
        n = len(self.sources)
        s = self.settings
        strategy = cls(self, fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n, min_evaluate_nodes=0,
                       min_available_nodes=n, server_learning_rate=s.server_lr, server_momentum=s.server_momentum)  # fmt: skip
        initial = ArrayRecord({name: Array(t.numpy()) for name, t in init_state(self.spec, s.seed).items()})
        config = ConfigRecord({**{k: getattr(s, k) for k in JobSettings.__dataclass_fields__}, "arch": self.spec.to_json(),
                               "threads": self.threads})  # fmt: skip
        strategy.start(grid=grid, initial_arrays=initial, num_rounds=s.rounds, train_config=config,
                       evaluate_fn=self.evaluate_global)  # fmt: skip

    def document(self) -> dict[str, Any]:
        """The JSON document ``--out`` gets (see the module docstring)."""
        import flwr
        import ray
        import torch

        rounds = [self.rows[r] for r in sorted(self.rows)]
        return {
            "settings": {k: getattr(self.settings, k) for k in JobSettings.__dataclass_fields__},
            "order": self.order,
            "clients": list(self.sources),
            "rounds": rounds,
            "final": rounds[-1] if rounds else None,
            "versions": {"flwr": flwr.__version__, "ray": ray.__version__, "torch": torch.__version__},
        }


def run(settings: JobSettings, order: str = "flower", actors: int = 2, actor_cpus: float = 1.0, threads: int = 1) -> dict[str, Any]:
    """Run the job in Flower's simulation engine; the :meth:`JobRun.document` (without the wall time).

    Raises
    ------
    ValueError
        For fewer than 2 clients with windows, an unknown order, or non-positive actor settings.
    RuntimeError
        If Flower's run ended without every round's global figures (a client failed: Flower logs it).
    """
    if actors < 1 or actor_cpus <= 0 or threads < 1:
        raise ValueError(f"need actors >= 1, actor CPUs > 0 and threads >= 1, got {actors}, {actor_cpus}, {threads}")
    # The actors are Ray workers that import this module by name (pickled functions refer to it): give them its folder.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    job = JobRun(settings, order, threads)
    server = ServerApp()
    server.main()(job.server_main)
    backend_config = {
        "client_resources": {"num_cpus": actor_cpus, "num_gpus": 0.0},
        "init_args": {"num_cpus": round(actors * actor_cpus), "num_gpus": 0, "include_dashboard": False},
    }
    run_simulation(server_app=server, client_app=make_client_app(), num_supernodes=len(job.sources), backend_name="ray",
                   backend_config=backend_config)  # fmt: skip
    doc = job.document()
    missing = [r for r in range(settings.rounds) if "global" not in job.rows.get(r, {})]
    if missing:
        raise RuntimeError(f"Flower's run ended without the global figures of rounds {missing}; see its log above")
    return doc


def build_parser() -> argparse.ArgumentParser:
    """Options: the :class:`JobSettings` fields, the engine's settings, ``--order`` and ``--out``."""
    d = JobSettings()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in JobSettings.__dataclass_fields__:
        default = getattr(d, name)
        ap.add_argument("--" + name.replace("_", "-"), type=type(default), default=default, help=f"default {default}")
    ap.add_argument("--actors", type=int, default=2, help="Ray client actors (default 2)")
    ap.add_argument("--actor-cpus", type=float, default=1.0, help="CPUs of each actor (default 1)")
    ap.add_argument("--threads", type=int, default=1, help="PyTorch threads of each client round (default 1)")
    ap.add_argument("--order", choices=ORDERS, default="flower", help="averaging inside FedAvgM (default flower)")
    ap.add_argument("--out", type=Path, required=True, help="JSON file for the figures")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the Flower job; 0 ok, 2 bad options, 1 Flower's run failed."""
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler()  # this script's lines only; Flower's logger has a handler of its own
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    settings = JobSettings(**{k: getattr(args, k) for k in JobSettings.__dataclass_fields__})
    try:
        doc = run(settings, args.order, args.actors, args.actor_cpus, args.threads)
    except ValueError as exc:
        print(f"flower_job: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"flower_job: {exc}", file=sys.stderr)
        return 1
    doc["wall_seconds"] = round(time.monotonic() - T_START, 1)
    args.out.write_text(json.dumps(doc, indent=2))
    print(f"flower_job: {settings.rounds} rounds with {len(doc['clients'])} clients in {doc['wall_seconds']:.0f} s; "
          f"final global macro-F1 {doc['final']['global']['macro_f1']:.4f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    # Run as a script this file is __main__; import it under its own name so the functions Flower pickles for the
    # Ray actors refer to the module ``flower_job`` (which the actors import) rather than to a copy of __main__.
    import flower_job

    sys.exit(flower_job.main())
