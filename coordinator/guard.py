"""The quality guard: judge each new version by what its clients measured on it, and roll back a collapse.

Every client measures the model it receives on its own test windows before training (the record's
``start`` measure), so the version made in round r is judged at the end of round r + 1:

1. score(v) = sum_i n_i F1_i / sum_i n_i over the clients that reported both the judged and the best
   version (:func:`common_scores`);
2. the judged version is kept when its score is finite and at most ``margin`` points of macro-F1 below
   the best's; it becomes the best when it scores at least the best's;
3. otherwise round r + 1's model is discarded too: the federation continues from the best version,
   the strategy shrinks its step (:meth:`coordinator.strategies.base.Strategy.shrink_step`) and the
   record says ``guard: {"action": "rollback", ...}``.

Before that, an update far larger than the round's others is clipped (:func:`oversized_updates`,
:func:`clipped`), not left out, so a two-device quorum still holds. The best version lives in
:data:`BEST_FILE` (written atomically, so a resumed run compares with the same best). The rule holds
no state; docs/quality_guard.md gives the timing and the measured reasons for the defaults.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from coordinator.record import GuardNote
from coordinator.state import load_state_with_meta, save_state_file
from coordinator.updates import ClientUpdate
from har_models.nn.metrics import summarise
from har_models.nn.model import ArchSpec

BEST_FILE = "guard_best.safetensors"
"""The best version's global model and figures, in the run folder."""

DEFAULT_MARGIN = 10.0
"""Points of macro-F1 a version may fall below the best before it is rolled back (collapses fell 40-85
points; healthy start figures move a few; docs/quality_guard.md)."""

STEP_FACTOR = 0.5
"""What each rollback multiplies the strategy's server step by (its momentum is reset)."""


@dataclass(frozen=True)
class Best:
    """The best version so far: its round, its clients' start figures (client id -> (macro-F1, test windows)), its model."""

    round: int
    clients: Mapping[str, tuple[float, int]]
    spec: ArchSpec
    global_state: Mapping[str, torch.Tensor]


def client_figures(results: Sequence[ClientUpdate]) -> dict[str, tuple[float, int]]:
    """Each client's (macro-F1, test windows) of the model it received, from its "initial" confusion matrix.

    The record's ``start_clients`` figures; clients without such a matrix, or without windows, are left out.
    """
    out = {}
    for u in results:
        cm = u.confusion.get("initial")
        if cm is not None and int(np.asarray(cm).sum()) > 0:
            m = summarise(cm)
            out[u.client_id] = (float(m["macro_f1"]), int(m["n"]))
    return out


def weighted_f1(figures: Mapping[str, tuple[float, int]], clients: set[str]) -> float:
    """sum_i n_i F1_i / sum_i n_i over ``clients`` (NaN without windows or when any F1_i is NaN)."""
    n = sum(figures[c][1] for c in clients)
    if n == 0:
        return math.nan
    return sum(figures[c][0] * figures[c][1] for c in clients) / n


def common_scores(judged: Mapping[str, tuple[float, int]], best: Mapping[str, tuple[float, int]]) -> tuple[float, float, int]:
    """(judged score, best score, clients in both): :func:`weighted_f1` over the clients that reported both."""
    both = set(judged) & set(best)
    return weighted_f1(judged, both), weighted_f1(best, both), len(both)


def common_windows(judged: Mapping[str, tuple[float, int]], best: Mapping[str, tuple[float, int]]) -> int:
    """Test windows behind the judged version's figures on the clients that reported both versions."""
    return sum(judged[c][1] for c in set(judged) & set(best))


RECOVER_AFTER = 20
"""Versions kept in a row after which a shrunk server step doubles back (never above its setting); without
it the soak's five rollbacks left FedExP's step at 0.031 for 240 rounds (docs/quality_guard.md)."""

NORM_FACTOR = 10.0
"""How many times the others' median change an update may reach before it is clipped; honest updates of
one round are of one order of magnitude, a 100x device lies far beyond (docs/quality_guard.md)."""


