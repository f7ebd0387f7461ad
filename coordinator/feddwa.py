"""FedDWA: personalised aggregation weighted by the distance to each client's guidance model.

Liu, Wu, Chen, Hu, Zhou, Wu, "FedDWA: Personalized Federated Learning with Dynamic Weight
Adjustment", IJCAI 2023 (arXiv 2305.06124); reference/algorithms.md section 2. Equation
numbers (8), (15), (17) are reconstructed there and still to be checked against the paper.

Every participant j of round t uploads its trained model w_j and a guidance model ŵ_j (one
more local pass from w_j). With d_ij^2 = ||ŵ_i - w_j||^2 over all parameters, client i gets

    p_ij = d_ij^{-2} / sum_{k in S_t} d_ik^{-2}                                    (Eq. 17, reconstructed)

restricted to its K largest p_ij (renormalised), and the personalised model

    w̄_i = sum_{j in S_t} p_ij w_j                                                 (Eq. 8, reconstructed)

Matrix convention (as in the authors' code): ``D[j, i]`` and ``P[j, i]`` have the *source*
(trained model j) in the row and the *target* client i in the column, so client i's weights
are column i and every column sums to 1.

The three steps are separate functions, so a caller can log D and P and reuse P (e.g. to
re-mix the models of a FedDist intermediate round with this round's P, algorithms.md 5.2
step 6B): :func:`distances` -> :func:`weights` -> :func:`personalise`; :func:`aggregate`
chains them. Non-finite uploads must not get here: the coordinator rejects them when it
validates an upload (DESIGN.md section 3); :func:`finite_clients` is the same check for
callers that hold models in memory, and :func:`distances` refuses non-finite input.

Models need not be in memory: a state that also has the methods of :class:`FlatBlockSource`
(the coordinator's spilled updates, :class:`coordinator.spill.SpilledState`, which read
from memory-mapped files) is read one block of the parameter axis at a time, so
:func:`distances` and :func:`personalise` hold one ``(n, b)`` block of all clients (plus
the n personalised outputs) rather than every trained and guidance model. The numbers and
their order of summation are the same either way, so the results are identical.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from coordinator.aggregation import State

log = logging.getLogger(__name__)

DEFAULT_BLOCK_BYTES = 24 * 2**20
"""Memory of one float64 block of stacked parameters in :func:`distances` (per model set).
24 MiB (32,768 parameters per row at 100 clients) took the 100-client distances over the
paper CNN from 5.9 to 4.6 s of CPU against 64 MiB (``benchmarks/bench_aggregation.py``):
the block just stacked is still in cache when the norms and the Gram product read it."""

MIX_BLOCK_BYTES = 24 * 2**20
"""Bytes of the n float64 source rows one block of a sparse :func:`personalise` holds
(so the K reads of each row mostly hit the last-level cache)."""


@runtime_checkable
class FlatBlockSource(Protocol):
    """A model state that can hand out slices of its tensors without loading them whole.

    :func:`distances` and :func:`personalise` read such a state block by block through these
    two methods instead of ``state[name]``; other mappings are read into memory once.
    """

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor ``name``."""
        ...

    def read_flat(self, name: str, lo: int, hi: int, out: np.ndarray) -> None:
        """Copy elements ``[lo, hi)`` of tensor ``name`` (flattened, C order) into ``out`` (shape ``(hi - lo,)``)."""
        ...


@dataclass(frozen=True)
class DwaResult:
    """Output of :func:`aggregate` for one round.

    Attributes
    ----------
    distances : Tensor of shape ``(n, n)``, float64
        D[j, i] = ||ŵ_i - w_j||^2.
    weights : Tensor of shape ``(n, n)``, float64
        P[j, i] = p_ij; every column sums to 1.
    states : list of n dicts name -> float32 Tensor
        The personalised model of each client, in input order.
    average : dict name -> float32 Tensor, or None
        The shadow FedAvg average sum_j n_j / n w_j, if :func:`aggregate` was given the
        weights n_j.
    """

    distances: torch.Tensor
    weights: torch.Tensor
    states: list[State]
    average: State | None = None


