"""One round of local work on the client: initialise, train, (guide), evaluate, package.

Order (DESIGN.md section 2, step 3): pad the previous local model if the architecture
grew, initialise from the received and the local model (overwrite, FedALA, FedPer's
local layers), train E local epochs, train the FedDWA guidance model if asked, evaluate
on the local test split, persist, and build the update envelope.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from edge_client.ala import AlaState, adaptive_local_aggregation
from edge_client.store import ClientStore
from edge_client.trainer_common import RoundOutcome, derive_seed, encode_for_upload, stored_local_model
from har_models.nn.growth import pad_state_like
from har_models.nn.model import ArchSpec, build_model
from har_models.nn.training import TrainConfig, balanced_class_weights, evaluate, make_loss, train_local
from har_models.wire import codec
from har_models.wire.messages import GUIDANCE_PREFIX, RoundAnnouncement

log = logging.getLogger("fedhar.client.trainer")


def _to_torch(state: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """float32 tensors sharing memory with the arrays where their dtype allows (they are never modified)."""
    return {k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in state.items()}


def _to_numpy(state: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy() for k, v in state.items()}


class LocalTrainer:
    """Runs the client's part of a round against its :class:`~edge_client.store.ClientStore`.

    Parameters
    ----------
    store : ClientStore
    client_id : str
    """

    def __init__(self, store: ClientStore, client_id: str):
        self.store = store
        self.client_id = client_id

    def _local_model(self, run_id: str, spec: ArchSpec, received: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """The previous local model of this run, padded to ``spec`` if the architecture grew."""
        found = stored_local_model(self.store, run_id, self.client_id)
        if found is None:
            return None
        old, state = found
        local = _to_torch(state)
        if old.shapes() != spec.shapes():
            local = pad_state_like(local, received)
            log.info("[%s] architecture grew v%d -> v%d: local model padded", self.client_id, old.version, spec.version)
        return local

    def run_round(self, ann: RoundAnnouncement, received_np: Mapping[str, np.ndarray]) -> RoundOutcome:
        """Do this client's work for ``ann`` starting from the received parameters.

        Parameters
        ----------
        ann : RoundAnnouncement
            The round (architecture, plan, run id).
        received_np : mapping name -> ndarray
            theta received for this client (global or personalised), shapes of ``ann.arch``.

        Returns
        -------
        RoundOutcome

        Raises
        ------
        ValueError
            If the received tensors do not match the announced architecture (the caller
            logs it and skips the round; nothing is stored).
        """
        spec = ArchSpec.from_json(ann.arch)
        codec.check_tensors(spec.shapes(), received_np)
        plan = ann.plan
        train, test = self.store.windows("train"), self.store.windows("test")
        received = _to_torch(received_np)
        use_ala = plan.client_init == "ala" and ann.stage == 0
        # Only FedPer and FedALA start from the previous local model: reading it (one model's bytes) is wasted otherwise.
        local = self._local_model(ann.run_id, spec, received) if plan.keep_local or use_ala else None
        loss_fn = make_loss(balanced_class_weights(train.y, spec.n_classes) if plan.class_weights == "balanced" else None)

        start = dict(received)  # tensors are never modified in place: building a model copies them
        init_mode = "received"
        if plan.keep_local and local is not None:
            for name in plan.keep_local:
                start[name] = local[name]
            init_mode = "fedper"
        ala_note: dict[str, Any] = {}
        if use_ala:
            res = adaptive_local_aggregation(
                start,
                local,
                self._load_ala_state(local is not None),
                train.x,
                train.y,
                build=functools.partial(build_model, spec),
                loss_fn=loss_fn,
                batch_size=plan.batch_size,
                seed=derive_seed(plan.seed, self.client_id, ann.round, ann.stage, "ala"),
                config=plan.ala_config(),
                context=f"[{self.client_id}] round {ann.round}",
            )
            start = res.state
            self._save_ala_state(res.ala)
            init_mode = "ala" if res.fallback is None else f"received ({res.fallback})"
            ala_note = {"passes": res.passes, "n_sample": res.n_sample, "converged": res.converged, "fallback": res.fallback}

        cm_received = evaluate(spec, received, test) if len(test) else None
        cm_init = evaluate(spec, start, test) if len(test) and init_mode != "received" else cm_received
        cfg = TrainConfig(
            epochs=plan.local_epochs,
            lr=plan.lr,
            batch_size=plan.batch_size,
            prox_mu=plan.prox_mu,
            frozen=plan.frozen,
            seed=derive_seed(plan.seed, self.client_id, ann.round, ann.stage),
        )
        result = train_local(spec, start, train, cfg, loss_fn, prox_ref=received if plan.prox_mu > 0 else None)
        tensors: dict[str, torch.Tensor] = dict(result.state)
        guidance_seconds = 0.0
        if plan.guidance:
            g_cfg = TrainConfig(
                cfg.epochs,
                cfg.lr,
                cfg.batch_size,
                cfg.prox_mu,
                cfg.frozen,
                derive_seed(plan.seed, self.client_id, ann.round, ann.stage, "guidance"),
            )
            guided = train_local(spec, result.state, train, g_cfg, loss_fn, prox_ref=received if plan.prox_mu > 0 else None)
            tensors.update({GUIDANCE_PREFIX + k: v for k, v in guided.state.items()})
            guidance_seconds = guided.seconds
        cm_trained = evaluate(spec, result.state, test) if len(test) else None

        self.store.set_meta("run_id", ann.run_id)
        self.store.save_local_model(spec.to_json(), _to_numpy(result.state))

        def cm(m: np.ndarray | None) -> list[list[int]] | None:
            return None if m is None else m.astype(int).tolist()

        meta = {
            "run_id": ann.run_id,
            "stage": ann.stage,
            "n_train": len(train),
            "n_test": len(test),
            "label_set": train.labels.name,
            "train_loss": list(result.epoch_losses),
            "train_seconds": result.seconds + guidance_seconds,
            "steps": result.steps,
            "init_mode": init_mode,
            "ala": ala_note,
            "confusion": {"received": cm(cm_received), "initial": cm(cm_init), "trained": cm(cm_trained)},
        }
        arrays, encoding_meta = encode_for_upload(self.store, ann, tensors, received_np)
        meta.update(encoding_meta)
        envelope = codec.encode(
            arrays, kind="update", round=ann.round, arch_version=spec.version, client_id=self.client_id, meta=meta
        )
        acc = {
            k: (float(np.trace(m) / m.sum()) if m is not None and m.sum() else None)
            for k, m in (("received", cm_received), ("initial", cm_init), ("trained", cm_trained))
        }
        summary = {
            "loss": result.epoch_losses[-1] if result.epoch_losses else None,
            "seconds": round(result.seconds + guidance_seconds, 2),
            "accuracy": acc,
            "init": init_mode,
            "bytes": len(envelope),
        }
        return RoundOutcome(envelope, summary)

    def _load_ala_state(self, has_local_model: bool) -> AlaState:
        """The stored FedALA state of this run (a fresh one if there is none or it is unusable)."""
        loaded = self.store.load_tensors("ala_state")
        if loaded is None or not has_local_model:
            return AlaState(has_local_model=has_local_model)
        tensors, meta = loaded
        try:
            return AlaState.from_parts({k: torch.from_numpy(v) for k, v in tensors.items()}, meta)
        except ValueError as exc:
            log.error("[%s] stored FedALA state is unusable (%s); starting ALA afresh", self.client_id, exc)
            return AlaState(has_local_model=has_local_model)

    def _save_ala_state(self, state: AlaState) -> None:
        tensors, flags = state.to_parts()
        self.store.save_tensors("ala_state", {k: v.numpy() for k, v in tensors.items()}, flags)