def update_norms(results: Sequence[ClientUpdate], received: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """||w_i - w_0||_2 of each update against the received model, over the floating tensors both hold with one shape."""
    out = {}
    for u in results:
        sq = 0.0
        for name, w0 in received.items():
            w = u.state.get(name)
            if w is not None and w.shape == w0.shape and w0.is_floating_point():
                sq += float(((w.double() - w0.double()) ** 2).sum())
        out[u.client_id] = math.sqrt(sq)
    return out


NEWCOMER_SLACK = 5.0
"""Extra factor for a device without a recent accepted update (it starts far from the others: 11 of 21
clipped updates in the soak); 10 x 5 still catches a 100x device in its first round."""


def oversized_updates(
    results: Sequence[ClientUpdate], received: Mapping[str, torch.Tensor], factor: float = NORM_FACTOR,
    history: Mapping[str, float] | None = None,
) -> dict[str, tuple[float, str]]:
    """The updates of a round that change the model far more than the others do; client id -> (others' median norm, reason).

    Update i is oversized when its norm (:func:`update_norms`) is not finite or exceeds ``factor`` x the
    median of the *other* updates' norms (one update alone is never left out): norm bounding (Sun et al.,
    "Can You Really Backdoor Federated Learning?", 2019, arXiv:1911.07963, Sec. 4) with the bound from the
    round itself. With ``history`` (each device's median recent norm) an update must also exceed ``factor``
    x its own; a device without one gets :data:`NEWCOMER_SLACK`. Raises ValueError unless ``factor`` is finite and > 1.
    """
    if not (math.isfinite(factor) and factor > 1):
        raise ValueError(f"the update norm factor must be a finite number > 1, got {factor}")
    norms = update_norms(results, received)
    out = {}
    for cid, norm in norms.items():
        others = [v for c, v in norms.items() if c != cid and math.isfinite(v)]
        if not others:
            continue
        median = float(np.median(others))
        own = None if history is None else history.get(cid)
        bound = factor * median * (NEWCOMER_SLACK if history is not None and own is None else 1.0)
        if own is not None:
            bound = max(bound, factor * own)
        if not math.isfinite(norm) or norm > bound:
            whose = "" if history is None else (f" and its own recent {own:.3g}" if own is not None else " (it has no recent accepted "
                                                                                                   "update: x 5 allowed)")
            out[cid] = (median, f"update norm {norm:.3g} is more than {factor:g} x the other updates' median {median:.3g}{whose}")
    return out


def clipped(update: ClientUpdate, received: Mapping[str, torch.Tensor], norm: float) -> ClientUpdate:
    """``update`` with its change scaled down to L2 norm ``norm``: w0 + (w - w0) norm / ||w - w0|| (only if larger).

    Only the floating tensors :func:`update_norms` measures change. Raises ValueError if ``norm`` is
    negative or not finite, or the update's change is not finite.
    """
    if not (math.isfinite(norm) and norm >= 0):
        raise ValueError(f"clipped: the norm to clip to must be finite and >= 0, got {norm}")
    have = update_norms([update], received)[update.client_id]
    if not math.isfinite(have):
        raise ValueError(f"clipped: the update of {update.client_id} changes the model by a non-finite amount")
    if have <= norm:
        return update
    scale = norm / have
    state = dict(update.state)
    for name, w0 in received.items():
        w = state.get(name)
        if w is not None and w.shape == w0.shape and w0.is_floating_point():
            state[name] = (w0.double() + (w.double() - w0.double()) * scale).to(w.dtype)
    return replace(update, state=state)


def finite_model(state: Mapping[str, torch.Tensor]) -> bool:
    """True when every floating tensor of ``state`` is finite."""
    return all(bool(torch.isfinite(t).all()) for t in state.values() if t.is_floating_point())


def judge(judged_round: int, judged: Mapping[str, tuple[float, int]], best: Best | None, margin: float,
          new_model_finite: bool = True, min_devices: int = 1, min_windows: int = 0) -> GuardNote:  # fmt: skip
    """The guard's decision on the version of ``judged_round`` (-1: the initial model); see the module docstring.

    ``judged`` maps client id -> (macro-F1 in [0, 1], test windows); ``margin`` is in points (0..100).
    With fewer than ``min_devices`` devices or ``min_windows`` windows behind the comparison the guard
    abstains (one device's few windows move more than the margin in an honest federation). "rollback"
    needs a best version; "keep" names the best's round (or ``judged_round``). Raises ValueError if
    ``margin`` is negative or not finite.
    """
    if not (math.isfinite(margin) and margin >= 0):
        raise ValueError(f"guard margin must be a finite number of points >= 0 (--guard-margin), got {margin}")
    if best is None:
        return GuardNote("keep", judged_round, judged_round, "first version judged")
    if not new_model_finite:
        return GuardNote("rollback", judged_round, best.round, "the round's aggregate holds NaN or inf")
    score, best_score, n = common_scores(judged, best.clients)
    windows = common_windows(judged, best.clients)
    if n == 0:
        return GuardNote("keep", judged_round, best.round, "no client measured both versions")
    if not math.isfinite(score) or not math.isfinite(best_score):
        return GuardNote("rollback", judged_round, best.round, f"start macro-F1 not finite ({score} against {best_score})", n, windows)
    text = (f"start macro-F1 {100 * score:.1f}% against the best's (round {best.round}) {100 * best_score:.1f}% "
            f"on {n} client(s) and {windows} test windows, margin {margin:g} points")  # fmt: skip
    if n < min_devices or windows < min_windows:
        return GuardNote("abstain", judged_round, best.round, f"{text}; too little evidence to judge (at least {min_devices} "
                                                              f"device(s) and {min_windows} windows)", n, windows)  # fmt: skip
    if score < best_score - margin / 100:
        return GuardNote("rollback", judged_round, best.round, text, n, windows)
    return GuardNote("keep", judged_round, judged_round if score >= best_score else best.round, text, n, windows)


def save_best(folder: Path, best: Best) -> None:
    """Write ``best`` to ``folder / BEST_FILE`` atomically (its figures in the file's metadata)."""
    figures = {c: [f, n] for c, (f, n) in best.clients.items()}
    save_state_file(folder / BEST_FILE, best.spec, best.global_state,
                    {"round": str(best.round), "clients": json.dumps(figures)})  # fmt: skip


def load_best(folder: Path) -> Best | None:
    """The best version :func:`save_best` wrote in ``folder``, or None; ValueError naming an unreadable file."""
    path = folder / BEST_FILE
    if not path.exists():
        return None
    try:
        spec, state, meta = load_state_with_meta(path)
        figures = {str(c): (float(v[0]), int(v[1])) for c, v in json.loads(meta["clients"]).items()}
        return Best(int(meta["round"]), figures, spec, state)
    except Exception as exc:  # a damaged header raises safetensors' own types
        raise ValueError(
            f"{path}: unreadable best version of the quality guard ({type(exc).__name__}: {exc}); delete it to start judging afresh"
        ) from exc
