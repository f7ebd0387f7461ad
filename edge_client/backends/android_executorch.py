"""The ExecuTorch backend on Android: the same programs through ExecuTorch's Java API, called with pyjnius.

UNTESTED ON A PHONE: it has run only against a stand-in of the Java classes built on ExecuTorch's
Python runtime (``tests/test_backends.py``), which checks the adapter's logic, not the Java bindings.
It uses the ``@Experimental`` ``org.pytorch.executorch`` classes ``training.TrainingModule``
(``executeForwardBackward``, ``namedParameters``, ``namedGradients``), ``training.SGD`` (momentum 0;
FedProx's gradient is added in numpy, frozen tensors get zero gradients), ``Module`` for the XNNPACK
inference program, ``Tensor`` and ``EValue``. Weights are written through the parameters' direct
``FloatBuffer`` (``getRawDataBuffer``, package-private, reachable through JNI), else by one SGD step
of learning rate 1 towards them (whether ``namedParameters`` aliases the module's memory is unchecked).

Build (buildozer): no torch or executorch Python package (this module imports neither; safetensors
falls back to :mod:`har_models.wire.safetensors_np`); ``org.pytorch:executorch-android`` whose AAR
has ``training/TrainingModule`` (else build it with ``EXECUTORCH_BUILD_EXTENSION_TRAINING=ON``) and
XNNPACK; ``android.archs = arm64-v8a``; the programs of the current architecture, delivered by the
coordinator. pyjnius converts lists element by element: loading the paper CNN's 6.4 M weights takes seconds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from har_models.nn.arch import PARAM_NAMES, ArchSpec
from har_models.wire.pte_delivery import ANDROID_RUNTIME, RuntimeInfo, check_program_set, find_programs

from .base import ArchitectureMismatch, BackendBase, EpochArgs

METHOD = "forward"


class AndroidExecuTorchBackend(BackendBase):
    """:class:`~edge_client.backends.base.TrainingBackend` over ExecuTorch's Java training API (pyjnius).

    ``train_pte``, ``infer_pte``, ``meta_json``: the programs of :func:`har_models.nn.export.ensure_programs`
    for ``spec``; ``weights`` default to those stored in the program; ``autoclass`` is ``jnius.autoclass``
    unless a test passes a stand-in; the programs are checked against ``runtime`` before loading.

    Raises
    ------
    ArchitectureMismatch
        If ``meta_json`` records another architecture than ``spec``.
    ProgramRefused
        ``pte_corrupt`` or ``pte_incompatible``.
    ImportError
        If pyjnius is not available.
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
        """The backend on the stored programs of ``spec`` in ``cache_dir`` (``make_backend("executorch-android")``).

        Raises ValueError without ``cache_dir``, FileNotFoundError if no complete program set for ``spec``
        is stored there, ImportError without pyjnius or ``autoclass``.
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

    def _epoch(self, xa: np.ndarray, ya: np.ndarray, o: np.ndarray, a: EpochArgs) -> list[float]:
        """One epoch with ExecuTorch's Java ``SGD``."""
        if a.batch_size > self.train_batch:
            raise ValueError(f"AndroidExecuTorchBackend.train_epoch: batch_size {a.batch_size} exceeds the program's {self.train_batch}")
        ref = a.refs(PARAM_NAMES)
        plain = not ref and not a.frozen  # the module's own gradient map goes to SGD unchanged
        self._reseed(a.dropout_seed)
        sgd = self._SGD.create(self._params, float(a.lr), 0.0, 0.0, 0.0, False)
        losses = []
        for idx, mask in self._batches(o, a):
            loss = self._step_inputs(xa[idx], ya[idx], a.class_weights, mask)
            jgrads = self._train.namedGradients(METHOD)
            if plain:
                sgd.step(jgrads)
            else:
                w = self.get_weights()
                grads = self._HashMap()
                for n in PARAM_NAMES:
                    g = self._array(jgrads.get(self._fqn[n]), n)
                    if n in a.frozen:
                        g = np.zeros_like(g)
                    elif ref:
                        g = g + np.float32(a.prox_mu) * (w[n] - ref[n])
                    grads.put(self._fqn[n], self._tensor(g))
                sgd.step(grads)
                if ref:
                    trained = [n for n in PARAM_NAMES if n not in a.frozen]
                    loss = a.prox_loss(loss, sum(float(np.sum((w[n] - ref[n]) ** 2, dtype=np.float32)) for n in trained))
            losses.append(loss)
        return losses

    def _grads(
        self, xa: np.ndarray, ya: np.ndarray, names: Sequence[str], class_weights: np.ndarray | None,
        dropout: bool, dropout_seed: int | None, dropout_mask: np.ndarray | None,
    ) -> tuple[float, dict[str, np.ndarray]]:  # fmt: skip
        mask = self._grads_mask(names, PARAM_NAMES, len(xa), dropout, dropout_seed, dropout_mask, say_known=False)
        loss = self._step_inputs(xa, ya, class_weights, mask)
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
