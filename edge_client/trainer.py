"""The client's part of a round, once, over any training backend: initialise, train, (guide), evaluate, package.

DESIGN.md section 2, step 3: pad the previous local model after a growth (FedDist,
:func:`edge_client.ala.pad_like`); initialise by overwrite, FedPer's local layers or FedALA's ALA
(Zhang et al., AAAI 2023, algorithm 1 lines 6-16); E epochs of SGD (FedProx, Li et al., MLSys 2020,
eq. 2) in ``train_local``'s batch order; FedDWA's guidance training; evaluate the received, initial
and trained models, persist the local model and build the update envelope
(:class:`har_models.wire.update_meta.UpdateMeta`). With ``"torch"`` every number is PyTorch eager's,
bit for bit; numpy and ExecuTorch agree to float32 rounding. This module imports no PyTorch.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_client.ala import AlaKernel, AlaState, adaptive_local_aggregation, pad_like
from edge_client.backends.base import BackendOptions, TrainingBackend, TrainSummary, train
from edge_client.backends.factory import make_backend
from edge_client.store import ClientStore
from edge_client.torch_threads import training_threads
from har_models.data.labels import balanced_class_weights
from har_models.nn.arch import ArchSpec
from har_models.wire import codec
from har_models.wire.messages import GUIDANCE_PREFIX, RoundAnnouncement
from har_models.wire.pte_delivery import ProgramRefused
from har_models.wire.safetensors_np import read_metadata
from har_models.wire.update_encoding import encode_update
from har_models.wire.update_meta import AlaNote, Confusions, UpdateMeta

log = logging.getLogger("fedhar.client.trainer")

Arrays = dict[str, np.ndarray]

FALLBACK_BACKEND = "numpy"
"""Backend a round trains on when its ExecuTorch programs are refused before loading (docs/backends.md)."""
RESIDUAL_NAME = "encoding_residual"
"""Store name of int8_delta's error-feedback residual (:meth:`ClientStore.save_tensors`)."""
RESIDUAL_BEFORE_PREFIX = "residual_before_this_exchange/"
"""Prefix, in the residual's tensor set, of the residual the exchange that saved it started from (see :func:`encode_for_upload`)."""
ALA_STATE_NAME = "ala_state"
"""Store name of FedALA's W and flags (:meth:`edge_client.ala.AlaState.to_parts`)."""


@dataclass(frozen=True)
class RoundOutcome:
    """What :meth:`ClientTrainer.run_round` produced: the update envelope, its metadata, and a JSON-able summary for logs."""

    envelope: bytes
    meta: UpdateMeta
    summary: dict[str, Any]


def derive_seed(base: int, client_id: str, round_: int, stage: int, purpose: str = "train") -> int:
    """Deterministic per-client, per-round seed (CRC-32 of the tuple)."""
    return zlib.crc32(f"{base}:{client_id}:{round_}:{stage}:{purpose}".encode())


def stored_local_model(store: ClientStore, run_id: str, client_id: str) -> tuple[ArchSpec, Arrays] | None:
    """The client's previous local model of run ``run_id`` and its architecture, as stored; None if there is none.

    A new run forgets the old run's state first; a model inconsistent with its architecture is logged and ignored.
    """
    if store.get_meta("run_id") != run_id:
        store.forget_run_state()
        return None
    loaded = store.load_local_model()
    if loaded is None:
        return None
    arch_json, state = loaded
    try:
        old = ArchSpec.from_json(arch_json)
        codec.check_tensors(old.shapes(), state)
    except ValueError as exc:
        log.error("[%s] stored local model is inconsistent (%s); using the received model", client_id, exc)
        return None
    return old, state


