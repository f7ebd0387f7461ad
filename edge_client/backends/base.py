"""The training-backend interface: one way to train, evaluate and run the HAR CNN on any device.

``"torch"`` (:mod:`.torch_eager`), ``"numpy"`` (:mod:`.numpy_ref`, the torch-free reference) and
``"executorch"`` (:mod:`.executorch_rt`) implement it; weights go in and out by parameter name as
float32 arrays. :func:`epoch_orders` reproduces ``train_local``'s batch order without PyTorch, so
:func:`train` is a drop-in for it. Each backend draws its own dropout masks (the streams differ);
explicit ``dropout_masks`` make the backends compute the same function. Details: docs/backends.md.
This module imports no PyTorch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from har_models.nn.arch import ArchSpec
from har_models.nn.metrics import confusion_matrix
from har_models.wire import codec

from .numpy_loss import softmax, weighted_cross_entropy

BACKEND_NAMES = ("torch", "executorch", "executorch-android", "numpy")
"""The backends, in order of preference (the one list: ``fedhar-client --backend``, the app, :func:`make_backend`)."""


@dataclass(frozen=True)
class BackendOptions:
    """Settings of a backend's construction (:func:`edge_client.backends.factory.make_backend`).

    Only the ExecuTorch backend reads them: ``program_cache`` (default
    :data:`edge_client.backends.executorch_rt.DEFAULT_CACHE`), the programs' batch sizes, ``programs``
    already exported (override the cache), and how inference receives the weights.

    Raises
    ------
    ValueError
        If a batch size is not a positive integer or ``inference`` is unknown.
    """

    program_cache: str | Path | None = None
    train_batch: int = 32
    infer_batch: int = 64
    programs: Any = None
    inference: Literal["static", "inputs"] = "static"

    def __post_init__(self) -> None:
        for name in ("train_batch", "infer_batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"BackendOptions: {name} must be an integer >= 1, got {v!r}")
        if self.inference not in ("static", "inputs"):
            raise ValueError(f"BackendOptions: inference must be 'static' or 'inputs', got {self.inference!r}")


class ArchitectureMismatch(ValueError):
    """Weights (or a program) of another architecture version than the backend's."""


@dataclass(frozen=True)
class EvalResult:
    """Outcome of :meth:`TrainingBackend.evaluate`: ``confusion`` ``(C, C)`` int64 (rows true, columns predicted)
    and ``loss``, the mean of ``w_y * CE`` over windows with dropout off."""

    confusion: np.ndarray
    loss: float


@dataclass(frozen=True)
class TrainSummary:
    """Outcome of :func:`train`: mean loss per epoch (windows-weighted, as ``train_local``), steps, seconds."""

    epoch_losses: tuple[float, ...]
    batch_losses: tuple[float, ...]
    steps: int
    seconds: float