def finite_clients(*state_lists: Sequence[Mapping[str, torch.Tensor]]) -> list[int]:
    """Indices i whose states are finite in every list (e.g. trained and guidance models).

    Parameters
    ----------
    *state_lists : sequences of n mappings name -> Tensor
        Parallel lists, e.g. ``finite_clients(trained, guidance)``.

    Returns
    -------
    list of int
        The clients to keep, ascending. Subset every list with it before :func:`distances`.

    Raises
    ------
    ValueError
        If no list is given or the lists differ in length.
    """
    if not state_lists:
        raise ValueError("finite_clients: pass at least one list of states")
    n = len(state_lists[0])
    if any(len(s) != n for s in state_lists):
        raise ValueError(f"finite_clients: lists have different lengths {[len(s) for s in state_lists]}")
    keep = []
    for i in range(n):
        bad = [name for states in state_lists for name, t in states[i].items() if not torch.isfinite(t).all()]
        if bad:
            log.warning("FedDWA: client #%d excluded, non-finite values in %s", i, sorted(set(bad)))
        else:
            keep.append(i)
    return keep


GRAMS = ("float32", "float64")
"""Arithmetic of the Gram product in :func:`distances`: ``"float32"`` (centred float32 blocks, products
summed in float64; the default) or ``"float64"`` (exact: every product in float64)."""

DEFAULT_GRAM = "float32"
"""The Gram arithmetic :func:`distances` uses unless told otherwise. Against the exact float64 product, float32
with centred blocks gave the same top-K sets and p_ij within 1e-7 (worst absolute difference) on 30 clients of a
0.5 M-parameter CNN whose guidance step is a fifth of the clients' spread, and within 2e-8 on 30 spilled
paper-CNN updates of ``benchmarks/bench_aggregation.py`` (tests/test_feddwa_gram.py asserts 1e-6). On those 30
spilled updates the distances took 1.19-1.26 s of CPU instead of 1.65-2.05 s (1 thread, a shared machine)."""


GRAM_CHUNK = 1024
"""Parameters per float32 partial product and partial squared norm in :func:`distances` with ``gram="float32"``;
the partial results are summed in float64. Rounding grows with the terms a float32 sum adds. Measured against the
exact product, worst relative error of a squared distance (a client's own, the smallest, is the worst): whole
200,000-parameter blocks 7e-5; chunks of 4,096 parameters 9e-7 (30 clients, 0.5 M-parameter CNN) and 1.1e-5
(6 clients, 9,198-parameter CNN); chunks of 1,024 8e-7 and 3e-6, at the speed of one matmul per block (norms
accumulated in float64 instead cost twice the product's time)."""


