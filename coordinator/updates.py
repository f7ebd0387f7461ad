"""Validation of client updates: every way an upload can be wrong, with a reason code.

An update is accepted only as an intact "update" envelope from a client selected for this run, round
and stage, at the current architecture, with the expected tensors, finite values and sane metadata.
Anything else raises :class:`UpdateRejected`, logged and recorded; the federation's state never changes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from har_models.nn.model import ArchSpec
from har_models.wire import codec
from har_models.wire.messages import GUIDANCE_PREFIX
from har_models.wire.update_encoding import decode_update
from har_models.wire.update_meta import Confusions, UpdateMeta, UpdateMetaError


class UpdateRejected(ValueError):
    """An update that must be ignored; ``reason`` is a short code for logs and reports."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ClientUpdate:
    """A validated update: trained model w_i, FedDWA guidance (or None), windows (n_train is FedAvg's n_k).

    ``confusion`` holds the client's (C, C) int64 matrices on its own test split: ``received``,
    ``initial`` (after FedALA / FedPer initialisation) and ``trained``; ``size`` is the envelope's bytes.
    """

    client_id: str
    round: int
    stage: int
    n_train: int
    n_test: int
    state: Mapping[str, torch.Tensor]
    guidance: Mapping[str, torch.Tensor] | None
    confusion: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    size: int = 0


@dataclass(frozen=True)
class Failure:
    """A selected client that sent no valid update in an exchange (Flower's ``failures``).

    ``reason``: "missed_deadline", "offline", "cannot_train", "cohort_full", "still_training" or a rejection reason.
    """

    client_id: str
    reason: str


def _confusions(conf: Confusions, n_classes: int, n_test: int) -> dict[str, np.ndarray]:
    """The matrices present, each checked against this run's classes and the update's ``n_test``."""
    out = {}
    for key in ("received", "initial", "trained"):
        m = getattr(conf, key)
        if m is None:
            continue
        if len(m) != n_classes:
            raise UpdateRejected("bad_metrics", f"confusion matrix {key!r} must be a {n_classes}x{n_classes} list of lists")
        if sum(map(sum, m)) > n_test:
            raise UpdateRejected("bad_metrics", f"confusion matrix {key!r} counts more windows than n_test = {n_test}")
        out[key] = np.asarray(m, dtype=np.int64)
    return out


_META_REASONS = {"run_id": "wrong_run", "stage": "stale_stage"}
"""Rejection reason of unreadable metadata by the key at fault (else ``bad_metrics``)."""


def validate_update(
    data: bytes,
    *,
    topic_client: str,
    run_id: str,
    round_: int,
    stage: int,
    spec: ArchSpec,
    selected: Collection[str],
    want_guidance: bool,
    max_bytes: int | None = None,
    reported_n_train: int | None = None,
    reference: Mapping[str, Any] | None = None,
) -> ClientUpdate:
    """Decode and check one update envelope of ``topic_client`` (the broker's ACL ties the topic to the sender).

    An update claiming more than ``reported_n_train`` (the client's status) is refused, so no device
    outweighs the others by its word alone. ``reference`` is the model published to the client for this
    exchange; int8_delta updates are deltas against it and are refused without it.

    Raises UpdateRejected with ``reason`` the envelope error's code (``sha256_mismatch``, ``truncated``,
    ``non_finite``, ...) or one of ``wrong_kind``, ``client_mismatch``, ``not_selected``, ``wrong_run``,
    ``stale_round``, ``future_round``, ``stale_stage``, ``wrong_arch_version``, ``unknown_encoding``,
    ``bad_encoding``, ``wrong_tensors``, ``missing_guidance``, ``bad_metrics``.
    """
    try:
        # Finiteness is checked once, on the decoded tensors (check_tensors below): checked here,
        # a NaN or inf int8_delta scale would read as non_finite instead of bad_encoding.
        env = codec.decode(data, max_bytes=max_bytes, require_finite=False)
    except codec.EnvelopeError as exc:
        raise UpdateRejected(exc.reason, str(exc)) from None
    meta = env.meta
    if env.kind != "update":
        raise UpdateRejected("wrong_kind", f"envelope kind {env.kind!r}, expected 'update'")
    if env.client_id != topic_client:
        raise UpdateRejected("client_mismatch", f"envelope says client {env.client_id!r}, topic says {topic_client!r}")
    if topic_client not in selected:
        raise UpdateRejected("not_selected", f"client {topic_client!r} is not selected for round {round_}")
    # One parser (UpdateMeta.from_wire, lenient as the intake always was); a fault it finds is
    # reported where today's checks stand, so each defect keeps its reason and its precedence.
    um: UpdateMeta | None = None
    meta_error: UpdateMetaError | None = None
    try:
        um = UpdateMeta.from_wire(meta, strict=False)
    except UpdateMetaError as exc:
        meta_error = exc
    fault = meta_error.key if meta_error is not None else None
    if fault == "run_id" or (um is not None and um.run_id != run_id):
        raise UpdateRejected("wrong_run", f"update is for run {meta.get('run_id')!r:.80}, the current run is {run_id!r}")
    if env.round != round_:
        reason = "stale_round" if env.round < round_ else "future_round"
        raise UpdateRejected(reason, f"update is for round {env.round}, the open round is {round_}")
    if fault == "stage" or (um is not None and um.stage != stage):
        raise UpdateRejected("stale_stage", f"update is for stage {meta.get('stage')!r:.40}, the open stage is {stage}")
    if env.arch_version != spec.version:
        raise UpdateRejected(
            "wrong_arch_version", f"update has architecture v{env.arch_version}, the current one is v{spec.version}"
        )
    shapes = spec.shapes()
    try:
        tensors = decode_update(env.tensors, meta, reference)
    except codec.EnvelopeError as exc:
        raise UpdateRejected(exc.reason, str(exc)) from None
    trained = {k: v for k, v in tensors.items() if not k.startswith(GUIDANCE_PREFIX)}
    guided = {k[len(GUIDANCE_PREFIX) :]: v for k, v in tensors.items() if k.startswith(GUIDANCE_PREFIX)}
    try:
        codec.check_tensors(shapes, trained)
        if want_guidance:
            if not guided:
                raise UpdateRejected("missing_guidance", "FedDWA needs the guidance model, the update has none")
            codec.check_tensors(shapes, guided)
    except codec.EnvelopeError as exc:
        raise UpdateRejected(exc.reason, str(exc)) from None
    if um is None:
        assert meta_error is not None
        raise UpdateRejected(_META_REASONS.get(fault or "", "bad_metrics"), str(meta_error))
    n_train, n_test = um.n_train, um.n_test
    if reported_n_train is not None and n_train > reported_n_train:
        # The weight n_k of FedAvg must be what the device announced with its windows, not
        # whatever an update claims: otherwise one device could make the aggregate its own model.
        raise UpdateRejected(
            "bad_metrics", f"update claims n_train = {n_train}, the client's status reported {reported_n_train} training windows"
        )

    def to_torch(d: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        # The decoded arrays are fresh copies already; only a dtype change copies again.
        return {k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in d.items()}

    return ClientUpdate(
        client_id=topic_client,
        round=env.round,
        stage=stage,
        n_train=n_train,
        n_test=n_test,
        state=to_torch(trained),
        guidance=to_torch(guided) if want_guidance else None,
        confusion=_confusions(um.confusion, spec.n_classes, n_test),
        meta={k: v for k, v in meta.items() if k != "confusion"},
        size=env.size,
    )
