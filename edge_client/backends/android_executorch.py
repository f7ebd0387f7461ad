"""The ExecuTorch backend on Android: the same programs through ExecuTorch's Java API, called with pyjnius.

UNTESTED ON A PHONE. This adapter has run only on Linux against a stand-in of the Java classes
built on ExecuTorch's Python runtime (``tests/test_backends.py``), which checks the adapter's own
logic (names, shapes, SGD, FedProx, frozen tensors, weights in and out), not the Java bindings.
Everything it calls is marked ``@Experimental`` by ExecuTorch.

Java classes used (``org.pytorch.executorch``; training classes in ``.training`` since 2025):

* ``training.TrainingModule.load(pte)``; ``executeForwardBackward("forward", EValue...)`` returns
  ``[loss, logits, grads..., params...]``; ``namedParameters("forward")`` and
  ``namedGradients("forward")`` give ``Map<String, Tensor>`` keyed by the program's parameter
  names (:func:`har_models.nn.export.param_fqn`);
* ``training.SGD.create(namedParameters, lr, momentum, dampening, weightDecay, nesterov)`` and
  ``step(namedGradients)``: plain SGD (momentum 0) on the module's parameters. FedProx's gradient
  ``mu (w - w_ref)`` is added in numpy and passed as new gradient tensors; frozen tensors get zero
  gradients;
* ``Module.load(pte)`` and ``forward(EValue...)`` for the XNNPACK inference program, with the
  training module's parameter tensors passed as its weight inputs;
* ``Tensor.fromBlob(float[] | long[], long[] shape)``, ``EValue.from(Tensor)``,
  ``Tensor.getDataAsFloatArray()``.

Weights are written into the module's parameter tensors through their direct ``FloatBuffer``
(``Tensor.getRawDataBuffer()``, package-private in Java, reachable through JNI, which pyjnius uses
without access checks). If that fails, the adapter falls back to one SGD step with learning rate 1
and gradient ``w_current - w_new``, which lands on ``w_new`` up to one float32 rounding per entry.
Whether ``namedParameters`` aliases the module's memory (so that SGD trains the module and not a
copy) is what ExecuTorch's Android training demo relies on; it has not been checked here.

Build requirements (buildozer, ``firmware_scripts``):

* ``requirements = python3,kivy,numpy,pyjnius,...`` -- no torch and no executorch Python package
  (neither has a python-for-android recipe); this module imports neither. It does import
  :mod:`har_models.wire.codec` (through :mod:`edge_client.backends.base`), which reads safetensors
  through :mod:`har_models.wire.safetensors_np` where the ``safetensors`` wheel is missing;
* ``android.gradle_dependencies = org.pytorch:executorch-android:<version>`` with a version whose
  AAR contains ``org/pytorch/executorch/training/TrainingModule`` (the training JNI came in July
  2025; check the AAR's ``classes.jar``; otherwise build the AAR from source with
  ``EXECUTORCH_BUILD_EXTENSION_TRAINING=ON``), and the XNNPACK backend for the inference program;
* ``android.archs = arm64-v8a`` (the prebuilt AAR's main ABI);
* the two ``.pte`` files and their ``.json`` for the current architecture version, exported on a
  host by :func:`har_models.nn.export.ensure_programs` (the coordinator publishes them when the
  version changes) and stored on the device; their batch limits bound ``batch_size``.

Costs to expect: pyjnius converts Python lists to Java arrays element by element, so loading the
paper CNN's 6.4 M weights takes seconds (once per round); a batch's inputs are small.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from har_models.nn.arch import PARAM_NAMES, ArchSpec
from har_models.wire.pte_delivery import ANDROID_RUNTIME, RuntimeInfo, check_program_set, find_programs

from .base import ArchitectureMismatch, BackendBase, batch_dropout_mask, check_train_args

METHOD = "forward"


class AndroidExecuTorchBackend(BackendBase):
    """:class:`~edge_client.backends.base.TrainingBackend` over ExecuTorch's Java training API (pyjnius).

    Parameters
    ----------
    spec : ArchSpec
    train_pte, infer_pte, meta_json : path
        The programs and metadata of :func:`har_models.nn.export.ensure_programs` for ``spec``.
    weights : name -> ndarray, optional
        Parameters to load (default: those stored in the program).
    autoclass : callable, optional
        ``jnius.autoclass`` (imported lazily when None); tests pass a stand-in.
    runtime : RuntimeInfo
        The AAR's runtime (:data:`~har_models.wire.pte_delivery.ANDROID_RUNTIME`); the programs are checked
        against it before the Java runtime loads them.

    Raises
    ------
    ArchitectureMismatch
        If ``meta_json`` records another architecture than ``spec``.
    ProgramRefused
        ``pte_corrupt`` or ``pte_incompatible`` (:func:`har_models.wire.pte_delivery.check_program_set`).
    ImportError
        If pyjnius is not available (not on Android, or not in the build's requirements).
    """

    def __init__(
        self,
        spec: ArchSpec,
        train_pte: str | Path,
        infer_pte: str | Path,
        meta_json: str | Path,
        weights: Mapping[str, np.ndarray] | None = None,
        autoclass: Callable[[str], Any] | None = None,
        runtime: RuntimeInfo = ANDROID_RUNTIME,
    ):
        if autoclass is None:
            from jnius import autoclass as jnius_autoclass  # only on the device

            autoclass = jnius_autoclass
        meta = json.loads(Path(meta_json).read_text())
        recorded = ArchSpec.from_json(meta["spec"])
        if recorded != spec:
            raise ArchitectureMismatch(
                f"AndroidExecuTorchBackend: {meta_json} holds programs for architecture version {recorded.version}, "
                f"not version {spec.version}; fetch the programs of this version"
            )
        paths = {"train": Path(train_pte), "infer": Path(infer_pte)}
        check_program_set(paths, meta, runtime, ("train", "infer"))  # before the Java runtime sees them (no native crash)
        self._spec = spec
        self.train_batch = int(meta["train_batch"])
        self.infer_batch = int(meta["infer_batch"])
        self._fqn: dict[str, str] = {n: str(meta["params"][n]) for n in PARAM_NAMES}
        self._TrainingModule = autoclass("org.pytorch.executorch.training.TrainingModule")
        self._SGD = autoclass("org.pytorch.executorch.training.SGD")
        self._Module = autoclass("org.pytorch.executorch.Module")
        self._Tensor = autoclass("org.pytorch.executorch.Tensor")
        self._EValue = autoclass("org.pytorch.executorch.EValue")
        self._HashMap = autoclass("java.util.HashMap")
        self._train = self._TrainingModule.load(str(train_pte))
        self._infer = self._Module.load(str(infer_pte))
        self._rng = np.random.default_rng(0)
        # One call so that the module hands out its parameter tensors.
        self._step_inputs(np.zeros((1, spec.n_channels, spec.window), np.float32), np.zeros(1, np.int64), None, None)
        self._params = self._train.namedParameters(METHOD)
        if weights is not None:
            self.set_weights(weights)

    @classmethod
    def from_cache(
        cls,
        spec: ArchSpec,
        weights: Mapping[str, np.ndarray] | None = None,
        cache_dir: str | Path | None = None,
        autoclass: Callable[[str], Any] | None = None,
    ) -> AndroidExecuTorchBackend:
        """The backend on the stored programs of exactly ``spec`` in ``cache_dir`` (what ``make_backend("executorch-android")`` builds).

        Raises
        ------
        ValueError
            If ``cache_dir`` is not given.
        FileNotFoundError
            If no complete program set for ``spec`` is stored there (names the version and the folder).
        ImportError
            If pyjnius is not available and no ``autoclass`` is given.
        """
        if cache_dir is None:
            raise ValueError("AndroidExecuTorchBackend.from_cache: give cache_dir, the folder of the delivered programs")
        paths = find_programs(cache_dir, spec)
        if paths is None:
            raise FileNotFoundError(
                f"AndroidExecuTorchBackend: no programs for architecture version {spec.version} ({spec.conv_filters} filters, "
                f"{spec.dense_units} units) in {cache_dir}; the client asks the coordinator for them before a round"
            )
        return cls(spec, paths["train"], paths["infer"], paths["meta"], weights=weights, autoclass=autoclass)

    # -- Java conversions --------------------------------------------------------------------------

    def _tensor(self, a: np.ndarray) -> Any:
        shape = [int(s) for s in a.shape]
        flat = a.ravel().tolist()
        return self._Tensor.fromBlob(flat, shape)

    def _evalue(self, a: np.ndarray) -> Any:
        return getattr(self._EValue, "from")(self._tensor(a))

    def _array(self, t: Any, name: str) -> np.ndarray:
        return np.asarray(t.getDataAsFloatArray(), dtype=np.float32).reshape(self._spec.shapes()[name])

    def _step_inputs(self, x: np.ndarray, y: np.ndarray, class_weights: np.ndarray | None, mask: np.ndarray | None) -> float:
        """Run forward + backward on one batch; returns the loss (gradients stay in the module)."""
        b = len(y)
        if b > self.train_batch:
            raise ValueError(f"AndroidExecuTorchBackend: batch of {b} exceeds the training program's limit {self.train_batch}")
        sw = np.ones(b, np.float32) if class_weights is None else np.asarray(class_weights, np.float32)[y]
        m = np.ones((b, self._spec.dense_units), np.float32) if mask is None else np.asarray(mask, np.float32)
        outs = self._train.executeForwardBackward(
            METHOD, self._evalue(x), self._evalue(y.astype(np.int64)), self._evalue(sw), self._evalue(m)
        )
        return float(outs[0].toTensor().getDataAsFloatArray()[0])

    # -- weights -----------------------------------------------------------------------------------

    def set_weights(self, weights: Mapping[str, np.ndarray], arch_version: int | None = None, *, partial: bool = False) -> None:
        """Write parameters by name into the module's own tensors; see :meth:`TrainingBackend.set_weights`."""
        arrays = self._weights_in(weights, arch_version, partial)
        try:
            for n, a in arrays.items():
                buf = self._params.get(self._fqn[n]).getRawDataBuffer()
                buf.rewind()
                buf.put(a.ravel().tolist())
                buf.rewind()
        except Exception:  # no raw buffer access: one SGD step of lr 1 towards the new values
            current = self.get_weights()
            sgd = self._SGD.create(self._params, 1.0, 0.0, 0.0, 0.0, False)
            grads = self._HashMap()
            for n in PARAM_NAMES:  # zero steps for tensors not being loaded
                grads.put(self._fqn[n], self._tensor(current[n] - arrays[n] if n in arrays else np.zeros_like(current[n])))
            sgd.step(grads)

    def get_weights(self) -> dict[str, np.ndarray]:
        """Copies of the module's parameters by name (float32)."""
        return {n: self._array(self._params.get(self._fqn[n]), n) for n in PARAM_NAMES}

    # -- training ----------------------------------------------------------------------------------

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
        """One epoch of SGD with ExecuTorch's Java ``SGD``; see :meth:`TrainingBackend.train_epoch`."""
        xa, ya = self._windows(x, y, "train_epoch")
        assert ya is not None
        o = check_train_args(self._spec, len(xa), order, batch_size, prox_mu, prox_ref, frozen, dropout_masks, self._who())
        if batch_size > self.train_batch:
            raise ValueError(f"AndroidExecuTorchBackend.train_epoch: batch_size {batch_size} exceeds the program's {self.train_batch}")
        ref = {n: np.asarray(prox_ref[n], np.float32) for n in PARAM_NAMES} if prox_mu > 0 and prox_ref is not None else {}
        plain = not ref and not frozen  # the module's own gradient map goes to SGD unchanged
        if dropout_seed is not None:
            self._rng = np.random.default_rng(int(dropout_seed))
        sgd = self._SGD.create(self._params, float(lr), 0.0, 0.0, 0.0, False)
        losses = []
        for i, s in enumerate(range(0, len(xa), batch_size)):
            idx = o[s : s + batch_size]
            mask = batch_dropout_mask(
                self._spec, self._rng, len(idx), dropout_masks[i] if dropout_masks is not None else None, train=True
            )
            loss = self._step_inputs(xa[idx], ya[idx], class_weights, mask)
            jgrads = self._train.namedGradients(METHOD)
            if plain:
                sgd.step(jgrads)
            else:
                w = self.get_weights()
                grads = self._HashMap()
                for n in PARAM_NAMES:
                    g = self._array(jgrads.get(self._fqn[n]), n)
                    if n in frozen:
                        g = np.zeros_like(g)
                    elif ref:
                        g = g + np.float32(prox_mu) * (w[n] - ref[n])
                    grads.put(self._fqn[n], self._tensor(g))
                sgd.step(grads)
                if ref:
                    trained = [n for n in PARAM_NAMES if n not in frozen]
                    prox = sum(float(np.sum((w[n] - ref[n]) ** 2, dtype=np.float32)) for n in trained)
                    loss = float(np.float32(loss) + np.float32(0.5 * prox_mu) * np.float32(prox))
            losses.append(loss)
        return np.asarray(losses, dtype=np.float64)

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
        """The batch loss and its gradient w.r.t. ``names``; see :meth:`TrainingBackend.top_layer_grads`."""
        xa, ya = self._windows(x, y, "top_layer_grads")
        assert ya is not None
        unknown = set(names) - set(PARAM_NAMES)
        if unknown:
            raise ValueError(f"AndroidExecuTorchBackend.top_layer_grads: {sorted(unknown)} are not parameters")
        if dropout_seed is not None:
            self._rng = np.random.default_rng(int(dropout_seed))
        loss = self._step_inputs(xa, ya, class_weights, batch_dropout_mask(self._spec, self._rng, len(xa), dropout_mask, train=dropout))
        jgrads = self._train.namedGradients(METHOD)
        return loss, {n: self._array(jgrads.get(self._fqn[n]), n) for n in names}

    # -- inference ---------------------------------------------------------------------------------

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Logits ``(N, C)`` from the inference program, in chunks of ``infer_batch`` windows."""
        xa, _ = self._windows(x, None)
        weights = [getattr(self._EValue, "from")(self._params.get(self._fqn[n])) for n in PARAM_NAMES]
        out = []
        for s in range(0, len(xa), self.infer_batch):
            chunk = xa[s : s + self.infer_batch]
            res = self._infer.forward(self._evalue(chunk), *weights)
            out.append(np.asarray(res[0].toTensor().getDataAsFloatArray(), np.float32).reshape(len(chunk), self._spec.n_classes))
        return np.concatenate(out) if out else np.empty((0, self._spec.n_classes), np.float32)
