"""Choose a training backend by name: the one place that knows the implementations and what each needs.

Apart from :mod:`edge_client.backends.base`, so the implementations depend on the interface only.
Each is imported only when asked for, so a device needs only its own runtime; :func:`choose_backend`
(``fedhar-client`` and the app) takes the best backend installed, found without importing it.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping

import numpy as np

from edge_client.backends.base import BACKEND_NAMES, BackendOptions, TrainingBackend
from har_models.nn.arch import ArchSpec

__all__ = ["BACKEND_NAMES", "BACKEND_RUNTIMES", "BackendUnavailable", "available_backends", "choose_backend", "make_backend"]

BACKEND_RUNTIMES: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    # executorch_rt exports its programs with PyTorch (har_models.nn.export) and runs them with the runtime.
    "executorch": ("executorch", "torch"),
    # The Java training module of the ExecuTorch AAR, reached through pyjnius (only on Android).
    "executorch-android": ("jnius",),
    "numpy": (),
}
"""The top-level modules each backend imports besides numpy."""


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing it (already imported: present; blocked as
    ``sys.modules[m] = None``: absent)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ValueError, ImportError):
        return False


class BackendUnavailable(ModuleNotFoundError):
    """A requested backend needs a module that is not installed (``name``); a ModuleNotFoundError, so ``fedhar-client``
    exits 7, which its systemd unit does not restart."""


def missing_runtimes(name: str) -> tuple[str, ...]:
    """The modules backend ``name`` needs that are not installed (empty when it can run); ValueError if unknown."""
    if name not in BACKEND_RUNTIMES:
        raise ValueError(f"unknown backend {name!r}; choose one of {BACKEND_NAMES}")
    return tuple(m for m in BACKEND_RUNTIMES[name] if not _installed(m))


def available_backends() -> tuple[str, ...]:
    """The backends whose runtimes are installed, in order of preference (:data:`BACKEND_NAMES`); numpy always."""
    return tuple(n for n in BACKEND_NAMES if not missing_runtimes(n))


def choose_backend(requested: str | None = None) -> tuple[str, str]:
    """The backend to train with and why, in words for the start-up log line.

    ``requested`` None or ``"auto"``: the best one installed (torch, else ExecuTorch's Python then
    Java runtime, else numpy), e.g. ``("numpy", "best installed; torch: torch not installed, ...")``.

    Raises
    ------
    ValueError
        On an unknown name.
    BackendUnavailable
        For a requested backend whose runtime is missing (naming the module and the backends that would run).
    """
    if requested in (None, "auto"):
        skipped: list[str] = []
        for name in BACKEND_NAMES:
            missing = missing_runtimes(name)
            if not missing:
                why = "best installed" + (f"; {', '.join(skipped)}" if skipped else "")
                return name, why
            skipped.append(f"{name}: {', '.join(missing)} not installed")
        raise AssertionError("the numpy backend needs nothing beyond numpy")  # pragma: no cover
    assert requested is not None
    missing = missing_runtimes(requested)
    if missing:
        raise BackendUnavailable(
            f"backend {requested!r} needs {' and '.join(missing)}, which is not installed here; "
            f"install it or choose one of {available_backends()} (or leave --backend out to take the best installed)",
            name=missing[0],
        )
    return requested, "requested"


def make_backend(
    name: str, spec: ArchSpec, weights: Mapping[str, np.ndarray] | None = None, options: BackendOptions | None = None
) -> TrainingBackend:
    """The backend called ``name`` for ``spec``, loaded with ``weights`` if given (else its deterministic init, seed 0).

    ``options``: ExecuTorch's program folder and batch sizes (``executorch-android`` reads the folder
    only). Raises ValueError on an unknown name or weights that do not fit ``spec``, ImportError if
    the backend's runtime is not installed.
    """
    opts = options or BackendOptions()
    if name == "numpy":
        from edge_client.backends.numpy_ref import NumpyBackend

        return NumpyBackend(spec, weights)
    if name == "torch":
        from edge_client.backends.torch_eager import TorchBackend

        return TorchBackend(spec, weights)
    if name == "executorch":
        from edge_client.backends.executorch_rt import ExecuTorchBackend

        return ExecuTorchBackend(
            spec, weights, cache_dir=opts.program_cache, train_batch=opts.train_batch, infer_batch=opts.infer_batch,
            programs=opts.programs, inference=opts.inference,
        )  # fmt: skip
    if name == "executorch-android":
        from edge_client.backends.android_executorch import AndroidExecuTorchBackend

        if opts.program_cache is None:
            raise ValueError(
                "make_backend: executorch-android runs programs the coordinator delivered; give "
                "BackendOptions(program_cache=FOLDER) (the client passes <state-dir>/programs, or --program-cache)"
            )
        return AndroidExecuTorchBackend.from_cache(spec, weights, cache_dir=opts.program_cache)
    raise ValueError(f"make_backend: unknown backend {name!r}; choose one of {BACKEND_NAMES}")
