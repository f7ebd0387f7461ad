"""The ExecuTorch backend: the HAR CNN's exported programs run through the runtime's Python bindings.

Programs come from :func:`har_models.nn.export.ensure_programs`. Training runs the training
program's ``forward`` (forward, loss and backward in one call) and updates the program's own
parameter tensors in place, ``p <- p - lr * (g + mu (p - p_ref))`` (FedProx, Li et al., MLSys 2020,
eq. 2), through the uncloned tensors that alias its memory. Inference runs an XNNPACK program:
``"static"`` (default) with the weights patched into a ``.ptd`` copy (:func:`patch_weights`) and
reloaded when they changed, or ``"inputs"`` with the weights passed on every call (repacked each
time). Dropout masks are drawn as in :mod:`edge_client.backends.numpy_ref`, so both follow the same
trajectory. The Python runtime imports torch; a phone uses the Java runtime (:mod:`.android_executorch`).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from har_models.nn.arch import PARAM_NAMES, ArchSpec
from har_models.nn.export import STATIC_METHODS, ProgramFiles, ensure_programs, param_fqn, read_program_spec
from har_models.nn.model import init_state
from har_models.wire.pte_delivery import PTE_IDENTIFIER, RuntimeInfo, check_program_set, exporter_differs

from .base import ArchitectureMismatch, BackendBase, EpochArgs

log = logging.getLogger("fedhar.client.executorch")

DEFAULT_CACHE = Path(os.environ.get("FEDHAR_PROGRAM_CACHE", Path.home() / ".cache" / "fedhar" / "programs"))
"""Default program cache folder (override with ``FEDHAR_PROGRAM_CACHE`` or ``cache_dir``)."""

_GRAD_INDEX = "__et_training_gradients_index_forward"
_PARAM_INDEX = "__et_training_parameters_index_forward"
_FQN = "__et_training_fqn_forward"
InferenceMode = Literal["static", "inputs"]


def python_runtime() -> RuntimeInfo:
    """The installed Python runtime: executorch release, schema version and file identifier (of its ``schema/program.fbs``).

    Raises ImportError if executorch is not installed.
    """
    import importlib.resources
    import re
    from importlib.metadata import version

    from executorch.exir.version import EXECUTORCH_SCHEMA_VERSION

    identifier = PTE_IDENTIFIER
    try:
        schema = (importlib.resources.files("executorch") / "schema" / "program.fbs").read_text()
        found = re.search(r'file_identifier\s+"([^"]{4})"', schema)
        identifier = found.group(1) if found else identifier
    except (OSError, ModuleNotFoundError):
        pass
    return RuntimeInfo("Python runtime", version("executorch"), int(EXECUTORCH_SCHEMA_VERSION), identifier)


def patch_weights(template: bytes, offsets: Mapping[str, Sequence[int]], weights: Mapping[str, np.ndarray]) -> bytes:
    """A copy of the ``.ptd`` weights ``template`` with every named tensor's bytes replaced.

    ``offsets``: name -> (byte offset, byte length, *axis order) from the program metadata; the tensor
    is stored as ``weights[name].transpose(axis order)``, float32 little-endian, C order. Raises
    ValueError if a tensor's size differs from its slot or a name has no slot.
    """
    out = bytearray(template)
    for name, (at, length, *axes) in offsets.items():
        if name not in weights:
            raise ValueError(f"patch_weights: no tensor named {name!r} among {sorted(weights)}")
        a = np.asarray(weights[name])
        raw = np.ascontiguousarray(a.transpose(axes) if axes else a, dtype="<f4").tobytes()
        if len(raw) != length:
            raise ValueError(f"patch_weights: {name} has {len(raw)} bytes, its slot in the weights file {length}")
        out[at : at + length] = raw
    return bytes(out)


class ExecuTorchBackend(BackendBase):
    """:class:`~edge_client.backends.base.TrainingBackend` on ExecuTorch programs (Python runtime).

    Programs are exported to ``cache_dir`` (default :data:`DEFAULT_CACHE`) if absent, unless ``programs``
    are given; ``train_batch`` bounds ``train_epoch``'s batch size; larger inference inputs are split
    into ``infer_batch`` windows (the static program pads a partial chunk; one window has its own method).

    Raises
    ------
    ArchitectureMismatch
        If ``programs`` were exported for another architecture than ``spec``.
    ProgramRefused
        ``pte_corrupt`` or ``pte_incompatible``, checked before loading.
    ValueError
        If ``weights`` do not match ``spec``.
    ImportError
        If executorch is not installed (``pip install -e '<checkout>[executorch]'``).
    """

    def __init__(
        self,
        spec: ArchSpec,
        weights: Mapping[str, np.ndarray] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        train_batch: int = 32,
        infer_batch: int = 64,
        programs: ProgramFiles | None = None,
        inference: InferenceMode = "static",
    ):
        from executorch.extension.pybindings.portable_lib import _load_for_executorch

        files = programs or ensure_programs(spec, DEFAULT_CACHE if cache_dir is None else cache_dir, train_batch, infer_batch)
        program_spec, meta = read_program_spec(files.meta)
        if program_spec != spec:
            raise ArchitectureMismatch(
                f"ExecuTorchBackend: the programs in {files.meta.parent} are for architecture version {program_spec.version} "
                f"({program_spec.conv_filters} filters, {program_spec.dense_units} units), not version {spec.version} "
                f"({spec.conv_filters}, {spec.dense_units}); export programs for this architecture (ensure_programs)"
            )
        runtime = python_runtime()
        paths = {"train": files.train, "infer": files.infer, "infer_static": files.infer_static, "weights_ptd": files.weights_ptd}
        check_program_set(paths, meta, runtime)  # raises ProgramRefused (pte_corrupt / pte_incompatible) before any load
        skew = exporter_differs(meta, runtime)
        if skew:
            log.warning("ExecuTorchBackend: %s (same schema version %d)", skew, runtime.schema_version)
        self._spec = spec
        self.files = files
        self.train_batch = int(meta["train_batch"])  # type: ignore[call-overload]
        self.infer_batch = int(meta["infer_batch"])  # type: ignore[call-overload]
        if inference not in ("static", "inputs"):
            raise ValueError(f"ExecuTorchBackend: inference must be 'static' or 'inputs', got {inference!r}")
        self.inference = inference
        self._load = _load_for_executorch
        self._train = _load_for_executorch(str(files.train))
        self._infer = _load_for_executorch(str(files.infer)) if inference == "inputs" else None
        self._offsets: dict[str, list[int]] = dict(meta["weights_ptd"])  # type: ignore[call-overload]
        self._static: Any = None  # the static program, loaded with the current weights; None when stale
        self._tmp = tempfile.TemporaryDirectory(prefix="fedhar-weights-")
        self._gi = int(self._train.run_method(_GRAD_INDEX, ())[0])
        self._pi = int(self._train.run_method(_PARAM_INDEX, ())[0])
        fqns = list(self._train.run_method(_FQN, ()))
        # One call to obtain the program's own parameter tensors (uncloned: they alias its memory).
        outs = self._run_train(np.zeros((1, spec.n_channels, spec.window), np.float32), np.zeros(1, np.int64),
                               np.ones(1, np.float32), np.ones((1, spec.dense_units), np.float32))
        by_fqn = dict(zip(fqns, outs[self._pi :], strict=True))
        self._fqn = {n: param_fqn(n) for n in PARAM_NAMES}
        self._params: dict[str, torch.Tensor] = {n: by_fqn[self._fqn[n]] for n in PARAM_NAMES}
        self._grad_pos = {n: fqns.index(self._fqn[n]) for n in PARAM_NAMES}
        self._rng = np.random.default_rng(0)
        self.set_weights({n: v.numpy() for n, v in init_state(spec, 0).items()} if weights is None else weights)

    def _run_train(self, x: np.ndarray, y: np.ndarray, sw: np.ndarray, mask: np.ndarray) -> list[torch.Tensor]:
        inputs = (torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(sw), torch.from_numpy(mask))
        return list(self._train.run_method("forward", inputs, clone_outputs=False))

    def runtime_parameters(self) -> dict[str, torch.Tensor]:
        """The program's own parameter tensors by name (they alias the runtime's memory; do not resize)."""
        return dict(self._params)

    def set_weights(self, weights: Mapping[str, np.ndarray], arch_version: int | None = None, *, partial: bool = False) -> None:
        """Copy parameters by name into the program's memory; see :meth:`TrainingBackend.set_weights`."""
        arrays = self._weights_in(weights, arch_version, partial)
        with torch.no_grad():
            for n, a in arrays.items():
                self._params[n].copy_(torch.from_numpy(a))
        self._static = None

    def get_weights(self) -> dict[str, np.ndarray]:
        """Copies of the program's parameters by name (float32)."""
        return {n: p.numpy().copy() for n, p in self._params.items()}

    def _forward_backward(
        self, x: np.ndarray, y: np.ndarray, class_weights: np.ndarray | None, mask: np.ndarray | None
    ) -> tuple[float, dict[str, torch.Tensor]]:
        b = len(y)
        if b > self.train_batch:
            raise ValueError(f"ExecuTorchBackend: batch of {b} exceeds the training program's limit {self.train_batch}; "
                             "export with a larger train_batch")
        sw = np.ones(b, np.float32) if class_weights is None else np.asarray(class_weights, np.float32)[y]
        m = np.ones((b, self._spec.dense_units), np.float32) if mask is None else np.ascontiguousarray(mask, np.float32)
        outs = self._run_train(x, y, np.ascontiguousarray(sw), m)
        grads = {n: outs[self._gi + i] for n, i in self._grad_pos.items()}
        return float(outs[0]), grads

    def _epoch(self, xa: np.ndarray, ya: np.ndarray, o: np.ndarray, a: EpochArgs) -> list[float]:
        """One epoch on the program's parameters; ValueError when ``batch_size`` exceeds ``train_batch``."""
        if a.batch_size > self.train_batch:
            raise ValueError(f"ExecuTorchBackend.train_epoch: batch_size {a.batch_size} exceeds the program's train_batch "
                             f"{self.train_batch}; construct the backend with train_batch >= {a.batch_size}")
        trained = [n for n in PARAM_NAMES if n not in a.frozen]
        ref = {n: torch.from_numpy(v) for n, v in a.refs(trained).items()}
        self._reseed(a.dropout_seed)
        losses = []
        with torch.no_grad():
            for idx, mask in self._batches(o, a):
                loss, grads = self._forward_backward(xa[idx], ya[idx], a.class_weights, mask)
                if ref:
                    loss = a.prox_loss(loss, sum(float(((self._params[n] - ref[n]) ** 2).sum()) for n in trained))
                for n in trained:
                    g = grads[n] + a.prox_mu * (self._params[n] - ref[n]) if ref else grads[n]
                    self._params[n].add_(g, alpha=-a.lr)  # torch.optim.SGD's update, in the program's memory
                self._static = None
                losses.append(loss)
        return losses

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Logits ``(N, C)`` float32 from the inference program, in chunks of ``infer_batch``."""
        xa, _ = self._windows(x, None)
        chunks = [torch.from_numpy(xa[s : s + self.infer_batch]) for s in range(0, len(xa), self.infer_batch)]
        if self._infer is not None:
            w = tuple(self._params[n] for n in PARAM_NAMES)
            out = [self._infer.forward((c, *w))[0].numpy() for c in chunks]
        else:
            program = self._static_program()
            out = []
            for c in chunks:
                if len(c) == 1:
                    out.append(program.run_method("forward_1", (c,))[0].numpy())
                else:
                    padded = torch.zeros(self.infer_batch, *c.shape[1:]) if len(c) < self.infer_batch else c
                    if len(c) < self.infer_batch:
                        padded[: len(c)] = c
                    out.append(program.run_method("forward_batch", (padded,))[0].numpy()[: len(c)])
        return np.concatenate(out) if out else np.empty((0, self._spec.n_classes), np.float32)

    def _static_program(self) -> Any:
        """The static-weights inference program loaded with the current parameters (reloaded when stale)."""
        if self._static is None:
            data = patch_weights(self.files.weights_ptd.read_bytes(), self._offsets, self.get_weights())
            fd, path = tempfile.mkstemp(dir=self._tmp.name, suffix=".ptd")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self._static = self._load(str(self.files.infer_static), data_path=path)
            for method, batch in STATIC_METHODS(self.infer_batch).items():  # load both methods now
                self._static.run_method(method, (torch.zeros(batch, self._spec.n_channels, self._spec.window),))
            Path(path).unlink()  # the runtime has read and packed the weights
        return self._static

    def _grads(
        self, xa: np.ndarray, ya: np.ndarray, names: Sequence[str], class_weights: np.ndarray | None,
        dropout: bool, dropout_seed: int | None, dropout_mask: np.ndarray | None,
    ) -> tuple[float, dict[str, np.ndarray]]:  # fmt: skip
        mask = self._grads_mask(names, PARAM_NAMES, len(xa), dropout, dropout_seed, dropout_mask)
        loss, grads = self._forward_backward(xa, ya, class_weights, mask)
        return loss, {n: grads[n].numpy().copy() for n in names}
