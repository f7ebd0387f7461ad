"""The quality guard: judge each new version by what its clients measured on it, and roll back a collapse.

The coordinator holds no data, but every client measures the model it receives on its own test
windows before it trains (the record's ``start`` measure, :class:`coordinator.record.Evaluation`).
So the version made in round r is judged only in round r + 1, when the clients that received it
report its start figures. The runner (:class:`coordinator.runner.FederationRunner`) does this
at the end of every round r + 1 when the guard is on:

1. score(v) = sum_i n_i F1_i / sum_i n_i, the macro-F1 of each client i weighted by its test
   windows n_i, over the clients that reported a start measure both for the judged version and
   for the best version so far (:func:`common_scores`);
2. the judged version is *kept* when its score is finite and at most ``margin`` points (of
   macro-F1, in %) below the best's on those clients; it becomes the best when its score is at
   least the best's;
3. otherwise (more than ``margin`` below, or a non-finite score or model) the round's new model,
   made from the judged version, is discarded with it: the federation continues from the best
   version's model, the strategy takes a smaller server step
   (:meth:`coordinator.strategies.base.Strategy.shrink_step`), and the round's record says
   ``guard: {"action": "rollback", "to_round": best, ...}``.

The first version judged becomes the best (there is nothing to compare it with); when the two
versions share no client, the judged one is kept and not made the best. The best version (its
round, its clients' figures and its global model) lives in ``guard_best.safetensors`` in the run
folder, written atomically, so a resumed run (also after kill -9) compares with the same best.

Before that, in every round with the guard on, an update that changes the model far more than the round's
other updates (:func:`oversized_updates`) is clipped to the median of the others' norms (:func:`clipped`)
and the event counted (``clipped_update``): the rollback above judges a version only after clients trained
on it, and cannot tell which device spoiled it. Clipped, not left out: a device re-sends its stored update
to every new attempt of the round on the same model, so an update left out would fail the quorum of a
two-device federation again at every attempt (the soak test stalled that way).

A halved step is not halved for good: after :data:`RECOVER_AFTER` versions kept in a row it doubles back,
at most to the strategy's setting (the runner replays the records' decisions after a restart).

This module is the rule; it holds no state and touches no files except through
:func:`save_best` / :func:`load_best`.
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
from coordinator.state import load_state_file, save_state_file
from coordinator.updates import ClientUpdate
from har_models.nn.metrics import summarise
from har_models.nn.model import ArchSpec

BEST_FILE = "guard_best.safetensors"
"""The best version's global model and figures, in the run folder."""

DEFAULT_MARGIN = 10.0
"""Points of macro-F1 a version may fall below the best before it is rolled back. Issue 28's collapses fell 40 to 85
points within a few rounds, while a healthy 2-device federation's round-to-round start figures move by a few points;
10 is the drop the issue itself calls divergence."""

STEP_FACTOR = 0.5
"""What each rollback multiplies the strategy's server step by (and its momentum is reset)."""


@dataclass(frozen=True)
class Best:
    """The best version so far: its round, its clients' start figures (client id -> (macro-F1, test windows)), its model."""

    round: int
    clients: Mapping[str, tuple[float, int]]
    spec: ArchSpec
    global_state: Mapping[str, torch.Tensor]


def client_figures(results: Sequence[ClientUpdate]) -> dict[str, tuple[float, int]]:
    """Each client's (macro-F1, test windows) of the model it received, from its update's "initial" confusion matrix.

    The same figures as the record's ``start_clients`` (:func:`coordinator.round.evaluate_round`); clients that sent
    no such matrix, or one without windows, are left out.
    """
    out = {}
    for u in results:
        cm = u.confusion.get("initial")
        if cm is not None and int(np.asarray(cm).sum()) > 0:
            m = summarise(cm)
            out[u.client_id] = (float(m["macro_f1"]), int(m["n"]))
    return out


def weighted_f1(figures: Mapping[str, tuple[float, int]], clients: set[str]) -> float:
    """sum_i n_i F1_i / sum_i n_i over ``clients`` (NaN when they hold no windows; NaN when any F1_i is NaN)."""
    n = sum(figures[c][1] for c in clients)
    if n == 0:
        return math.nan
    return sum(figures[c][0] * figures[c][1] for c in clients) / n


def common_scores(judged: Mapping[str, tuple[float, int]], best: Mapping[str, tuple[float, int]]) -> tuple[float, float, int]:
    """(judged score, best score, clients in both): :func:`weighted_f1` of each over the clients that reported in both."""
    both = set(judged) & set(best)
    return weighted_f1(judged, both), weighted_f1(best, both), len(both)


def common_windows(judged: Mapping[str, tuple[float, int]], best: Mapping[str, tuple[float, int]]) -> int:
    """Test windows behind the judged version's figures on the clients that reported both versions."""
    return sum(judged[c][1] for c in set(judged) & set(best))


RECOVER_AFTER = 20
"""Versions kept in a row after which a server step that rollbacks shrank doubles back (never above its setting). Without
it each rollback halved the step for good: in the soak five rollbacks in ten rounds left FedExP's step at 0.031 for the
240 rounds after them. Twenty rounds is long enough that a federation still collapsing is rolled back again first."""