def distances(
    guidance_states: Sequence[Mapping[str, torch.Tensor]],
    trained_states: Sequence[Mapping[str, torch.Tensor]],
    *,
    block_size: int | None = None,
    gram: str = DEFAULT_GRAM,
) -> torch.Tensor:
    """Squared distances between every guidance model and every trained model, via one Gram matrix.

    D[j, i] = ||ŵ_i - w_j||_2^2 over all parameters (flattened and concatenated), computed as

        D = ||w||^2 1^T + 1 ||ŵ||^2^T - 2 W Ŵ^T,     clamped at 0,

    with W (n, n_params) the stacked trained models and Ŵ the stacked guidance models. The
    product W Ŵ^T is accumulated in float64 over blocks of the parameter axis (one
    ``(n, b) @ (b, n)`` matmul per block, a handful of tensor operations per block whatever n
    is), so the extra memory is a few reused ``(n, b)`` buffers rather than a stacked copy of
    all models (states that are :class:`FlatBlockSource` are read block by block and never
    held whole); cost O(n^2 * n_params) flops in BLAS instead of n^2 Python-level passes.

    ``gram="float64"`` (exact) widens every block to float64: the cancellation error is of the
    order of 1e-16 * ||w||^2 (about 1e-12 for the 6.45 M-parameter CNN at its initial scale),
    far below any distance between distinct models. ``gram="float32"`` (default) keeps the
    blocks in float32 as stored and first subtracts from both W and Ŵ the block's mean trained
    row c (D is unchanged by a common shift: ||(ŵ_i - c) - (w_j - c)|| = ||ŵ_i - w_j||), so
    the norms and products are of the size of the models' differences instead of the models
    themselves and float32 cancellation stays small; each block's ``(n, n)`` float32 product
    and its norms, over chunks of :data:`GRAM_CHUNK` parameters, are summed into float64. Half
    the bytes to stack and a float32 matmul make it faster; :data:`DEFAULT_GRAM` gives the
    measured speed and how far the weights p_ij it leads to are from the exact ones.

    Parameters
    ----------
    guidance_states : sequence of n mappings name -> Tensor
        ŵ_i, the guidance (one-step-ahead) models, index i = target client.
    trained_states : sequence of n mappings name -> Tensor
        w_j, the trained models, same names and shapes.
    block_size : int, optional
        Parameters per block; default so that one block is about :data:`DEFAULT_BLOCK_BYTES`.
    gram : {"float32", "float64"}
        Arithmetic of the Gram product (:data:`GRAMS`); default :data:`DEFAULT_GRAM`.

    Returns
    -------
    Tensor of shape ``(n, n)``, float64, >= 0; row j = trained model, column i = guidance model.

    Raises
    ------
    ValueError
        If the lists are empty or differ in length, names or shapes differ between any two
        states, ``block_size`` < 1, ``gram`` is not one of :data:`GRAMS`, or a state holds
        NaN/inf (the message names the clients; exclude them first with :func:`finite_clients`).
    """
    n = len(trained_states)
    if n == 0 or len(guidance_states) != n:
        raise ValueError(
            f"distances: need one guidance model per trained model and n >= 1, got {len(guidance_states)} and {n}"
        )
    if gram not in GRAMS:
        raise ValueError(f"distances: gram must be one of {GRAMS}, got {gram!r}")
    names, shapes = _common_layout(trained_states, guidance_states, "distances")
    if gram == "float32":
        return _distances_float32(guidance_states, trained_states, names, shapes, block_size)
    b = _block_size(block_size, n, shapes, "distances")

    inner = torch.zeros(n, n, dtype=torch.float64)  # inner[j, i] = <w_j, ŵ_i>
    sq_w = torch.zeros(n, dtype=torch.float64)
    sq_g = torch.zeros(n, dtype=torch.float64)
    stack_w = _BlockStacker(trained_states, names, b)
    stack_g = _BlockStacker(guidance_states, names, b)
    try:
        for k, lo, hi in _blocks(shapes, b):
            bw = stack_w.block(k, lo, hi)
            bg = stack_g.block(k, lo, hi)
            sq_w += torch.linalg.vector_norm(bw, dim=1).square_()
            sq_g += torch.linalg.vector_norm(bg, dim=1).square_()
            inner.addmm_(bw, bg.T)
    finally:
        stack_w.close()
        stack_g.close()

    bad_w = (~torch.isfinite(sq_w)).nonzero().flatten().tolist()
    bad_g = (~torch.isfinite(sq_g)).nonzero().flatten().tolist()
    if bad_w or bad_g or not torch.isfinite(inner).all():
        raise ValueError(
            f"distances: non-finite values in trained models {bad_w} / guidance models {bad_g}; "
            "exclude those clients first (finite_clients)"
        )
    d = sq_w[:, None] + sq_g[None, :] - 2.0 * inner
    return d.clamp_(min=0.0)


