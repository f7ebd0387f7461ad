"""The client's part of a round over a training backend (numpy reference or ExecuTorch): no PyTorch imported.

The same steps as :class:`edge_client.trainer.LocalTrainer` (the PyTorch path every board
and the simulation use), through the :class:`~edge_client.backends.base.TrainingBackend`
interface, so a phone (ExecuTorch through its Java training module) or any device
without PyTorch (numpy reference) takes part in the same federation:

1. pad the previous local model after a FedDist growth (new slots take the received values);
2. FedPer: keep the personal layers; FedALA: learn W from the backend's top-layer gradients
   (:func:`edge_client.backends.ala_backend.learn_ala_weights`) and blend (Zhang et al.,
   AAAI 2023, algorithm 1 lines 6-16);
3. E local epochs of SGD (FedProx's proximal term when asked), in the batch order of
   :func:`har_models.nn.training.train_local` for the same seed;
4. FedDWA: one more pass for the guidance model;
5. evaluate the received, initial and trained models on the local test windows, and
   build the update envelope.

The numbers agree with the PyTorch path to float32 rounding, not bit for bit (a different
summation order); ``tests/test_backend_trainer.py`` compares them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from edge_client.backends.ala_backend import learn_ala_weights
from edge_client.backends.base import TrainingBackend, train
from edge_client.backends.factory import make_backend
from edge_client.store import ClientStore
from edge_client.trainer_common import RoundOutcome, derive_seed, encode_for_upload, stored_local_model
from har_models.data.labels import balanced_class_weights
from har_models.nn.arch import PARAM_NAMES, ArchSpec
from har_models.wire import codec
from har_models.wire.messages import GUIDANCE_PREFIX, RoundAnnouncement

log = logging.getLogger("fedhar.client.trainer")

Arrays = dict[str, np.ndarray]


def pad_like(local: Mapping[str, np.ndarray], like: Mapping[str, np.ndarray], fill: float | None = None) -> Arrays:
    """Pad each tensor of ``local`` to the shape of ``like``'s: local values in the leading slice, new slots from ``like`` (or ``fill``).

    Raises
    ------
    ValueError
        If a tensor of ``local`` is missing from ``like`` or wider than it.
    """
    out: Arrays = {}
    for name, v in local.items():
        if name not in like:
            raise ValueError(f"pad_like: {name!r} is not in the received model")
        target = like[name]
        if v.ndim != target.ndim or any(a > b for a, b in zip(v.shape, target.shape, strict=True)):
            raise ValueError(f"pad_like: {name!r} of shape {v.shape} cannot be padded to {target.shape}")
        new = np.array(target, dtype=np.float32, copy=True) if fill is None else np.full(target.shape, fill, np.float32)
        new[tuple(slice(0, s) for s in v.shape)] = v
        out[name] = new
    return out


def higher_tensors(layer_idx: int) -> tuple[str, ...]:
    """FedALA's top-p tensors: the last ``layer_idx`` parameter tensors (all for 0)."""
    if layer_idx > len(PARAM_NAMES):
        raise ValueError(f"layer_idx={layer_idx} exceeds the model's {len(PARAM_NAMES)} parameter tensors")
    return tuple(PARAM_NAMES[len(PARAM_NAMES) - layer_idx :]) if layer_idx > 0 else PARAM_NAMES


