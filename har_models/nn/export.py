"""ExecuTorch programs of the HAR CNN, one set per architecture version, cached on disk.

For an :class:`~har_models.nn.arch.ArchSpec`:

* a **training program** (``<key>.train.pte``): ``forward(x (B, 6, T), y (B,), sw (B,), mask (B, H))``
  -> ``[loss, logits (B, C), grads..., params...]``, ``loss = mean_b(sw_b * CE_b)`` with class
  weights ``sw`` (:func:`har_models.nn.training.make_loss`) and ``mask`` the dropout multipliers
  (0 or ``1/(1-p)``); the parameters live in the program;
* an **inference program** (``<key>.infer.pte``), XNNPACK, weights as inputs:
  ``forward(x, conv.weight, conv.bias, hidden.weight, hidden.bias, out.weight, out.bias)`` -> ``(B, C)``;
* a **static-weights inference program** (``<key>.infer_static.pte`` + ``<key>.weights.ptd``)
  (:func:`export_static_inference_program`).

The first two take batches 1..``train_batch``/``infer_batch``; the static one fixed batches
(:func:`STATIC_METHODS`).

The training program computes HarCNN's function (``tests/test_backends.py`` checks every
gradient against eager) in operators whose autograd backward is cheap in the runtime's kernels
(docs/backends.md holds the kernel timings and bugs): no ``max_pool2d`` (its portable backward
was wrong), convolution as im2col matrix products per pool offset with the maximum as
:func:`_pool_max`, bias and ReLU after the pool (exact, rounding is monotone), ReLU as
:func:`_relu`, dense layers as ``mm(W, x.t()).t() + b``, never ``linear``.

``<key>.json`` records the spec, the exporter's versions and each file's length and sha256
(:func:`exporter_versions`). The key (:func:`program_key`) covers the spec, the export format,
the executorch version and the batch limits.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from har_models.files import atomic_write_bytes
from har_models.nn.arch import PARAM_NAMES, ArchSpec
from har_models.nn.model import init_state

EXPORT_FORMAT = 2
"""Bumped whenever the programs' signatures or formulation change (part of the cache key)."""


@dataclass(frozen=True)
class ProgramFiles:
    """Paths of one architecture's exported programs.

    ``meta`` is JSON with ``spec``, ``key``, ``train_batch``, ``infer_batch``, ``params`` (each
    parameter's name in the training program) and ``weights_ptd`` (offset and length of each
    parameter in the weights template).
    """

    train: Path
    infer: Path
    meta: Path
    infer_static: Path
    weights_ptd: Path