def _distances_float32(
    guidance_states: Sequence[Mapping[str, torch.Tensor]],
    trained_states: Sequence[Mapping[str, torch.Tensor]],
    names: list[str],
    shapes: list[tuple[int, ...]],
    block_size: int | None,
) -> torch.Tensor:
    """:func:`distances` with ``gram="float32"``: centred float32 blocks, norms and products summed in float64."""
    n = len(trained_states)
    b = _block_size(block_size, n, shapes, "distances", item_bytes=4)
    gram = torch.zeros(n, n, dtype=torch.float64)  # gram[j, i] = <w_j - c, ŵ_i - c>
    sq_w = torch.zeros(n, dtype=torch.float64)
    sq_g = torch.zeros(n, dtype=torch.float64)
    prod = torch.empty(n, n, dtype=torch.float32)
    bad_rows = torch.zeros(n, dtype=torch.bool)  # trained models found non-finite (and zeroed) while centring
    stack_w = _BlockStacker(trained_states, names, b, dtype=torch.float32)
    stack_g = _BlockStacker(guidance_states, names, b, dtype=torch.float32)
    try:
        for k, lo, hi in _blocks(shapes, b):
            bw = stack_w.block(k, lo, hi)
            bg = stack_g.block(k, lo, hi)
            c = bw.mean(0)
            if not torch.isfinite(c).all():  # a non-finite trained row would spread to every row once c is subtracted
                rows = ~torch.isfinite(bw).all(1)
                bad_rows |= rows
                bw[rows] = 0.0
                c = bw.mean(0)
            bw.sub_(c)
            bg.sub_(c)
            m = hi - lo
            s = m // GRAM_CHUNK
            if s:  # whole chunks: one batched float32 product per block, the chunks' results summed in float64
                x = bw[:, : s * GRAM_CHUNK].unflatten(1, (s, GRAM_CHUNK))  # (n, s, chunk), a view
                y = bg[:, : s * GRAM_CHUNK].unflatten(1, (s, GRAM_CHUNK))
                gram += torch.bmm(x.transpose(0, 1), y.permute(1, 2, 0)).sum(0, dtype=torch.float64)
                sq_w += torch.linalg.vector_norm(x, dim=2).double().square_().sum(1)
                sq_g += torch.linalg.vector_norm(y, dim=2).double().square_().sum(1)
            if m > s * GRAM_CHUNK:  # the tensor's last, shorter chunk
                tw, tg = bw[:, s * GRAM_CHUNK :], bg[:, s * GRAM_CHUNK :]
                gram += torch.mm(tw, tg.T, out=prod)
                sq_w += torch.linalg.vector_norm(tw, dim=1).double().square_()
                sq_g += torch.linalg.vector_norm(tg, dim=1).double().square_()
    finally:
        stack_w.close()
        stack_g.close()
    bad_w = (~torch.isfinite(sq_w) | bad_rows).nonzero().flatten().tolist()
    bad_g = (~torch.isfinite(sq_g)).nonzero().flatten().tolist()
    if bad_w or bad_g or not torch.isfinite(gram).all():
        raise ValueError(
            f"distances: non-finite values in trained models {bad_w} / guidance models {bad_g}; "
            "exclude those clients first (finite_clients)"
        )
    d = sq_w[:, None] + sq_g[None, :] - 2.0 * gram
    return d.clamp_(min=0.0)


def weights(D: torch.Tensor | np.ndarray, top_k: int = 5, eps: float = 1e-12) -> torch.Tensor:
    """FedDWA aggregation weights p_ij from squared distances, with top-K per client.

    Liu et al., IJCAI 2023, Eq. (17) (reconstructed; algorithms.md 2.2 [DERIVED], identical to
    the authors' ``cal_optimal_weight``) and the top-K step (algorithms.md 2.3 [CODE]):

    1. A[j, i] = 1 / (D[j, i] + eps)         (= d_ij^{-2}; eps keeps D = 0 finite [PROPOSAL])
    2. A[:, i] /= sum_j A[j, i]              (column-normalise)
    3. keep the ``top_k`` largest entries of each column, zero the rest; ties keep the lower
       index j (stable sort), so the result is deterministic; nothing is zeroed if top_k >= n
    4. A[:, i] /= sum_j A[j, i]              (renormalise)

    A column that is not finite or sums to 0 after these steps (e.g. ``eps=0`` with a zero
    distance, or every distance infinite) falls back to p_ii = 1: the client keeps its own
    trained model.

    Parameters
    ----------
    D : Tensor or ndarray of shape ``(n, n)``
        Squared distances, D[j, i] = ||ŵ_i - w_j||^2 (from :func:`distances`); >= 0, may be inf.
    top_k : int
        K, the number of models mixed into each personalised model (5, the authors' default).
    eps : float
        Added to D before inverting (1e-12, in squared-parameter units; squared distances
        between trained HAR CNNs are many orders of magnitude larger, so eps only matters
        when a distance is exactly 0).

    Returns
    -------
    Tensor of shape ``(n, n)``, float64: P[j, i] = p_ij, >= 0, each column sums to 1 and has
    at most ``top_k`` non-zeros.

    Raises
    ------
    ValueError
        If D is not square or holds NaN or negative values, ``top_k`` < 1, or ``eps`` is
        negative or not finite.
    """
    d = torch.as_tensor(np.asarray(D) if not isinstance(D, torch.Tensor) else D).detach().to(torch.float64)
    if d.dim() != 2 or d.shape[0] != d.shape[1] or d.shape[0] == 0:
        raise ValueError(f"weights: D must be a non-empty square (n, n) matrix, got shape {tuple(d.shape)}")
    if torch.isnan(d).any() or (d < 0).any():
        raise ValueError("weights: D holds NaN or negative values; pass squared distances from distances()")
    if int(top_k) != top_k or top_k < 1:
        raise ValueError(f"weights: top_k must be an integer >= 1, got {top_k}")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"weights: eps must be finite and >= 0, got {eps}")
    n = d.shape[0]
    a = 1.0 / (d + eps)
    a = a / a.sum(0, keepdim=True)
    if top_k < n:
        # Stable sort of -a: among equal weights the lower source index comes first.
        order = np.argsort(-a.numpy(), axis=0, kind="stable")[: int(top_k)]
        keep = torch.zeros(n, n, dtype=torch.bool)
        keep[torch.from_numpy(order), torch.arange(n).expand(int(top_k), n)] = True
        a = torch.where(keep, a, torch.zeros((), dtype=torch.float64))
        a = a / a.sum(0, keepdim=True)
    col_sum = a.sum(0)
    bad = ~torch.isfinite(a).all(0) | ~(col_sum > 0)
    if bad.any():
        cols = bad.nonzero().flatten().tolist()
        log.warning("FedDWA: weights of clients %s not finite or all zero; they keep their own model (p_ii = 1)", cols)
        a[:, bad] = 0.0
        a[cols, cols] = 1.0
    return a


