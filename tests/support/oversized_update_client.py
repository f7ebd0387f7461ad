"""A faulty device for the soak test: ``fedhar-client`` whose every update is finite but ``--scale`` times too large.

Run as ``python -m support.oversized_update_client --scale 100 <fedhar-client options>`` with
``tests/`` on ``PYTHONPATH``. Before the update is encoded for upload, each trained tensor w is
replaced by w0 + s (w - w0), where w0 is the tensor the device received: the update's delta is s
times what training gave, its values stay finite. Tensors the received model lacks (FedDWA's
guidance) are left as trained. The product's modules are not changed; only this process's
``edge_client.trainer.encode_for_upload`` is wrapped.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from edge_client import cli, trainer

_encode_for_upload = trainer.encode_for_upload


def scaled_update(tensors: Mapping[str, np.ndarray], received: Mapping[str, np.ndarray], scale: float) -> dict[str, np.ndarray]:
    """w0 + scale (w - w0) for each tensor w of ``tensors`` that ``received`` (w0) holds with the same shape; others as they are.

    Float32 in, float32 out.
    """
    out = dict(tensors)
    for name, w in tensors.items():
        w0 = received.get(name)
        if w0 is not None and w0.shape == w.shape and np.issubdtype(w.dtype, np.floating):
            out[name] = (w0 + np.float32(scale) * (w - w0)).astype(w.dtype)
    return out


def main(argv: list[str]) -> int:
    """``--scale S`` (default 100) followed by ``fedhar-client``'s options; the client's exit status."""
    scale = 100.0
    if argv[:1] == ["--scale"]:
        scale, argv = float(argv[1]), argv[2:]

    def oversized(store: Any, ann: Any, tensors: Mapping[str, np.ndarray], received: Mapping[str, np.ndarray]) -> Any:
        return _encode_for_upload(store, ann, scaled_update(tensors, received, scale), received)

    trainer.encode_for_upload = oversized
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
