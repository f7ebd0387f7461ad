"""A stand-in for ExecuTorch's Java API (``org.pytorch.executorch``), built on its Python runtime.

Used as the ``autoclass`` of :class:`edge_client.backends.android_executorch.AndroidExecuTorchBackend`
in tests, where no phone and no JVM exist. It mirrors the Java classes' method names and
signatures as the adapter calls them (``TrainingModule.load / executeForwardBackward /
namedParameters / namedGradients``, ``SGD.create / step`` with ExecuTorch's real SGD,
``Module.load / forward``, ``Tensor.fromBlob / getDataAsFloatArray / getRawDataBuffer``,
``EValue.from / toTensor``, ``java.util.HashMap``). Like the Java API, float arrays cross the
boundary as Python lists. It cannot tell whether the real JNI aliases parameter memory; here the
parameters alias the runtime's memory, as in the Python bindings.
"""

# ruff: noqa: N802  (method names are those of the Java API)
from __future__ import annotations

from typing import Any

import numpy as np
import torch


class JTensor:
    """``org.pytorch.executorch.Tensor`` over a torch tensor (aliasing when it came from the runtime)."""

    def __init__(self, t: torch.Tensor):
        self.t = t

    @staticmethod
    def fromBlob(data: list[Any], shape: list[int]) -> JTensor:
        dtype = np.int64 if data and isinstance(data[0], int) else np.float32
        return JTensor(torch.from_numpy(np.asarray(data, dtype=dtype).reshape(shape)))

    def getDataAsFloatArray(self) -> list[float]:
        return self.t.reshape(-1).tolist()

    def getRawDataBuffer(self) -> _FloatBuffer:
        return _FloatBuffer(self.t)


class _FloatBuffer:
    def __init__(self, t: torch.Tensor):
        self.t = t

    def rewind(self) -> None:
        pass

    def put(self, values: list[float]) -> None:
        with torch.no_grad():
            self.t.copy_(torch.tensor(values, dtype=self.t.dtype).reshape(self.t.shape))


class JEValue:
    """``org.pytorch.executorch.EValue`` holding a tensor (``EValue.from`` is reached with getattr)."""

    def __init__(self, tensor: JTensor):
        self._tensor = tensor

    def toTensor(self) -> JTensor:
        return self._tensor


setattr(JEValue, "from", staticmethod(lambda tensor: JEValue(tensor)))  # "from" is a Python keyword


class HashMap(dict[str, Any]):
    """``java.util.HashMap``."""

    def put(self, key: str, value: Any) -> None:
        self[key] = value


class JTrainingModule:
    """``org.pytorch.executorch.training.TrainingModule``."""

    def __init__(self, path: str):
        from executorch.extension.pybindings.portable_lib import _load_for_executorch

        self.m = _load_for_executorch(path)
        self.params: HashMap | None = None
        self.grads = HashMap()

    @staticmethod
    def load(path: str) -> JTrainingModule:
        return JTrainingModule(path)

    def executeForwardBackward(self, method: str, *inputs: JEValue) -> list[JEValue]:
        gi = int(self.m.run_method(f"__et_training_gradients_index_{method}", ())[0])
        pi = int(self.m.run_method(f"__et_training_parameters_index_{method}", ())[0])
        fqn = list(self.m.run_method(f"__et_training_fqn_{method}", ()))
        outs = self.m.run_method(method, tuple(e.toTensor().t for e in inputs), clone_outputs=False)
        self.grads = HashMap(zip(fqn, (JTensor(g) for g in outs[gi:pi]), strict=True))
        if self.params is None:
            self.params = HashMap(zip(fqn, (JTensor(p) for p in outs[pi:]), strict=True))
        return [JEValue(JTensor(o.clone())) for o in outs[:gi]]

    def namedParameters(self, method: str) -> HashMap:
        assert self.params is not None
        return self.params

    def namedGradients(self, method: str) -> HashMap:
        return self.grads


class JSGD:
    """``org.pytorch.executorch.training.SGD`` on ExecuTorch's own SGD implementation."""

    def __init__(self, opt: Any):
        self.opt = opt

    @staticmethod
    def create(params: HashMap, lr: float, momentum: float, dampening: float, weight_decay: float, nesterov: bool) -> JSGD:
        from executorch.extension.training import get_sgd_optimizer

        return JSGD(get_sgd_optimizer({k: v.t for k, v in params.items()}, lr, momentum, dampening, weight_decay, nesterov))

    def step(self, grads: HashMap) -> None:
        self.opt.step({k: v.t for k, v in grads.items()})


class JModule:
    """``org.pytorch.executorch.Module``."""

    def __init__(self, path: str):
        from executorch.extension.pybindings.portable_lib import _load_for_executorch

        self.m = _load_for_executorch(path)

    @staticmethod
    def load(path: str) -> JModule:
        return JModule(path)

    def forward(self, *inputs: JEValue) -> list[JEValue]:
        return [JEValue(JTensor(o)) for o in self.m.forward(tuple(e.toTensor().t for e in inputs))]


CLASSES = {
    "org.pytorch.executorch.training.TrainingModule": JTrainingModule,
    "org.pytorch.executorch.training.SGD": JSGD,
    "org.pytorch.executorch.Module": JModule,
    "org.pytorch.executorch.Tensor": JTensor,
    "org.pytorch.executorch.EValue": JEValue,
    "java.util.HashMap": HashMap,
}


def autoclass(name: str) -> Any:
    """What ``jnius.autoclass`` returns for the classes the adapter uses."""
    return CLASSES[name]