def personalise(
    trained_states: Sequence[Mapping[str, torch.Tensor]],
    P: torch.Tensor | np.ndarray,
    *,
    block_size: int | None = None,
) -> list[State]:
    """Personalised models w̄_i = sum_j P[j, i] w_j (Liu et al., Eq. (8), reconstructed).

    Computed as one product P^T W per block of the parameter axis, with W the
    ``(n, n_params)`` stacked trained models, accumulated in float64 and returned as float32
    (as :func:`coordinator.aggregation.weighted_average` does). Each column of P is divided
    by its sum first, which is 1 for the output of :func:`weights`. P may have more columns
    than rows: any column is one more mix of the same models (e.g. the FedAvg weights
    n_j / n for the shadow average, see :func:`aggregate`). A P with at most a quarter of its
    entries non-zero (FedDWA's top-K columns once n > 4K) is multiplied as a sparse matrix,
    so the cost per block is (non-zeros x b) instead of (n x m x b); the sums are the same
    up to float64 rounding order. Extra memory: one reused ``(n, b)`` float64 buffer and
    its ``(m, b)`` product besides the m output models; trained models that are
    :class:`FlatBlockSource` (memory-mapped files) are read block by block and never held whole.

    Parameters
    ----------
    trained_states : sequence of n mappings name -> Tensor
        w_j, the trained models of the round, same names and shapes.
    P : Tensor or ndarray of shape ``(n, m)``
        P[j, i] = p_ij (source j, target i), >= 0, every column with a positive sum; m >= 1
        (m = n for FedDWA's weights).
    block_size : int, optional
        Parameters per block; default so that one float64 block is about 64 MiB.

    Returns
    -------
    list of m dicts name -> float32 Tensor, index i = the mix of column i (client i's
    personalised model for FedDWA's P).

    Raises
    ------
    ValueError
        If P does not have n rows and at least one column, holds negative or non-finite
        values, or has a zero column, or the states differ in names or shapes.
    """
    p = torch.as_tensor(np.asarray(P) if not isinstance(P, torch.Tensor) else P).detach().to(torch.float64)
    n = len(trained_states)
    if p.dim() != 2 or p.shape[0] != n or p.shape[1] == 0 or n == 0:
        raise ValueError(f"personalise: P must have shape ({n}, m) with m >= 1 for {n} trained models, got {tuple(p.shape)}")
    if not torch.isfinite(p).all() or (p < 0).any():
        raise ValueError("personalise: P must be finite and >= 0; compute it with weights()")
    zero_cols = (p.sum(0) <= 0).nonzero().flatten().tolist()
    if zero_cols:
        raise ValueError(f"personalise: columns {zero_cols} of P are all zero; every client needs at least one source model")
    names, shapes = _common_layout(trained_states, [], "personalise")
    m = p.shape[1]
    pt = (p / p.sum(0, keepdim=True)).T.contiguous()  # pt[i, j] = p_ij, rows summing to 1
    out: list[State] = [{name: torch.empty(shape, dtype=torch.float32) for name, shape in zip(names, shapes, strict=True)}
                        for _ in range(m)]
    flat_out = [[o[name].view(-1) for name in names] for o in out]
    if 4 * int(torch.count_nonzero(pt)) > n * m:
        b = _block_size(block_size, n, shapes, "personalise")
        stacker = _BlockStacker(trained_states, names, b)
        res = torch.empty(m * b, dtype=torch.float64)
        try:
            for k, lo, hi in _blocks(shapes, b):
                r = res[: m * (hi - lo)].view(m, hi - lo)
                torch.mm(pt, stacker.block(k, lo, hi), out=r)
                for i in range(m):
                    flat_out[i][k][lo:hi].copy_(r[i])
        finally:
            stacker.close()
        return out
    # Sparse P (FedDWA's top-K columns once n > 4K): each mix adds only its non-zero sources,
    # in ascending j, into a float64 accumulator (as weighted_average does), K instead of n
    # multiply-adds per parameter. Blocks are sized so that the n source slices of a block
    # stay in cache while the m mixes read them.
    terms = []
    for i in range(m):
        src = pt[i].nonzero().flatten()
        terms.append(list(zip(src.tolist(), pt[i, src].tolist(), strict=True)))
    b = _block_size(block_size, n, shapes, "personalise", block_bytes=MIX_BLOCK_BYTES)
    # The sources stay float32 here (half the bytes to stack); every product and sum is still float64:
    # ``copy_`` widens exactly, and ``add_`` into the float64 accumulator computes in float64.
    stacker = _BlockStacker(trained_states, names, b, dtype=torch.float32)
    acc = torch.empty(b, dtype=torch.float64)
    try:
        for k, lo, hi in _blocks(shapes, b):
            rows = stacker.block(k, lo, hi)
            a = acc[: hi - lo]
            for i, ts in enumerate(terms):
                (j0, v0), *rest = ts  # 0 + v0 w_j0 is v0 w_j0: the first term is written, not added to zeros
                a.copy_(rows[j0]).mul_(v0)
                for j, v in rest:
                    a.add_(rows[j], alpha=v)
                flat_out[i][k][lo:hi].copy_(a)
    finally:
        stacker.close()
    return out