class BackendTrainer:
    """Runs the client's part of a round through a training backend (``"numpy"`` or ``"executorch"``).

    Parameters
    ----------
    store : ClientStore
    client_id : str
    backend : {"numpy", "executorch", "torch"}
        The backend's name for :func:`edge_client.backends.base.make_backend`.
    options : dict
        Backend constructor options (e.g. ``cache_dir`` for ExecuTorch programs).
    """

    def __init__(self, store: ClientStore, client_id: str, backend: str, **options: object):
        self.store, self.client_id, self.backend_name, self.options = store, client_id, backend, options

    def _backend(self, spec: ArchSpec, weights: Mapping[str, np.ndarray]) -> TrainingBackend:
        return make_backend(self.backend_name, spec, dict(weights), **self.options)

    def _local_model(self, run_id: str, spec: ArchSpec, received: Mapping[str, np.ndarray]) -> Arrays | None:
        found = stored_local_model(self.store, run_id, self.client_id)
        if found is None:
            return None
        old, state = found
        return pad_like(state, received) if old.shapes() != spec.shapes() else dict(state)

    def run_round(self, ann: RoundAnnouncement, received_np: Mapping[str, np.ndarray]) -> RoundOutcome:
        """Do this client's work for ``ann`` from the received parameters (see the module docstring).

        Raises
        ------
        ValueError
            If the received tensors do not match the announced architecture.
        """
        spec = ArchSpec.from_json(ann.arch)
        codec.check_tensors(spec.shapes(), received_np)
        plan = ann.plan
        train_ws, test = self.store.windows("train"), self.store.windows("test")
        received = {k: np.asarray(v, dtype=np.float32) for k, v in received_np.items()}
        local = self._local_model(ann.run_id, spec, received)
        cw = balanced_class_weights(train_ws.y, spec.n_classes) if plan.class_weights == "balanced" else None
        t0 = time.perf_counter()

        start = dict(received)
        init_mode = "received"
        if plan.keep_local and local is not None:
            start.update({name: local[name] for name in plan.keep_local})
            init_mode = "fedper"
        ala_note: dict[str, Any] = {}
        if plan.client_init == "ala" and ann.stage == 0:
            start, init_mode, ala_note = self._ala(ann, spec, start, local, train_ws.x, train_ws.y, cw)

        backend = self._backend(spec, received)
        cm_received = backend.evaluate(test.x, test.y).confusion if len(test) else None
        if init_mode != "received":
            backend.set_weights(start, arch_version=spec.version)
        cm_init = backend.evaluate(test.x, test.y).confusion if len(test) and init_mode != "received" else cm_received
        seed = derive_seed(plan.seed, self.client_id, ann.round, ann.stage)
        prox_ref = received if plan.prox_mu > 0 else None
        result = train(backend, train_ws.x, train_ws.y, epochs=plan.local_epochs, lr=plan.lr, batch_size=plan.batch_size,
                       seed=seed, class_weights=cw, prox_mu=plan.prox_mu, prox_ref=prox_ref, frozen=plan.frozen)  # fmt: skip
        trained = backend.get_weights()
        cm_trained = backend.evaluate(test.x, test.y).confusion if len(test) else None
        tensors: Arrays = dict(trained)
        steps = result.steps
        if plan.guidance:
            g_seed = derive_seed(plan.seed, self.client_id, ann.round, ann.stage, "guidance")
            guided = train(backend, train_ws.x, train_ws.y, epochs=plan.local_epochs, lr=plan.lr, batch_size=plan.batch_size,
                           seed=g_seed, class_weights=cw, prox_mu=plan.prox_mu, prox_ref=prox_ref, frozen=plan.frozen)  # fmt: skip
            tensors.update({GUIDANCE_PREFIX + k: v for k, v in backend.get_weights().items()})
            steps += guided.steps
        seconds = time.perf_counter() - t0

        self.store.set_meta("run_id", ann.run_id)
        self.store.save_local_model(spec.to_json(), trained)

        def cm(m: np.ndarray | None) -> list[list[int]] | None:
            return None if m is None else np.asarray(m).astype(int).tolist()

        meta = {
            "run_id": ann.run_id,
            "stage": ann.stage,
            "n_train": len(train_ws),
            "n_test": len(test),
            "label_set": train_ws.labels.name,
            "train_loss": list(result.epoch_losses),
            "train_seconds": seconds,
            "steps": steps,
            "init_mode": init_mode,
            "ala": ala_note,
            "backend": self.backend_name,
            "confusion": {"received": cm(cm_received), "initial": cm(cm_init), "trained": cm(cm_trained)},
        }
        arrays, encoding_meta = encode_for_upload(self.store, ann, tensors, received)
        meta.update(encoding_meta)
        envelope = codec.encode(arrays, kind="update", round=ann.round, arch_version=spec.version, client_id=self.client_id, meta=meta)
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
        return RoundOutcome(envelope, summary)

    def _ala(
        self,
        ann: RoundAnnouncement,
        spec: ArchSpec,
        received: Arrays,
        local: Arrays | None,
        x: np.ndarray,
        y: np.ndarray,
        cw: np.ndarray | None,
    ) -> tuple[Arrays, str, dict[str, Any]]:
        """FedALA's initialisation through the backend; the ALA state (W, start phase) is kept in the store."""
        cfg = ann.plan.ala_config()
        higher = higher_tensors(int(cfg.layer_idx))
        ones = {h: np.ones_like(received[h]) for h in higher}
        loaded = self.store.load_tensors("ala_state")
        w_stored: Arrays | None = None
        start_phase = True
        if loaded is not None and local is not None:
            tensors, flags = loaded
            start_phase = bool(flags.get("start_phase", True))
            if tensors and set(tensors) == set(higher):
                w_stored = pad_like(tensors, received, fill=1.0)
        if local is None:  # first participation: the received model, W = 1
            self.store.save_tensors("ala_state", ones, {"start_phase": True, "has_local_model": True})
            return received, "received (first participation)", {"fallback": "first participation"}
        res = learn_ala_weights(
            self._backend(spec, received), received, local, w_stored if w_stored is not None else ones, x, y,
            eta=cfg.eta, rand_percent=cfg.rand_percent, batch_size=ann.plan.batch_size,
            seed=derive_seed(ann.plan.seed, self.client_id, ann.round, ann.stage, "ala"), start_phase=start_phase,
            threshold=cfg.threshold, num_pre_loss=cfg.num_pre_loss, max_passes=cfg.max_passes, class_weights=cw,
            dropout=cfg.mode == "train",
        )  # fmt: skip
        self.store.save_tensors("ala_state", dict(res.weights), {"start_phase": False, "has_local_model": True})
        note = {"passes": len(res.losses), "n_sample": res.n_sample, "converged": res.converged, "fallback": res.fallback}
        return dict(res.state), "ala" if res.fallback is None else f"received ({res.fallback})", note