def encode_for_upload(
    store: ClientStore, ann: RoundAnnouncement, tensors: Mapping[str, np.ndarray], received: Mapping[str, np.ndarray]
) -> tuple[Mapping[str, Any], str]:
    """Apply the plan's update encoding to an update's tensors; return the arrays and the encoding applied.

    int8_delta's error-feedback residual is kept in ``store`` (:data:`RESIDUAL_NAME`, tagged with the
    run); for float32 ``tensors`` itself is returned (the envelope stays byte for byte). Raises
    ValueError from :func:`~har_models.wire.update_encoding.encode_update` (the caller skips the round).

    The residual is saved when the update is built (a lost upload leaves at most half a quantisation
    step per element in the next delta). Encoding is idempotent per exchange: the residual is saved
    with the residual the exchange started from (:data:`RESIDUAL_BEFORE_PREFIX`), and encoding the
    same exchange again starts from that one, giving the same bytes.
    """
    encoding = ann.plan.update_encoding
    if encoding == "float32":
        return tensors, encoding
    residual: Arrays = {}
    if encoding == "int8_delta":
        residual = residual_for(store, ann)
    arrays, _, new_residual = encode_update(dict(tensors), received, encoding, residual)
    if encoding == "int8_delta":
        kept = {**new_residual, **{RESIDUAL_BEFORE_PREFIX + k: v for k, v in residual.items()}}
        store.save_tensors(RESIDUAL_NAME, kept, {"run_id": ann.run_id, "round": ann.round, "stage": ann.stage})
    return arrays, encoding


def residual_for(store: ClientStore, ann: RoundAnnouncement) -> Arrays:
    """The error-feedback residual e that exchange ``ann`` (run, round, stage) starts from.

    The stored residual of an earlier exchange of the same run; for the exchange that stored it
    (encoded again), the residual that exchange itself started from; nothing for another run.
    """
    loaded = store.load_tensors(RESIDUAL_NAME)
    if loaded is None or loaded[1].get("run_id") != ann.run_id:
        return {}
    tensors, meta = loaded
    before = {k[len(RESIDUAL_BEFORE_PREFIX) :]: v for k, v in tensors.items() if k.startswith(RESIDUAL_BEFORE_PREFIX)}
    if (meta.get("round"), meta.get("stage")) == (ann.round, ann.stage):
        return before
    return {k: v for k, v in tensors.items() if not k.startswith(RESIDUAL_BEFORE_PREFIX)}