def aggregate(
    trained_states: Sequence[Mapping[str, torch.Tensor]],
    guidance_states: Sequence[Mapping[str, torch.Tensor]],
    top_k: int = 5,
    eps: float = 1e-12,
    *,
    block_size: int | None = None,
    average_weights: Sequence[float] | None = None,
    gram: str = DEFAULT_GRAM,
) -> DwaResult:
    """One FedDWA server step: :func:`distances` -> :func:`weights` -> :func:`personalise`.

    Parameters
    ----------
    trained_states, guidance_states : sequences of n mappings name -> Tensor
        w_j and ŵ_j of the round's participants (finite; same order).
    top_k, eps : see :func:`weights`.
    block_size : int, optional
        Parameters per block in :func:`distances` and :func:`personalise`.
    average_weights : sequence of n floats, optional
        FedAvg weights n_j (training windows). If given, the shadow average
        sum_j n_j / sum_k n_k w_j (McMahan et al. 2017) is mixed in the same pass over the
        trained models as the personalised models, and returned as ``average``; it equals
        :func:`coordinator.aggregation.weighted_average` up to float64 rounding order.
    gram : {"float32", "float64"}
        Arithmetic of the distances' Gram product (see :func:`distances`).

    Returns
    -------
    DwaResult

    Raises
    ------
    ValueError
        As the three steps; or if ``average_weights`` does not hold n finite values >= 0
        with a positive sum.
    """
    n = len(trained_states)
    avg: torch.Tensor | None = None
    if average_weights is not None:
        avg = torch.tensor([float(x) for x in average_weights], dtype=torch.float64)
        if avg.shape != (n,) or not torch.isfinite(avg).all() or (avg < 0).any() or not avg.sum() > 0:
            raise ValueError(
                f"aggregate: average_weights must be {n} finite values >= 0 with a positive sum, got {list(average_weights)}"
            )
    d = distances(guidance_states, trained_states, block_size=block_size, gram=gram)
    p = weights(d, top_k=top_k, eps=eps)
    if avg is None:
        states = personalise(trained_states, p, block_size=block_size)
        average = None
    else:
        *states, average = personalise(
            trained_states, torch.cat([p, (avg / avg.sum())[:, None]], dim=1), block_size=block_size
        )
    log.info(
        "FedDWA: %d clients, top_k=%d, self weight p_ii mean %.3f (min %.3f)",
        len(states), top_k, float(p.diagonal().mean()), float(p.diagonal().min()),
    )
    return DwaResult(d, p, states, average)


