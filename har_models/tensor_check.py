"""The one shape validator of fedhar, and the errors every refused envelope or state raises.

Envelopes (:mod:`har_models.wire.codec`), saved states, growth and FedDist detection all check model
states through :func:`check_tensors` (directly or through :func:`har_models.nn.model.check_state`);
it lives below both the network code and the model code so that neither imports the other for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


class EnvelopeError(ValueError):
    """An envelope (or a state) that must be rejected; ``reason`` is a short machine-readable code."""

    reason = "invalid"


class WrongTensors(EnvelopeError):
    """Tensor names or shapes differ from what the architecture expects."""

    reason = "wrong_tensors"


class NonFinite(EnvelopeError):
    """A tensor holds NaN or infinity."""

    reason = "non_finite"


def check_tensors(
    expected: Mapping[str, tuple[int, ...]], tensors: Mapping[str, Any], what: str = "", finite: bool = True
) -> None:
    """Check that ``tensors`` has exactly the names and shapes of ``expected`` (and, by default, all finite).

    Parameters
    ----------
    expected : mapping name -> shape
        E.g. :meth:`har_models.nn.model.ArchSpec.shapes`.
    tensors : mapping name -> array or torch tensor
    what : str
        What is checked, prefixed to the message (``"grown state"``, ``"client state #2"``).
    finite : bool
        Also refuse NaN and inf.

    Raises
    ------
    WrongTensors
        Naming missing, unexpected or mis-shaped tensors and the expected shape.
    NonFinite
        Naming the first tensor with NaN or inf.
    """
    prefix = f"{what}: " if what else ""
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise WrongTensors(f"{prefix}tensor names do not match the architecture: missing {missing}, unexpected {extra}")
    for name, shape in expected.items():
        got = tuple(np.shape(tensors[name]))
        if got != tuple(shape):
            raise WrongTensors(f"{prefix}tensor {name!r} has shape {got}, the architecture expects {tuple(shape)}")
        if finite:
            arr = np.asarray(tensors[name])
            if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
                raise NonFinite(f"{prefix}tensor {name!r} holds NaN or inf")