NORM_FACTOR = 10.0
"""How many times the median change of the other updates an update's change to the model may be before it is clipped
(:func:`oversized_updates`). Clients of one round train from the same model with the same plan and data of one kind,
so their changes are of one order of magnitude; a device whose update is 100x too large (benchmarks/soak_serve.py)
lies far beyond 10. Without this rule the guard could only roll back after the fact: in the soak such a device made
every other round a rollback while it stayed, and each rollback halved the server step."""


def update_norms(results: Sequence[ClientUpdate], received: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """||w_i - w_0||_2 of each update: its trained tensors w_i against the model w_0 it received, over the floating
    tensors both hold with the same shape (client id -> norm, in the weights' units)."""
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
"""How many times further a device with no recent accepted update of its own may go before it is clipped: a device that
just joined or came back from a freeze starts far from where the others are (its local state is old), and in the soak
11 of 21 clipped updates were such honest devices. 10 x 5 = 50 x the others' median still catches a device whose
updates are 100 x too large in its first round, and one that was clipped never builds a history of its own."""


def oversized_updates(
    results: Sequence[ClientUpdate], received: Mapping[str, torch.Tensor], factor: float = NORM_FACTOR,
    history: Mapping[str, float] | None = None,
) -> dict[str, tuple[float, str]]:
    """The updates of a round that change the model far more than the others do (the runner clips them).

    An update i is oversized when ||w_i - w_0|| > ``factor`` x the median of the other updates' norms
    (:func:`update_norms`), or when its norm is not finite. The median of the *others* lets two updates
    tell which of them is the outlier; with one update there is nothing to compare and none is left
    out. This is norm bounding (Sun et al., "Can You Really Backdoor Federated Learning?", 2019,
    arXiv:1911.07963, Sec. 4), with the bound taken from the round's own updates since a home
    federation has no fixed scale of its updates.

    Parameters
    ----------
    results : sequence of ClientUpdate
        The round's valid updates.
    received : mapping name -> tensor
        The global model the clients received (w_0).
    factor : float > 1
    history : mapping client id -> norm, optional
        Each device's typical norm of its recent accepted updates (the median). With a history, an update is
        oversized only when it is also more than ``factor`` x its own history; a device without one (it just
        joined or came back) is judged against ``factor`` x :data:`NEWCOMER_SLACK` x the others' median.
        None: the others' median alone, for every device.

    Returns
    -------
    dict client id -> (median, reason)
        The other updates' median norm (what :func:`clipped` scales the update down to) and text for
        the log and the round's events.

    Raises
    ------
    ValueError
        If ``factor`` is not a finite number > 1.
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
    """``update`` with its change to the model scaled down to L2 norm ``norm``: w0 + (w - w0) norm / ||w - w0||.

    Only the floating tensors that :func:`update_norms` measures change; the rest (and the guidance) stay.
    An update whose change is no larger than ``norm`` is returned as it is.

    Raises
    ------
    ValueError
        If ``norm`` is negative or not finite, or the update's change is not finite.
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
    """The guard's decision on the version of ``judged_round`` (module docstring).

    Parameters
    ----------
    judged_round : int
        Round that made the version the clients received (-1: the initial model).
    judged : mapping client id -> (macro-F1 in [0, 1], test windows)
        The clients' start figures of that version.
    best : Best or None
        The best version so far (None: none judged yet).
    margin : float >= 0
        Points of macro-F1 (0..100) the judged version may fall below the best.
    new_model_finite : bool
        False when this round's aggregate holds NaN or inf.
    min_devices, min_windows : int
        The least evidence a comparison needs: devices that measured both versions, and their test windows.
        With less, the guard abstains (the version stands, and it is not made the best): one device's
        test windows, a handful of them, move by more than the margin from round to round in an honest
        federation (the soak's rollbacks "on 1 client(s)").

    Returns
    -------
    GuardNote
        "rollback" only when there is a best version to go back to; "abstain" when the evidence is below the
        minimum; "keep" otherwise, with ``to_round`` the best's round (``judged_round`` when there is no best
        yet). ``devices`` and ``windows`` say what the comparison rested on.

    Raises
    ------
    ValueError
        If ``margin`` is negative or not finite.
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
    """The best version :func:`save_best` wrote in ``folder``; None when there is none.

    Raises
    ------
    ValueError
        If the file is unreadable or inconsistent (the message names it; delete it to start judging afresh).
    """
    path = folder / BEST_FILE
    if not path.exists():
        return None
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        spec, state = load_state_file(path)
        figures = {str(c): (float(v[0]), int(v[1])) for c, v in json.loads(meta["clients"]).items()}
        return Best(int(meta["round"]), figures, spec, state)
    except Exception as exc:  # a damaged header raises safetensors' own types
        raise ValueError(
            f"{path}: unreadable best version of the quality guard ({type(exc).__name__}: {exc}); delete it to start judging afresh"
        ) from exc