class BackendBase:
    """What the client needs from a model runtime: weights by name, train, evaluate, predict, ALA gradients.

    Windows ``x`` are ``(N, 6, T)`` float32 in raw units (m/s^2, rad/s), labels ``y`` ``(N,)`` int64. A
    backend sets ``self._spec`` and implements the weights, ``logits(x)``, ``_epoch`` and ``_grads``;
    errors of the input checks name the class and method (``"NumpyBackend.evaluate"``).
    """

    _spec: ArchSpec
    _rng: np.random.Generator

    @property
    def spec(self) -> ArchSpec:
        """The architecture this backend runs."""
        return self._spec

    def _who(self, method: str | None = None) -> str:
        name = type(self).__name__
        return name if method is None else f"{name}.{method}"

    def _windows(self, x: np.ndarray, y: np.ndarray | None, method: str | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """:func:`check_windows` against this backend's spec, errors naming ``Class.method``."""
        return check_windows(self._spec, x, y, self._who(method))

    def _weights_in(self, weights: Mapping[str, np.ndarray], arch_version: int | None, partial: bool) -> dict[str, np.ndarray]:
        """:func:`check_weights` for ``set_weights``, errors naming ``Class.set_weights``."""
        return check_weights(self._spec, weights, arch_version, self._who("set_weights"), partial)

    def set_weights(self, weights: Mapping[str, np.ndarray], arch_version: int | None = None, *, partial: bool = False) -> None:
        """Load parameters by name: exactly the tensors of ``spec.shapes()``, or with ``partial`` any subset.

        Raises ArchitectureMismatch if ``arch_version`` differs from ``spec.version``, and
        ``codec.WrongTensors`` / ``codec.NonFinite`` on missing, extra, mis-shaped or non-finite tensors.
        """
        raise NotImplementedError(f"{self._who('set_weights')}: a backend must implement set_weights")

    def get_weights(self) -> dict[str, np.ndarray]:
        """Copies of the current parameters by name, float32, shapes of ``spec.shapes()``."""
        raise NotImplementedError(f"{self._who('get_weights')}: a backend must implement get_weights")

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Logits ``(N, C)`` float32 of windows ``(N, 6, T)``, dropout off (each backend's own)."""
        raise NotImplementedError(f"{self._who('logits')}: a backend must implement logits")

    def _reseed(self, seed: int | None) -> None:
        """Restart the numpy dropout stream from ``seed``; None continues it."""
        if seed is not None:
            self._rng = np.random.default_rng(int(seed))

    def train_epoch(
        self,
        x: np.ndarray,
        y: np.ndarray,
        order: np.ndarray,
        *,
        lr: float,
        batch_size: int,
        class_weights: np.ndarray | None = None,
        prox_mu: float = 0.0,
        prox_ref: Mapping[str, np.ndarray] | None = None,
        frozen: Sequence[str] = (),
        dropout_seed: int | None = None,
        dropout_masks: Sequence[np.ndarray] | None = None,
    ) -> np.ndarray:
        """One pass of plain SGD over ``x[order]`` in batches of ``batch_size`` (the last one partial).

        Per batch: ``L_b = mean_i(w_{y_i} CE_i) + (prox_mu / 2) ||w - prox_ref||^2`` (FedProx, Li et al.,
        MLSys 2020, eq. 2), then ``w <- w - lr * grad L_b`` for every tensor not in ``frozen``.
        ``order`` is a permutation of ``range(N)`` (:func:`epoch_orders`); ``dropout_seed`` reseeds the
        dropout stream (None continues it); ``dropout_masks`` holds one ``(B_b, H)`` multiplier per batch.
        Returns each batch's loss before its step, float64 ``(n_batches,)``.

        Raises
        ------
        ValueError
            On bad shapes, a non-permutation ``order``, ``prox_mu > 0`` without ``prox_ref``, unknown
            frozen names, or masks that do not match the batches.
        """
        xa, ya = self._windows(x, y, "train_epoch")
        assert ya is not None
        o = check_train_args(self._spec, len(xa), order, batch_size, prox_mu, prox_ref, frozen, dropout_masks, self._who())
        args = EpochArgs(lr, batch_size, class_weights, prox_mu, prox_ref, frozen, dropout_seed, dropout_masks)
        return np.asarray(self._epoch(xa, ya, o, args), dtype=np.float64)

    def _epoch(self, x: np.ndarray, y: np.ndarray, order: np.ndarray, a: EpochArgs) -> list[float]:
        """The losses of one epoch over checked windows ``x[order]`` (each backend's own)."""
        raise NotImplementedError(f"{self._who('train_epoch')}: a backend must implement _epoch")

    def _batches(self, order: np.ndarray, a: EpochArgs) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """Each batch's window indices and dropout mask (given, else drawn from ``self._rng``), in order."""
        for i, s in enumerate(range(0, len(order), a.batch_size)):
            idx = order[s : s + a.batch_size]
            yield idx, batch_dropout_mask(self._spec, self._rng, len(idx), a.mask(i), train=True)

    def top_layer_grads(
        self,
        x: np.ndarray,
        y: np.ndarray,
        names: Sequence[str],
        *,
        class_weights: np.ndarray | None = None,
        dropout: bool = False,
        dropout_seed: int | None = None,
        dropout_mask: np.ndarray | None = None,
    ) -> tuple[float, dict[str, np.ndarray]]:
        """The loss ``mean_i(w_{y_i} CE_i)`` on one batch and its gradient w.r.t. ``names``, weights unchanged.

        What FedALA needs to learn W (Zhang et al., AAAI 2023, eq. 6). ``dropout``: train mode, as
        FedALA's reference learns W. Returns ``(loss, name -> float32 gradient)``.
        """
        xa, ya = self._windows(x, y, "top_layer_grads")
        assert ya is not None
        return self._grads(xa, ya, names, class_weights, dropout, dropout_seed, dropout_mask)

    def _grads(
        self, x: np.ndarray, y: np.ndarray, names: Sequence[str], class_weights: np.ndarray | None,
        dropout: bool, dropout_seed: int | None, dropout_mask: np.ndarray | None,
    ) -> tuple[float, dict[str, np.ndarray]]:  # fmt: skip
        """:meth:`top_layer_grads` on checked windows (each backend's own)."""
        raise NotImplementedError(f"{self._who('top_layer_grads')}: a backend must implement _grads")

    def _grads_mask(self, names: Sequence[str], known: Sequence[str], n: int, dropout: bool, dropout_seed: int | None,
                    dropout_mask: np.ndarray | None, say_known: bool = True) -> np.ndarray | None:  # fmt: skip
        """For :meth:`_grads` on the numpy dropout stream: check ``names`` against ``known``, reseed, the batch's mask."""
        unknown = set(names) - set(known)
        if unknown:
            known_words = f"; known {list(known)}" if say_known else ""
            raise ValueError(f"{self._who('top_layer_grads')}: {sorted(unknown)} are not parameters{known_words}")
        self._reseed(dropout_seed)
        return batch_dropout_mask(self._spec, self._rng, n, dropout_mask, train=dropout)

    def _mean_loss(self, z: np.ndarray, y: np.ndarray, class_weights: np.ndarray | None) -> float:
        """``mean_b(w_{y_b} * CE_b)`` of logits ``z`` ``(N, C)`` and labels ``y`` ``(N,)``, N >= 1."""
        return weighted_cross_entropy(z, y, class_weights)[0]

    def evaluate(self, x: np.ndarray, y: np.ndarray, class_weights: np.ndarray | None = None) -> EvalResult:
        """Confusion matrix ``(C, C)`` and mean (weighted) CE with dropout off (NaN without windows)."""
        xa, ya = self._windows(x, y, "evaluate")
        assert ya is not None
        z = self.logits(xa)
        loss = self._mean_loss(z, ya, class_weights) if len(ya) else float("nan")
        return EvalResult(confusion_matrix(ya, z.argmax(axis=1).astype(np.int64), self._spec.n_classes), loss)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities ``(B, C)`` float32, dropout off."""
        return softmax(self.logits(x))


TrainingBackend = BackendBase
"""The interface every backend implements (the name the client and the docs use)."""


@dataclass(frozen=True)
class EpochArgs:
    """The settings of one :meth:`TrainingBackend.train_epoch` call, as given (checked by :func:`check_train_args`)."""

    lr: float
    batch_size: int
    class_weights: np.ndarray | None
    prox_mu: float
    prox_ref: Mapping[str, np.ndarray] | None
    frozen: Sequence[str]
    dropout_seed: int | None
    dropout_masks: Sequence[np.ndarray] | None

    def mask(self, i: int) -> np.ndarray | None:
        """The given dropout mask of batch ``i``, if any."""
        return self.dropout_masks[i] if self.dropout_masks is not None else None

    def refs(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """FedProx's reference tensors of ``names`` as float32, or {} without the proximal term."""
        return {n: np.asarray(self.prox_ref[n], np.float32) for n in names} if self.prox_mu > 0 and self.prox_ref is not None else {}

    def prox_loss(self, loss: float, prox: float) -> float:
        """``loss + (prox_mu / 2) * prox`` in float32 arithmetic, ``prox`` the squared distance to ``prox_ref``."""
        return float(np.float32(loss) + np.float32(0.5 * self.prox_mu) * np.float32(prox))


def check_weights(
    spec: ArchSpec, weights: Mapping[str, np.ndarray], arch_version: int | None, who: str, partial: bool = False
) -> dict[str, np.ndarray]:
    """Validate weights for ``spec`` (with ``partial`` any subset of the tensors); return float32 C-contiguous copies.

    Raises ArchitectureMismatch if ``arch_version`` is not None and differs from ``spec.version``, and
    ``codec.WrongTensors`` / ``codec.NonFinite`` naming the wrong tensor.
    """
    if arch_version is not None and int(arch_version) != spec.version:
        raise ArchitectureMismatch(
            f"{who}: weights are for architecture version {arch_version}, this backend runs version {spec.version}; "
            "build a backend (or export a program) for the new architecture first"
        )
    arrays = {n: np.asarray(v) for n, v in weights.items()}
    shapes = spec.shapes()
    if partial:
        unknown = sorted(set(arrays) - set(shapes))
        if unknown:
            raise codec.WrongTensors(f"{who}: {unknown} are not tensors of the architecture; known {list(shapes)}")
        shapes = {n: shapes[n] for n in arrays}
    codec.check_tensors(shapes, arrays)
    return {n: np.array(v, dtype=np.float32, order="C", copy=True) for n, v in arrays.items()}


def check_windows(spec: ArchSpec, x: np.ndarray, y: np.ndarray | None, who: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Validate windows ``(N, n_channels, window)`` and labels ``(N,)`` in ``[0, C)``; return float32 / int64 arrays.

    Raises ValueError naming the argument, its shape and the expected shape.
    """
    xa = np.asarray(x)
    want = (spec.n_channels, spec.window)
    if xa.ndim != 3 or xa.shape[1:] != want:
        raise ValueError(f"{who}: x has shape {xa.shape}, expected (N, {want[0]}, {want[1]}) raw windows")
    xa = np.ascontiguousarray(xa, dtype=np.float32)
    if y is None:
        return xa, None
    ya = np.asarray(y)
    if ya.shape != (xa.shape[0],):
        raise ValueError(f"{who}: y has shape {ya.shape}, expected ({xa.shape[0]},) class indices")
    ya = ya.astype(np.int64)
    if ya.size and (ya.min() < 0 or ya.max() >= spec.n_classes):
        raise ValueError(f"{who}: labels must be in [0, {spec.n_classes}), got {int(ya.min())}..{int(ya.max())}")
    return xa, ya


def check_train_args(
    spec: ArchSpec,
    n: int,
    order: np.ndarray,
    batch_size: int,
    prox_mu: float,
    prox_ref: Mapping[str, np.ndarray] | None,
    frozen: Sequence[str],
    dropout_masks: Sequence[np.ndarray] | None,
    who: str,
) -> np.ndarray:
    """Validate the arguments of :meth:`TrainingBackend.train_epoch`; return ``order`` as int64 (ValueError otherwise)."""
    o = np.asarray(order, dtype=np.int64)
    if o.shape != (n,) or not np.array_equal(np.sort(o), np.arange(n)):
        raise ValueError(f"{who}: order must be a permutation of range({n}); see epoch_orders()")
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"{who}: batch_size must be an integer >= 1, got {batch_size}")
    if prox_mu < 0 or not np.isfinite(prox_mu):
        raise ValueError(f"{who}: prox_mu must be finite and >= 0, got {prox_mu}")
    if prox_mu > 0 and prox_ref is None:
        raise ValueError(f"{who}: prox_mu > 0 needs prox_ref (the model received this round)")
    unknown = set(frozen) - set(spec.shapes())
    if unknown:
        raise ValueError(f"{who}: frozen names {sorted(unknown)} are not parameters of the model")
    if dropout_masks is not None:
        sizes = batch_sizes(n, batch_size)
        if len(dropout_masks) != len(sizes) or any(
            np.shape(m) != (b, spec.dense_units) for m, b in zip(dropout_masks, sizes, strict=False)
        ):
            raise ValueError(
                f"{who}: dropout_masks must hold one (B_b, {spec.dense_units}) array per batch for batch sizes {sizes}"
            )
    return o


def batch_sizes(n: int, batch_size: int) -> list[int]:
    """Sizes of the batches of one epoch over ``n`` windows: full batches, then the partial rest."""
    return [min(batch_size, n - s) for s in range(0, n, batch_size)]


class TorchRandperm:
    """``torch.randperm(n, generator=torch.Generator().manual_seed(seed))`` in numpy; successive calls continue the stream.

    PyTorch's CPU generator is MT19937 with ``init_genrand(seed mod 2^32)`` (numpy's legacy seeding);
    its CPU ``randperm`` (``aten/src/ATen/native/TensorFactories.cpp``, ``n < 2^32 / 20``) is a forward
    Fisher-Yates shuffle swapping ``r[i]`` with ``r[i + u_i mod (n - i)]``, ``u_i`` the next raw 32-bit
    output. Raises ValueError for a negative ``seed``.
    """

    def __init__(self, seed: int):
        if seed < 0:
            raise ValueError(f"TorchRandperm: seed must be >= 0, got {seed}")
        self._bitgen = np.random.MT19937()
        self._bitgen._legacy_seeding(int(seed) & 0xFFFFFFFF)

    def __call__(self, n: int) -> np.ndarray:
        """The next permutation of ``range(n)``, int64 ``(n,)``; ValueError if ``n`` < 0 or >= 2^32 / 20."""
        if not 0 <= n < (2**32 - 1) // 20:
            raise ValueError(f"TorchRandperm: n = {n} is outside the reproduced randperm path [0, {(2**32 - 1) // 20})")
        if n < 2:
            return np.arange(n, dtype=np.int64)
        z = (self._bitgen.random_raw(n - 1).astype(np.int64) % np.arange(n, 1, -1, dtype=np.int64)).tolist()
        r = list(range(n))
        for i, zi in enumerate(z):
            j = i + zi
            r[i], r[j] = r[j], r[i]
        return np.asarray(r, dtype=np.int64)


def epoch_orders(n: int, epochs: int, seed: int) -> list[np.ndarray]:
    """The batch orders ``train_local`` uses: ``epochs`` int64 ``(n,)`` permutations (:class:`TorchRandperm` of ``seed``).

    Raises ValueError if an argument is negative or ``n`` is too large for the reproduced path.
    """
    if n < 0 or epochs < 0 or seed < 0:
        raise ValueError(f"epoch_orders: n, epochs and seed must be >= 0, got {n}, {epochs}, {seed}")
    perm = TorchRandperm(seed)
    return [perm(n) for _ in range(epochs)]


def draw_dropout_masks(rng: np.random.Generator, sizes: Sequence[int], units: int, p: float) -> list[np.ndarray]:
    """Inverted-dropout multipliers (Srivastava et al., JMLR 2014, scaled as ``F.dropout``): one ``(B_b, units)``
    float32 array per batch, entries 0 (probability ``p``) or ``1/(1-p)``; all ones for ``p = 0``."""
    if p <= 0:
        return [np.ones((b, units), np.float32) for b in sizes]
    scale = np.float32(1.0 / (1.0 - p))
    return [((rng.random((b, units)) >= p).astype(np.float32) * scale) for b in sizes]


def batch_dropout_mask(
    spec: ArchSpec, rng: np.random.Generator, b: int, given: np.ndarray | None, train: bool
) -> np.ndarray | None:
    """The dropout mask ``(b, H)`` float32 of one batch: ``given`` if any, else drawn as :func:`draw_dropout_masks`
    when training with p > 0; otherwise None."""
    if given is not None:
        return np.asarray(given, np.float32)
    if not train or spec.dropout <= 0:
        return None
    return draw_dropout_masks(rng, [b], spec.dense_units, spec.dropout)[0]


def train(backend: TrainingBackend, x: np.ndarray, y: np.ndarray, *, epochs: int, lr: float, batch_size: int, seed: int,
          class_weights: np.ndarray | None = None, prox_mu: float = 0.0, prox_ref: Mapping[str, np.ndarray] | None = None,
          frozen: Sequence[str] = ()) -> TrainSummary:  # fmt: skip
    """``epochs`` passes of SGD through ``backend`` in ``train_local``'s batch order and loss bookkeeping.

    With the ``"torch"`` backend the weights equal ``train_local``'s with the same ``TrainConfig``, bit for bit.
    Epoch loss: sum of ``L_b * B_b`` / N in batch order; nothing is trained for N = 0, epochs = 0 or all frozen.
    """
    t0 = time.perf_counter()
    n = int(np.shape(x)[0])
    losses: list[float] = []
    batch_losses: list[float] = []
    steps = 0
    if n > 0 and set(backend.spec.shapes()) - set(frozen):
        sizes = batch_sizes(n, batch_size)
        for e, order in enumerate(epoch_orders(n, epochs, seed)):
            bl = backend.train_epoch(
                x, y, order, lr=lr, batch_size=batch_size, class_weights=class_weights, prox_mu=prox_mu,
                prox_ref=prox_ref, frozen=frozen, dropout_seed=seed if e == 0 else None,
            )
            total = 0.0
            for loss, b in zip(bl.tolist(), sizes, strict=True):  # in batch order, as train_local sums
                total += loss * b
            losses.append(total / n)
            batch_losses.extend(float(v) for v in bl)
            steps += len(bl)
    return TrainSummary(tuple(losses), tuple(batch_losses), steps, time.perf_counter() - t0)
