"""FedDWA: personalised aggregation weighted by the distance to each client's guidance model.

Liu, Wu, Chen, Hu, Zhou, Wu, "FedDWA: Personalized Federated Learning with Dynamic Weight
Adjustment", IJCAI 2023 (arXiv 2305.06124); reference/algorithms.md section 2 (equation numbers
reconstructed there). Each participant j uploads its trained model w_j and a guidance model ŵ_j
(one more local pass). With d_ij^2 = ||ŵ_i - w_j||^2 over all parameters, client i gets

    p_ij = d_ij^{-2} / sum_{k in S_t} d_ik^{-2}, restricted to its K largest     (Eq. 17)
    w̄_i = sum_{j in S_t} p_ij w_j                                                 (Eq. 8)

Matrix convention (the authors' code): ``D[j, i]`` and ``P[j, i]`` hold the source j in the row and
the target i in the column; every column of P sums to 1. :func:`distances` -> :func:`weights` ->
:func:`personalise` are separate so P can be logged and reused (algorithms.md 5.2 step 6B);
:func:`aggregate` chains them. States that are :class:`FlatBlockSource` (memory-mapped spilled
updates) are read one ``(n, b)`` block of the parameter axis at a time, with identical results.
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
"""Memory of one float64 block of stacked parameters in :func:`distances` (per model set); 24 MiB
was faster than 64 MiB (cache reuse; docs/benchmarks-server.md)."""

MIX_BLOCK_BYTES = 24 * 2**20
"""Bytes of the n float64 source rows one block of a sparse :func:`personalise` holds (kept in cache)."""


@runtime_checkable
class FlatBlockSource(Protocol):
    """A model state that hands out slices of its tensors without loading them whole (read block by block)."""

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor ``name``."""
        ...

    def read_flat(self, name: str, lo: int, hi: int, out: np.ndarray) -> None:
        """Copy elements ``[lo, hi)`` of tensor ``name`` (flattened, C order) into ``out`` (shape ``(hi - lo,)``)."""
        ...


@dataclass(frozen=True)
class DwaResult:
    """Output of :func:`aggregate`: D and P ``(n, n)`` float64, the n personalised float32 states, and the
    shadow FedAvg average if ``average_weights`` were given.
    """

    distances: torch.Tensor
    weights: torch.Tensor
    states: list[State]
    average: State | None = None


def finite_clients(*state_lists: Sequence[Mapping[str, torch.Tensor]]) -> list[int]:
    """Indices i (ascending) whose states are finite in every list, e.g. ``finite_clients(trained, guidance)``.

    Raises ValueError if no list is given or the lists differ in length.
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
"""Arithmetic of the Gram product in :func:`distances`: ``"float32"`` (centred blocks, sums in float64) or ``"float64"`` (exact)."""

DEFAULT_GRAM = "float32"
"""The default Gram arithmetic: same top-K sets and p_ij within 1e-7 of float64, about 30 % less CPU
(tests/test_feddwa_gram.py asserts 1e-6; figures in docs/benchmarks-server.md)."""


GRAM_CHUNK = 1024
"""Parameters per float32 partial product and squared norm (summed in float64); 1,024 kept the worst
relative error of a squared distance near 1e-6, against 7e-5 for whole blocks, at one matmul per block."""


def distances(
    guidance_states: Sequence[Mapping[str, torch.Tensor]],
    trained_states: Sequence[Mapping[str, torch.Tensor]],
    *,
    block_size: int | None = None,
    gram: str = DEFAULT_GRAM,
) -> torch.Tensor:
    """Squared distances D[j, i] = ||ŵ_i - w_j||_2^2 between every guidance and trained model, via one Gram matrix.

    D = ||w||^2 1^T + 1 ||ŵ||^2^T - 2 W Ŵ^T, clamped at 0, with W, Ŵ the stacked ``(n, n_params)``
    models, accumulated over blocks of the parameter axis (a few reused ``(n, b)`` buffers).
    ``gram="float64"`` widens every block (exact to ~1e-16 ||w||^2). ``gram="float32"`` subtracts the
    block's mean trained row from W and Ŵ first (D is shift-invariant), so float32 products stay
    accurate; products over :data:`GRAM_CHUNK` parameters are summed in float64.

    Returns a float64 ``(n, n)`` tensor >= 0 (row j trained, column i guidance). ``block_size``
    defaults to about :data:`DEFAULT_BLOCK_BYTES` per block.

    Raises ValueError for empty or unequal lists, differing names or shapes, ``block_size`` < 1, an
    unknown ``gram``, or NaN/inf in a state (naming the clients; see :func:`finite_clients`).
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

    return _from_gram(sq_w, sq_g, inner)


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
    return _from_gram(sq_w, sq_g, gram, bad_rows)