class _Functional(nn.Module):
    """The HAR CNN with parameters as attributes (training program) or as inputs (weights-as-inputs program)."""

    def __init__(self, spec: ArchSpec, state: dict[str, torch.Tensor] | None = None):
        super().__init__()
        self.spec = spec
        k = spec.kernel
        self.pad = ((k - 1) // 2, k - 1 - (k - 1) // 2)  # 'same' padding as HarCNN (7 and 8 for k = 16)
        self.register_buffer("idx", torch.arange(spec.window)[:, None] + torch.arange(k)[None, :], persistent=False)
        self.register_buffer("mean", torch.tensor(spec.input_mean, dtype=torch.float32).view(1, -1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(spec.input_std, dtype=torch.float32).view(1, -1, 1), persistent=False)
        if state is not None:
            # Registered in PARAM_NAMES order under flat names ("conv_weight"); see _param_fqn.
            for name in PARAM_NAMES:
                self.register_parameter(_param_fqn(name), nn.Parameter(state[name].detach().clone().float()))

    def logits(self, x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits ``(B, C)`` as im2col + ``F.linear`` (the weights-as-inputs inference program, XNNPACK-lowered)."""
        s = self.spec
        b = x.shape[0]
        x = (x - self.get_buffer("mean")) / self.get_buffer("std")
        x = F.pad(x, self.pad)
        cols = x[:, :, self.get_buffer("idx")]  # (B, C, T, k): cols[b, c, t, j] = x_pad[b, c, t + j]
        cols = cols.permute(0, 2, 1, 3).reshape(b * s.window, s.n_channels * s.kernel)
        z = F.relu(F.linear(cols, w["conv.weight"].reshape(s.conv_filters, -1), w["conv.bias"]))  # (B*T, F)
        z = z.reshape(b, s.pooled_len, s.pool, s.conv_filters).amax(2)  # max-pool along time: (B, T', F)
        flat = z.permute(0, 2, 1).reshape(b, s.conv_filters * s.pooled_len)  # channel-first, as HarCNN
        h = F.relu(F.linear(flat, w["hidden.weight"], w["hidden.bias"]))
        return F.linear(h, w["out.weight"], w["out.bias"])


def _step(x: torch.Tensor) -> torch.Tensor:
    """``1`` where ``x > 0``, else ``0`` (float, no gradient), as ``sign(relu(x))``: comparisons and ``where`` run slow generic kernels."""
    return torch.sign(torch.relu(x)).detach()


def _relu(x: torch.Tensor) -> torch.Tensor:
    """``relu(x)`` as ``x * step(x)``: one ``mul`` backward; equal for finite ``x`` up to the sign of zero."""
    return x * _step(x)


def _pool_max(zs: list[torch.Tensor]) -> torch.Tensor:
    """Element-wise maximum of same-shape tensors, its gradient to the first that attains it (as ``max_pool2d``'s index).

    ``sum_i z_i * m_i`` with ``m_i`` the constant indicator of the first maximum (``step(z_i - c)``
    against the running maximum, so ties keep the earlier); exact for finite values.
    """
    top = zs[0].detach()
    wins = []
    for z in zs[1:]:
        zd = z.detach()
        s = _step(zd - top)
        top = zd * s + top * (1.0 - s)  # exact selection
        wins.append(s)
    masks = []
    later = None  # 1 where no later input won
    for i in range(len(zs) - 1, -1, -1):
        m = (wins[i - 1] if i > 0 else torch.ones_like(top)) * (later if later is not None else 1.0)
        masks.append(m)
        if i > 0:
            later = (1.0 - wins[i - 1]) if later is None else later * (1.0 - wins[i - 1])
    masks.reverse()
    out = zs[0] * masks[0]
    for z, m in zip(zs[1:], masks[1:], strict=True):
        out = out + z * m
    return out


def _param_fqn(name: str) -> str:
    """Attribute name of a parameter inside the exported module ("conv.weight" -> "conv_weight")."""
    return name.replace(".", "_")


class _TrainGraph(_Functional):
    def train_logits(self, x: torch.Tensor, w: dict[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, C)`` of HarCNN, formulated for the runtime's kernels (see the module docstring)."""
        s = self.spec
        b = x.shape[0]
        p, k, tp = s.pool, s.kernel, s.pooled_len
        ck, n = s.n_channels * k, b * tp
        x = (x - self.get_buffer("mean")) / self.get_buffer("std")
        xc = F.pad(x, self.pad).permute(1, 0, 2)  # (C, B, T + k - 1)
        # The im2col columns of pool offset i: cols_i[(c, j), (b, t')] = x_pad[b, c, t' * pool + i + j], stacked
        # from contiguous slices of the input's pool phases (gathering with index ran a slow generic kernel).
        phases = [xc[:, :, r::p] for r in range(p)]
        shifted = [phases[q % p][:, :, q // p : q // p + tp] for q in range(p + k - 1)]  # (C, B, T') each
        wc = w["conv.weight"].reshape(s.conv_filters, ck)
        zs = [torch.mm(wc, torch.stack(shifted[i : i + k], dim=1).reshape(ck, n)) for i in range(p)]  # (F, B*T')
        # Max-pool over the pool offsets; bias and ReLU after it: max_i relu(z_i + b) = relu(max_i z_i + b).
        z = _relu(_pool_max(zs) + w["conv.bias"].unsqueeze(1))
        flat = z.reshape(s.conv_filters, b, tp).permute(1, 0, 2).reshape(b, s.conv_filters * tp)  # channel-first, as HarCNN
        h = _relu(torch.mm(w["hidden.weight"], flat.t()).t() + w["hidden.bias"])
        h = h * mask
        return torch.mm(w["out.weight"], h.t()).t() + w["out.bias"]

    def forward(self, x: torch.Tensor, y: torch.Tensor, sw: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = {n: getattr(self, _param_fqn(n)) for n in PARAM_NAMES}
        logits = self.train_logits(x, w, mask)
        loss = (F.cross_entropy(logits, y, reduction="none") * sw).mean()
        return loss, logits.detach()


class _InferGraph(_Functional):
    def forward(
        self,
        x: torch.Tensor,
        conv_weight: torch.Tensor,
        conv_bias: torch.Tensor,
        hidden_weight: torch.Tensor,
        hidden_bias: torch.Tensor,
        out_weight: torch.Tensor,
        out_bias: torch.Tensor,
    ) -> torch.Tensor:
        w = dict(zip(PARAM_NAMES, (conv_weight, conv_bias, hidden_weight, hidden_bias, out_weight, out_bias), strict=True))
        return self.logits(x, w)


class _InferStatic(_Functional):
    """HarCNN's own layers (Conv2d, max_pool2d with explicit stride), all of which XNNPACK runs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.spec
        w = {n: getattr(self, _param_fqn(n)) for n in PARAM_NAMES}
        x = (x - self.get_buffer("mean")) / self.get_buffer("std")
        x = F.pad(x, self.pad).unsqueeze(-1)  # (B, C, T + k - 1, 1)
        z = F.relu(F.conv2d(x, w["conv.weight"], w["conv.bias"]))  # (B, F, T, 1)
        z = F.max_pool2d(z, (s.pool, 1), (s.pool, 1))  # stride spelled out: the XNNPACK partitioner reads it
        h = F.relu(F.linear(z.flatten(1), w["hidden.weight"], w["hidden.bias"]))
        return F.linear(h, w["out.weight"], w["out.bias"])


def program_key(spec: ArchSpec, train_batch: int, infer_batch: int) -> str:
    """Cache key: first 16 hex digits of SHA-256 over the spec JSON, format, executorch version and batch limits."""
    from importlib.metadata import version

    text = json.dumps(
        {"spec": spec.to_json(), "format": EXPORT_FORMAT, "executorch": version("executorch"), "train_batch": train_batch,
         "infer_batch": infer_batch},
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def param_fqn(name: str) -> str:
    """Name under which the training program reports parameter ``name`` (see :data:`PARAM_NAMES`)."""
    return _param_fqn(name)


def export_training_program(spec: ArchSpec, train_batch: int = 32) -> bytes:
    """The training program's bytes, batch 1..``train_batch``; parameters from ``init_state`` seed 0 (callers load theirs).

    Raises
    ------
    ImportError
        If executorch is not installed (``pip install -e '<checkout>[executorch]'``).
    """
    from executorch.exir import EdgeCompileConfig, to_edge
    from torch.export import Dim, export
    from torch.export.experimental import _export_forward_backward

    h = spec.dense_units
    example = (torch.zeros(2, spec.n_channels, spec.window), torch.zeros(2, dtype=torch.long), torch.ones(2), torch.ones(2, h))
    batch = Dim("batch", min=1, max=int(train_batch))
    dyn = {"x": {0: batch}, "y": {0: batch}, "sw": {0: batch}, "mask": {0: batch}}
    ep = export(_TrainGraph(spec, init_state(spec, 0)), example, dynamic_shapes=dyn, strict=False)
    ep = _export_forward_backward(ep)
    return bytes(to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch().buffer)


def export_inference_program(spec: ArchSpec, infer_batch: int = 64) -> bytes:
    """The XNNPACK-delegated inference program's bytes (weights as inputs), batch 1..``infer_batch``; ImportError without executorch."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from torch.export import Dim, export

    state = init_state(spec, 0)
    example = (torch.zeros(2, spec.n_channels, spec.window), *(state[n] for n in PARAM_NAMES))
    batch = Dim("batch", min=1, max=int(infer_batch))
    dyn = {"x": {0: batch}} | {_param_fqn(n): None for n in PARAM_NAMES}
    ep = export(_InferGraph(spec).eval(), example, dynamic_shapes=dyn, strict=False)
    lowered = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner(force_non_static_weights_for_f32_linear=True)])
    return bytes(lowered.to_executorch().buffer)


def STATIC_METHODS(infer_batch: int) -> dict[str, int]:  # noqa: N802 (reads as a table)
    """Methods of the static-weights inference program and their fixed batch sizes.

    XNNPACK's convolution in executorch 1.4.0 fails on a dynamic batch above about 15 windows.
    """
    return {"forward_1": 1, "forward_batch": int(infer_batch)}


def export_static_inference_program(spec: ArchSpec, infer_batch: int = 64) -> tuple[bytes, bytes, dict[str, list[int]]]:
    """An XNNPACK inference program whose weights live in a separate ``.ptd`` file, and where in it they are.

    XNNPACK packs the weights once per load; new weights are written over the template at the
    returned offsets (no export, no PyTorch). The template's tensors hold distinct random values,
    so none is deduplicated and each is found by its bytes.

    Returns
    -------
    (pte bytes, ptd bytes, {name: [byte offset, byte length, *axis order]})
        Each parameter stored float32 little-endian as ``tensor.transpose(axis order)`` in C order.

    Raises
    ------
    RuntimeError
        If a parameter's bytes are not found exactly once in the ptd.
    ImportError
        If executorch is not installed.
    """
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes.external_constants_pass import delegate_external_constants_pass_unlifted
    from torch.export import export

    g = torch.Generator().manual_seed(12345)
    template = {n: torch.rand(shape, generator=g) - 0.5 for n, shape in spec.shapes().items()}

    def tag(_node: object) -> str:
        return "weights"

    programs = {}
    for method, batch in STATIC_METHODS(infer_batch).items():
        example = (torch.zeros(batch, spec.n_channels, spec.window),)
        module = export(_InferStatic(spec, template).eval(), example, strict=False).module()
        delegate_external_constants_pass_unlifted(module, gen_tag_fn=tag)
        programs[method] = export(module, example, strict=False)
    lowered = to_edge_transform_and_lower(programs, partitioner=[XnnpackPartitioner()])
    prog = lowered.to_executorch(ExecutorchBackendConfig(external_constants=tag))
    with tempfile.TemporaryDirectory() as tmp:
        prog.write_tensor_data_to_file(tmp)
        ptd = (Path(tmp) / "weights.ptd").read_bytes()
    offsets: dict[str, list[int]] = {}
    for n, t in template.items():
        # XNNPACK stores a convolution's weights channels-last, (F, k, 1, C): try that order too.
        for perm in [list(range(t.dim()))] + ([[0, 2, 3, 1]] if t.dim() == 4 else []):
            raw = t.permute(perm).contiguous().numpy().astype("<f4").tobytes()
            at = ptd.find(raw)
            if at >= 0 and ptd.find(raw, at + 1) < 0:
                offsets[n] = [at, len(raw), *perm]
                break
        else:
            raise RuntimeError(f"export_static_inference_program: {n} is not stored exactly once in the weights file")
    return bytes(prog.buffer), ptd, offsets



def ensure_programs(spec: ArchSpec, cache_dir: str | os.PathLike[str], train_batch: int = 32, infer_batch: int = 64) -> ProgramFiles:
    """The cached programs for ``spec`` under ``cache_dir`` (created if missing), exported first if absent.

    Raises
    ------
    ValueError
        If a batch limit is < 1.
    ImportError
        If executorch is not installed.
    """
    if train_batch < 1 or infer_batch < 1:
        raise ValueError(f"ensure_programs: train_batch and infer_batch must be >= 1, got {train_batch}, {infer_batch}")
    folder = Path(cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    key = program_key(spec, train_batch, infer_batch)
    files = ProgramFiles(
        folder / f"{key}.train.pte", folder / f"{key}.infer.pte", folder / f"{key}.json",
        folder / f"{key}.infer_static.pte", folder / f"{key}.weights.ptd",
    )
    if not files.train.exists():
        atomic_write_bytes(files.train, export_training_program(spec, train_batch))
    if not files.infer.exists():
        atomic_write_bytes(files.infer, export_inference_program(spec, infer_batch))
    if not files.meta.exists():  # written last: its presence means the whole set is there
        pte, ptd, offsets = export_static_inference_program(spec, infer_batch)
        atomic_write_bytes(files.infer_static, pte)
        atomic_write_bytes(files.weights_ptd, ptd)
        meta = {"spec": spec.to_dict(), "key": key, "format": EXPORT_FORMAT, "train_batch": train_batch, "infer_batch": infer_batch,
                "params": {n: _param_fqn(n) for n in PARAM_NAMES}, "weights_ptd": offsets} | exporter_versions(files)
        atomic_write_bytes(files.meta, json.dumps(meta, sort_keys=True, indent=1).encode())
    return files


def exporter_versions(files: ProgramFiles) -> dict[str, object]:
    """What the metadata records of the exporter and each file, for :func:`har_models.wire.pte_delivery.check_program_set`.

    ``executorch``, ``schema_version`` (``EXECUTORCH_SCHEMA_VERSION``), ``pte_identifier`` (bytes
    4..8 of each ``.pte``) and ``files`` (``{name: {"bytes", "sha256"}}``); OSError if a file cannot be read.
    """
    from importlib.metadata import version

    from executorch.exir.version import EXECUTORCH_SCHEMA_VERSION

    paths = {"train": files.train, "infer": files.infer, "infer_static": files.infer_static, "weights_ptd": files.weights_ptd}
    recorded = {}
    for name, path in paths.items():
        data = path.read_bytes()
        recorded[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return {"executorch": version("executorch"), "schema_version": int(EXECUTORCH_SCHEMA_VERSION),
            "pte_identifier": files.train.read_bytes()[4:8].decode("ascii", errors="replace"), "files": recorded}


def read_program_spec(meta_path: str | os.PathLike[str]) -> tuple[ArchSpec, dict[str, object]]:
    """The ArchSpec and metadata recorded next to cached programs; ValueError naming the file if invalid."""
    try:
        meta = json.loads(Path(meta_path).read_text())
        return ArchSpec.from_json(meta["spec"]), meta
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"read_program_spec: {meta_path} is not program metadata ({exc})") from None