def _common_layout(
    trained: Sequence[Mapping[str, torch.Tensor]], guidance: Sequence[Mapping[str, torch.Tensor]], who: str
) -> tuple[list[str], list[tuple[int, ...]]]:
    """Names (in the first trained model's order) and shapes shared by every state."""
    names = list(trained[0])
    shapes = [_shape(trained[0], k) for k in names]
    for kind, states in (("trained", trained), ("guidance", guidance)):
        for idx, s in enumerate(states):
            if set(s) != set(names):
                raise ValueError(f"{who}: {kind} model #{idx} has tensors {sorted(s)}, expected {sorted(names)}")
            for name, shape in zip(names, shapes, strict=True):
                if _shape(s, name) != shape:
                    raise ValueError(
                        f"{who}: {kind} model #{idx} tensor {name!r} has shape {_shape(s, name)}, expected {shape}; "
                        "all models of a round must share one architecture version"
                    )
    return names, shapes


def _shape(state: Mapping[str, torch.Tensor], name: str) -> tuple[int, ...]:
    """Shape of one tensor of a state, without reading it when the state can say so."""
    if isinstance(state, FlatBlockSource):
        return tuple(state.tensor_shape(name))
    return tuple(state[name].shape)


def _block_size(
    block_size: int | None,
    n: int,
    shapes: Sequence[tuple[int, ...]],
    who: str,
    block_bytes: int | None = None,
    item_bytes: int = 8,
) -> int:
    """``block_size``, or the parameters per block that make n rows of ``item_bytes`` about ``block_bytes``."""
    if block_size is not None and int(block_size) < 1:
        raise ValueError(f"{who}: block_size must be >= 1, got {block_size}")
    budget = DEFAULT_BLOCK_BYTES if block_bytes is None else block_bytes
    b = int(block_size) if block_size is not None else max(1024, budget // (item_bytes * n))
    return max(1, min(b, max((math.prod(s) for s in shapes), default=1)))


def _blocks(shapes: Sequence[tuple[int, ...]], b: int) -> Iterator[tuple[int, int, int]]:
    """(tensor index, lo, hi) over every tensor's flattened elements, ``b`` at a time."""
    for k, shape in enumerate(shapes):
        size = math.prod(shape)
        for lo in range(0, size, b):
            yield k, lo, min(lo + b, size)


class _BlockStacker:
    """Stacks the same slice of one tensor of n states into a reused ``(n, hi - lo)`` float64 (or float32) buffer.

    States in memory: one tensor operation per block whatever n is (the float32 slices are
    widened as they are copied). States that are :class:`FlatBlockSource` (memory-mapped
    files) copy their slice straight into their row of the buffer, so nothing but the block
    is ever read. float32 -> float64 is exact either way, so the block holds the same numbers (a float32
    buffer holds them as stored).
    """

    def __init__(self, states: Sequence[Mapping[str, torch.Tensor]], names: Sequence[str], b: int,
                 dtype: torch.dtype = torch.float64):
        n = len(states)
        self._names = list(names)
        self._mapped: list[FlatBlockSource | None] = [s if isinstance(s, FlatBlockSource) else None for s in states]
        self._flat = [[s[name].detach().float().reshape(-1) for name in names] if m is None else []
                      for s, m in zip(states, self._mapped, strict=True)]
        self._in_memory = all(m is None for m in self._mapped)
        self._buf = torch.empty(n * b, dtype=dtype)
        self._n = n

    def block(self, k: int, lo: int, hi: int) -> torch.Tensor:
        m = hi - lo
        b64 = self._buf[: self._n * m].view(self._n, m)
        if self._in_memory:
            return torch.stack([f[k][lo:hi] for f in self._flat], out=b64)
        rows = b64.numpy()
        for j, src in enumerate(self._mapped):
            if src is not None:
                src.read_flat(self._names[k], lo, hi, rows[j])
            else:
                b64[j].copy_(self._flat[j][k][lo:hi])
        return b64

    def close(self) -> None:
        """Unmap the files of mapped states that hold a map open between blocks (``close_map``)."""
        for src in self._mapped:
            close = getattr(src, "close_map", None)
            if close is not None:
                close()