def _from_gram(sq_w: torch.Tensor, sq_g: torch.Tensor, inner: torch.Tensor, bad_rows: torch.Tensor | None = None) -> torch.Tensor:
    """D = ||w||^2 + ||ŵ||^2 - 2 <w, ŵ>, clamped at 0; ValueError naming the non-finite clients."""
    bad = ~torch.isfinite(sq_w) if bad_rows is None else ~torch.isfinite(sq_w) | bad_rows
    bad_w = bad.nonzero().flatten().tolist()
    bad_g = (~torch.isfinite(sq_g)).nonzero().flatten().tolist()
    if bad_w or bad_g or not torch.isfinite(inner).all():
        raise ValueError(
            f"distances: non-finite values in trained models {bad_w} / guidance models {bad_g}; "
            "exclude those clients first (finite_clients)"
        )
    return (sq_w[:, None] + sq_g[None, :] - 2.0 * inner).clamp_(min=0.0)


def weights(D: torch.Tensor | np.ndarray, top_k: int = 5, eps: float = 1e-12) -> torch.Tensor:
    """FedDWA aggregation weights p_ij from squared distances D ``(n, n)``, with top-K per client.

    Liu et al., IJCAI 2023, Eq. (17) (algorithms.md 2.2, as the authors' ``cal_optimal_weight``) and top-K (2.3):

    1. A[j, i] = 1 / (D[j, i] + eps)         (eps keeps D = 0 finite)
    2. A[:, i] /= sum_j A[j, i]
    3. keep the ``top_k`` largest of each column (ties keep the lower j; none zeroed if top_k >= n)
    4. A[:, i] /= sum_j A[j, i]

    A column that is not finite or sums to 0 falls back to p_ii = 1 (the client keeps its own model).
    K = 5 is the authors' default. Returns float64 P[j, i] = p_ij, columns summing to 1.

    Raises ValueError if D is not square or holds NaN or negatives, ``top_k`` < 1, or ``eps`` is negative or not finite.
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
    """Personalised models w̄_i = sum_j P[j, i] w_j (Liu et al., Eq. (8)), float64 sums returned as float32.

    P ``(n, m)`` is column-normalised first; extra columns are further mixes of the same models (the
    shadow average in :func:`aggregate`). A P with at most a quarter non-zero (top-K once n > 4K) is
    applied sparsely, K multiply-adds per parameter instead of n. Returns m states, column order.

    Raises ValueError if P lacks n rows or a column, holds negative or non-finite values or a zero
    column, or the states differ in names or shapes.
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

    ``average_weights`` (n_j, training windows) also mixes the shadow FedAvg average
    sum_j n_j / sum_k n_k w_j (McMahan et al. 2017) in the same pass, returned as ``average``.

    Raises ValueError as the three steps, or if ``average_weights`` are not n finite values >= 0 with a positive sum.
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
    """Stacks the same slice of one tensor of n states into a reused ``(n, hi - lo)`` buffer (exact widening to float64)."""

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