class ClientTrainer:
    """Runs the client's part of a round against its :class:`~edge_client.store.ClientStore`, through one backend.

    The backend's runtime (:func:`edge_client.backends.factory.make_backend`) is imported at the first
    round. Raises ValueError on an unknown backend name.
    """

    def __init__(self, store: ClientStore, client_id: str, backend: str = "torch", options: BackendOptions | None = None):
        from edge_client.backends.base import BACKEND_NAMES

        if backend not in BACKEND_NAMES:
            raise ValueError(f"ClientTrainer: unknown backend {backend!r}; choose one of {BACKEND_NAMES}")
        self.store, self.client_id, self.backend_name = store, client_id, backend
        self.options = options or BackendOptions()
        self.program_fault = ""  # reason the programs were last refused (ProgramRefused), "" when they load
        self._arch_seen: tuple[int, int | None] = (-1, None)  # (local model's mtime ns, its architecture version)

    @property
    def backend_in_use(self) -> str:
        """The backend the rounds train on now: the one asked for, or the fallback's while its programs are refused."""
        return FALLBACK_BACKEND if self.program_fault else self.backend_name

    @property
    def arch_version(self) -> int | None:
        """Architecture version of the stored local model (its metadata only is read, again when the file changes); None without one."""
        path = self.store.folder / "local_model.safetensors"
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            return None
        if self._arch_seen[0] != mtime:
            version = None
            try:
                version = ArchSpec.from_json(read_metadata(path).get("arch", "")).version
            except (OSError, ValueError) as exc:
                log.warning("[%s] local model %s: architecture unreadable (%s)", self.client_id, path, exc)
            self._arch_seen = (mtime, version)
        return self._arch_seen[1]

    def _make_backend(self, spec: ArchSpec, received: Mapping[str, np.ndarray]) -> TrainingBackend:
        """The round's backend; numpy when the ExecuTorch programs are refused before loading (``program_fault`` says why)."""
        try:
            backend = make_backend(self.backend_name, spec, received, self.options)
        except ProgramRefused as exc:
            # A program this runtime must not load (truncated, or of a newer schema) never reaches
            # the native loader: the round trains on the numpy backend, which computes the same function.
            if self.program_fault != exc.reason:
                log.error("[%s] ExecuTorch programs refused (%s): %s; training on the %s backend", self.client_id, exc.reason, exc,
                          FALLBACK_BACKEND)  # fmt: skip
            self.program_fault = exc.reason
            return make_backend(FALLBACK_BACKEND, spec, received)
        self.program_fault = ""
        return backend

    def _local_model(self, run_id: str, spec: ArchSpec, received: Mapping[str, np.ndarray]) -> Arrays | None:
        """The previous local model of this run, padded to ``spec`` if the architecture grew."""
        found = stored_local_model(self.store, run_id, self.client_id)
        if found is None:
            return None
        old, state = found
        if old.shapes() != spec.shapes():
            log.info("[%s] architecture grew v%d -> v%d: local model padded", self.client_id, old.version, spec.version)
            return pad_like(state, received)
        return {k: np.asarray(v, np.float32) for k, v in state.items()}

    def run_round(self, ann: RoundAnnouncement, received_np: Mapping[str, np.ndarray]) -> RoundOutcome:
        """Do this client's work for ``ann`` from theta received for this client (shapes of ``ann.arch``).

        Raises ValueError if the received tensors do not match the announced architecture (the
        caller skips the round; nothing is stored), ImportError if the backend's runtime is missing.
        """
        # The round keeps PyTorch's thread count as the process has it, whatever the sensing thread's predictions do.
        with training_threads():
            return self._run_round(ann, received_np)

    def _run_round(self, ann: RoundAnnouncement, received_np: Mapping[str, np.ndarray]) -> RoundOutcome:
        spec = ArchSpec.from_json(ann.arch)
        codec.check_tensors(spec.shapes(), received_np)
        plan = ann.plan
        train_ws, test = self.store.windows("train"), self.store.windows("test")
        received = {k: np.asarray(v, dtype=np.float32) for k, v in received_np.items()}
        use_ala = plan.client_init == "ala" and ann.stage == 0
        # Only FedPer and FedALA start from the previous local model: reading it (one model's bytes) is wasted otherwise.
        local = self._local_model(ann.run_id, spec, received) if plan.keep_local or use_ala else None
        cw = balanced_class_weights(train_ws.y, spec.n_classes) if plan.class_weights == "balanced" else None
        backend: TrainingBackend = self._make_backend(spec, received)
        # FedALA on a backend whose ALA kernel leaves its model alone and that can evaluate two models sharing
        # their lower layers (the torch backend): the received model is evaluated after ALA, together with
        # the initial one, so the test windows' features are computed once (same numbers as two evaluations).
        pair = use_ala and not plan.keep_local and len(test) > 0 and isinstance(backend, AlaKernel) and hasattr(backend, "evaluate_pair")
        cm_received = backend.evaluate(test.x, test.y).confusion if len(test) and not pair else None
        cm_shared = None

        start = dict(received)
        init_mode = "received"
        if plan.keep_local and local is not None:
            start.update({name: local[name] for name in plan.keep_local})
            init_mode = "fedper"
        ala_note: AlaNote | None = None
        if use_ala:
            res = adaptive_local_aggregation(
                backend, start, local, self._load_ala_state(local is not None), train_ws.x, train_ws.y,
                batch_size=plan.batch_size, seed=derive_seed(plan.seed, self.client_id, ann.round, ann.stage, "ala"),
                config=plan.ala_config(), class_weights=cw, context=f"[{self.client_id}] round {ann.round}",
            )  # fmt: skip
            start = res.state
            self._save_ala_state(res.ala)
            init_mode = "ala" if res.fallback is None else f"received ({res.fallback})"
            ala_note = AlaNote(res.passes, res.n_sample, res.converged, res.fallback)
        head_only = False
        if pair:
            # ALA's lower tensors take the received values (FedALA, Algorithm 1): only the blended ones differ.
            both = backend.evaluate_pair(test.x, test.y, {h: start[h] for h in res.higher}) if init_mode == "ala" else None  # type: ignore[attr-defined]
            if both is not None:
                cm_received, cm_shared = both[0].confusion, both[1].confusion
                head_only = True
            else:
                cm_received = backend.evaluate(test.x, test.y).confusion
        if head_only:  # the backend holds the received model: load only the blended tensors
            backend.set_weights({h: start[h] for h in res.higher}, arch_version=spec.version, partial=True)
        elif init_mode != "received":
            backend.set_weights(start, arch_version=spec.version)
        if cm_shared is not None:
            cm_init = cm_shared
        else:
            cm_init = backend.evaluate(test.x, test.y).confusion if len(test) and init_mode != "received" else cm_received

        prox_ref = received if plan.prox_mu > 0 else None
        seed = derive_seed(plan.seed, self.client_id, ann.round, ann.stage)
        def fit(seed: int) -> TrainSummary:
            return train(backend, train_ws.x, train_ws.y, epochs=plan.local_epochs, lr=plan.lr, batch_size=plan.batch_size,
                         seed=seed, class_weights=cw, prox_mu=plan.prox_mu, prox_ref=prox_ref, frozen=plan.frozen)  # fmt: skip

        result = fit(seed)
        trained = backend.get_weights()
        cm_trained = backend.evaluate(test.x, test.y).confusion if len(test) else None
        tensors: Arrays = dict(trained)
        seconds = result.seconds
        if plan.guidance:
            guided = fit(derive_seed(plan.seed, self.client_id, ann.round, ann.stage, "guidance"))
            tensors.update({GUIDANCE_PREFIX + k: v for k, v in backend.get_weights().items()})
            seconds += guided.seconds

        self.store.set_meta("run_id", ann.run_id)
        self.store.save_local_model(spec.to_json(), trained)

        arrays, encoding = encode_for_upload(self.store, ann, tensors, received)
        meta = UpdateMeta(
            run_id=ann.run_id,
            stage=ann.stage,
            n_train=len(train_ws),
            n_test=len(test),
            label_set=train_ws.labels.name,
            train_loss=tuple(result.epoch_losses),
            train_seconds=seconds,
            steps=result.steps,
            init_mode=init_mode,
            ala=ala_note,
            backend=self.backend_name,
            confusion=Confusions.of(cm_received, cm_init, cm_trained),
            encoding=encoding,
        )
        envelope = codec.encode(
            arrays, kind="update", round=ann.round, arch_version=spec.version, client_id=self.client_id, meta=meta.to_wire()
        )
        acc = {
            k: (float(np.trace(m) / m.sum()) if m is not None and m.sum() else None)
            for k, m in (("received", cm_received), ("initial", cm_init), ("trained", cm_trained))
        }
        summary = {
            "loss": result.epoch_losses[-1] if result.epoch_losses else None,
            "seconds": round(seconds, 2),
            "accuracy": acc,
            "init": init_mode,
            "backend": self.backend_name,
            "bytes": len(envelope),
        }
        return RoundOutcome(envelope, meta, summary)

    def _load_ala_state(self, has_local_model: bool) -> AlaState:
        """The stored FedALA state of this run (a fresh one if there is none or it is unusable)."""
        loaded = self.store.load_tensors(ALA_STATE_NAME)
        if loaded is None or not has_local_model:
            return AlaState(has_local_model=has_local_model)
        tensors, flags = loaded
        try:
            return AlaState.from_parts(tensors, flags)
        except ValueError as exc:
            log.error("[%s] stored FedALA state is unusable (%s); starting ALA afresh", self.client_id, exc)
            return AlaState(has_local_model=has_local_model)

    def _save_ala_state(self, state: AlaState) -> None:
        tensors, flags = state.to_parts()
        self.store.save_tensors(ALA_STATE_NAME, tensors, flags)
