"""The training-backend interface: one way to train, evaluate and run the HAR CNN on any device.

Three implementations share it (DESIGN.md section 5):

* ``"torch"`` (:mod:`edge_client.backends.torch_eager`): PyTorch eager, today's path
  (:mod:`har_models.nn.training`), for boards, desktops and CI;
* ``"numpy"`` (:mod:`edge_client.backends.numpy_ref`): a numpy-only reference of the same
  network, forward, backward and SGD; the oracle for the others and the phone-side path when
  PyTorch is absent;
* ``"executorch"`` (:mod:`edge_client.backends.executorch_rt`): ExecuTorch programs exported by
  :mod:`har_models.nn.export`, run through the runtime's Python bindings.

A backend holds one model of one :class:`~har_models.nn.arch.ArchSpec`; weights go in and out by
parameter name (:data:`~har_models.nn.arch.PARAM_NAMES`) as float32 numpy arrays.

Batch order. :func:`epoch_orders` reproduces, without PyTorch, the permutations that
:func:`har_models.nn.training.train_local` draws (``torch.randperm`` from a generator seeded with
``seed``, one call per epoch), so that every backend sees the same batches for the same seed and
:func:`train` is a drop-in for ``train_local``.

Dropout. In training mode each backend draws its own dropout masks (PyTorch: the global torch RNG
seeded with ``dropout_seed``, as ``train_local`` does; numpy: ``numpy.random.default_rng``;
ExecuTorch: numpy masks passed into the program). These streams differ, so trajectories with
dropout agree only in distribution. For comparisons every backend accepts explicit
``dropout_masks`` (see :func:`draw_dropout_masks`): one ``(B_b, H)`` array per batch, each entry
0 or ``1 / (1 - p)``, multiplied into the hidden activations where dropout would act. With the
same masks (or ``ArchSpec.dropout = 0``) the backends compute the same function.

This module imports no PyTorch.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

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

    Only the ExecuTorch backend reads the program fields; the others ignore them.

    Attributes
    ----------
    program_cache : str or Path, optional
        Folder of the exported ExecuTorch programs (default: the backend's own,
        :data:`edge_client.backends.executorch_rt.DEFAULT_CACHE`).
    train_batch, infer_batch : int
        Batch sizes the ExecuTorch programs are exported for (32 and 64).
    programs : har_models.nn.export.ProgramFiles, optional
        Programs already exported (overrides ``program_cache``).
    inference : {"static", "inputs"}
        How the ExecuTorch inference program receives the weights.

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
    """Outcome of :meth:`TrainingBackend.evaluate`.

    Attributes
    ----------
    confusion : ndarray of shape (C, C), int64
        Rows: true class, columns: predicted class.
    loss : float
        Mean over windows of ``w_y * CE`` (plain CE without class weights), dropout off.
    """

    confusion: np.ndarray
    loss: float


@dataclass(frozen=True)
class TrainSummary:
    """Outcome of :func:`train`: mean loss per epoch (windows-weighted, as ``train_local``), steps, seconds."""

    epoch_losses: tuple[float, ...]
    batch_losses: tuple[float, ...]
    steps: int
    seconds: float


@runtime_checkable
class TrainingBackend(Protocol):
    """What the client needs from a model runtime: weights by name, train, evaluate, predict, ALA gradients.

    Every array crosses this interface as numpy: windows ``x`` of shape ``(N, 6, T)`` float32 in raw
    units (acc m/s^2, gyro rad/s; the model normalises), labels ``y`` of shape ``(N,)`` int64.
    """

    @property
    def spec(self) -> ArchSpec:
        """The architecture this backend runs (its ``version`` is checked on :meth:`set_weights`)."""
        ...

    def set_weights(self, weights: Mapping[str, np.ndarray], arch_version: int | None = None, *, partial: bool = False) -> None:
        """Load parameters by name: exactly the tensors of ``spec.shapes()``, or with ``partial`` any subset of them.

        Raises
        ------
        ArchitectureMismatch
            If ``arch_version`` is given and differs from ``spec.version``.
        har_models.wire.codec.WrongTensors, har_models.wire.codec.NonFinite
            On missing, extra, mis-shaped or non-finite tensors.
        """
        ...

    def get_weights(self) -> dict[str, np.ndarray]:
        """Copies of the current parameters by name, float32, shapes of ``spec.shapes()``."""
        ...

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

        Per batch b: ``L_b = mean_i(w_{y_i} CE_i) + (prox_mu / 2) ||w - prox_ref||^2`` (FedProx, Li et
        al., MLSys 2020, eq. 2; the sum over the trained tensors), then ``w <- w - lr * grad L_b`` for
        every tensor not in ``frozen``.

        Parameters
        ----------
        x : ndarray (N, 6, T) float32;  y : ndarray (N,) int64
        order : ndarray (N,) int64, a permutation of ``range(N)`` (see :func:`epoch_orders`)
        lr : float, learning rate;  batch_size : int >= 1
        class_weights : ndarray (C,) float32, optional (None: plain mean CE)
        prox_mu : float >= 0;  prox_ref : name -> ndarray, required when ``prox_mu > 0``
        frozen : names of tensors not updated
        dropout_seed : int, optional
            Reseeds the backend's dropout stream before the first batch; None continues it.
        dropout_masks : sequence of ndarray (B_b, H), optional
            Explicit dropout multipliers per batch (overrides the backend's stream).

        Returns
        -------
        ndarray of shape (n_batches,), float64: the loss L_b of each batch before its step.

        Raises
        ------
        ValueError
            On bad shapes, a non-permutation ``order``, ``prox_mu > 0`` without ``prox_ref``, unknown
            frozen names, or masks that do not match the batches.
        """
        ...

    def evaluate(self, x: np.ndarray, y: np.ndarray, class_weights: np.ndarray | None = None) -> EvalResult:
        """Confusion matrix and mean loss on ``(x, y)`` with dropout off."""
        ...

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities (softmax of the logits) of shape ``(B, C)`` float32 for ``x`` ``(B, 6, T)``, dropout off."""
        ...

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
        """The loss ``mean_i(w_{y_i} CE_i)`` on one batch and its gradient w.r.t. the named tensors, at the current weights.

        What FedALA needs to update its blend weights W (Zhang et al., AAAI 2023, eq. 6:
        ``W <- clip(W - eta * grad_thetahat L ⊙ (theta - theta_i), 0, 1)``). The weights are not changed.

        Parameters
        ----------
        x : (B, 6, T) float32;  y : (B,) int64;  names : tensor names, e.g. ``("out.weight", "out.bias")``
        dropout : bool
            Whether dropout is active (FedALA's reference learns W in train mode).
        dropout_seed : int, optional, reseeds the dropout stream;  dropout_mask : (B, H), optional explicit mask

        Returns
        -------
        (loss, dict name -> ndarray of that tensor's shape, float32)
        """
        ...



class BackendBase:
    """The preamble the four backends shared, written once: the spec, checked inputs, evaluate and predict.

    A backend sets ``self._spec`` and implements ``logits(x)`` (``(N, C)`` float32, dropout off);
    it inherits :attr:`spec`, :meth:`evaluate` (confusion matrix and mean weighted CE of those
    logits) and :meth:`predict` (their softmax), and checks its inputs with :meth:`_windows` and
    :meth:`_weights_in`, whose errors name the backend class and method (``"NumpyBackend.evaluate"``).
    A backend whose loss or probabilities are computed otherwise overrides :meth:`_mean_loss` or
    :meth:`predict` (the PyTorch backend uses PyTorch's, as ``train_local`` does).
    """

    _spec: ArchSpec

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

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Logits ``(N, C)`` float32 of windows ``(N, 6, T)``, dropout off (each backend's own)."""
        raise NotImplementedError(f"{self._who('logits')}: a backend must implement logits")

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


def check_weights(
    spec: ArchSpec, weights: Mapping[str, np.ndarray], arch_version: int | None, who: str, partial: bool = False
) -> dict[str, np.ndarray]:
    """Validate weights for ``spec`` and return float32 C-contiguous copies.

    With ``partial``, ``weights`` may hold any subset of the tensors (each still checked by name and shape).

    Raises
    ------
    ArchitectureMismatch
        If ``arch_version`` is not None and differs from ``spec.version``.
    har_models.wire.codec.WrongTensors, har_models.wire.codec.NonFinite
        Naming the wrong tensor (see :func:`har_models.wire.codec.check_tensors`).
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

    Raises
    ------
    ValueError
        Naming the argument, its shape and the expected shape.
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
    """Validate the arguments of :meth:`TrainingBackend.train_epoch`; return ``order`` as int64.

    Raises
    ------
    ValueError
        With the argument's name and the expected value.
    """
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
    """``torch.randperm(n, generator=g)`` for a generator ``g = torch.Generator().manual_seed(seed)``, in numpy.

    PyTorch's CPU generator is MT19937 initialised with ``init_genrand(seed mod 2^32)`` (numpy's legacy
    seeding), and its CPU ``randperm`` (``aten/src/ATen/native/TensorFactories.cpp``, the path for
    ``n < 2^32 / 20``) is a forward Fisher-Yates shuffle of ``0..n-1`` that swaps ``r[i]`` with
    ``r[i + u_i mod (n - i)]``, ``u_i`` the next raw 32-bit output. Successive calls continue the stream,
    as successive ``randperm`` calls on one generator do. ``tests/test_backends.py`` checks the equality.

    Parameters
    ----------
    seed : int >= 0

    Raises
    ------
    ValueError
        If ``seed`` is negative.
    """

    def __init__(self, seed: int):
        if seed < 0:
            raise ValueError(f"TorchRandperm: seed must be >= 0, got {seed}")
        self._bitgen = np.random.MT19937()
        self._bitgen._legacy_seeding(int(seed) & 0xFFFFFFFF)

    def __call__(self, n: int) -> np.ndarray:
        """The next permutation of ``range(n)``, int64 of shape (n,).

        Raises
        ------
        ValueError
            If ``n`` is negative or beyond the reproduced path (>= 2^32 / 20).
        """
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
    """The batch orders ``train_local`` uses: one ``torch.randperm(n)`` per epoch from a generator seeded with ``seed``.

    Parameters
    ----------
    n : int >= 0, windows;  epochs : int >= 0;  seed : int >= 0

    Returns
    -------
    list of ``epochs`` int64 arrays of shape (n,) (see :class:`TorchRandperm`).

    Raises
    ------
    ValueError
        If an argument is negative or ``n`` is too large for the reproduced path.
    """
    if n < 0 or epochs < 0 or seed < 0:
        raise ValueError(f"epoch_orders: n, epochs and seed must be >= 0, got {n}, {epochs}, {seed}")
    perm = TorchRandperm(seed)
    return [perm(n) for _ in range(epochs)]


def draw_dropout_masks(rng: np.random.Generator, sizes: Sequence[int], units: int, p: float) -> list[np.ndarray]:
    """Inverted-dropout multipliers: one ``(B_b, units)`` float32 array per batch, entries 0 (prob. ``p``) or ``1/(1-p)``.

    Srivastava et al., JMLR 2014, with the train-time scaling PyTorch's ``F.dropout`` uses.
    ``p = 0`` gives all ones.
    """
    if p <= 0:
        return [np.ones((b, units), np.float32) for b in sizes]
    scale = np.float32(1.0 / (1.0 - p))
    return [((rng.random((b, units)) >= p).astype(np.float32) * scale) for b in sizes]



def batch_dropout_mask(
    spec: ArchSpec, rng: np.random.Generator, b: int, given: np.ndarray | None, train: bool
) -> np.ndarray | None:
    """The dropout mask ``(b, H)`` float32 of one batch: ``given`` if any, else drawn from ``rng`` when training.

    None when not training or the architecture has no dropout (p = 0). Masks are drawn as
    :func:`draw_dropout_masks` draws them (inverted dropout, values 0 or 1 / (1 - p)).
    """
    if given is not None:
        return np.asarray(given, np.float32)
    if not train or spec.dropout <= 0:
        return None
    return draw_dropout_masks(rng, [b], spec.dense_units, spec.dropout)[0]

def train(
    backend: TrainingBackend,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    class_weights: np.ndarray | None = None,
    prox_mu: float = 0.0,
    prox_ref: Mapping[str, np.ndarray] | None = None,
    frozen: Sequence[str] = (),
) -> TrainSummary:
    """``epochs`` passes of SGD through ``backend``, in the batch order and loss bookkeeping of ``train_local``.

    With the ``"torch"`` backend the resulting weights equal those of
    :func:`har_models.nn.training.train_local` with ``TrainConfig(epochs, lr, batch_size, prox_mu, frozen, seed)``
    bit for bit (the dropout stream is seeded once with ``seed``, as there).

    Returns
    -------
    TrainSummary
        Epoch loss = sum over batches of ``L_b * B_b`` / N, summed in batch order (as ``train_local``).
        Nothing is trained when N = 0, epochs = 0 or
        every tensor is frozen.
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
