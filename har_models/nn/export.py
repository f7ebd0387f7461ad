"""ExecuTorch programs of the HAR CNN, one set per architecture version, cached on disk.

For an :class:`~har_models.nn.arch.ArchSpec` this exports

* a **training program** (``<key>.train.pte``): forward, loss and backward in one method, through
  ExecuTorch's training export (``torch.export.export`` -> ``_export_forward_backward`` ->
  ``to_edge`` -> ``to_executorch``). Method ``forward(x (B, 6, T), y (B,), sw (B,), mask (B, H))``
  returns ``[loss, logits (B, C), grads..., params...]``; ``loss = mean_b(sw_b * CE_b)`` with
  ``sw_b = w_{y_b}`` the class weight of the window (:func:`har_models.nn.training.make_loss`), and
  ``mask`` the dropout multipliers (0 or ``1/(1-p)``; ones for no dropout). The parameters live in
  the program and are updated in place by the runtime's caller;
* an **inference program** (``<key>.infer.pte``), XNNPACK-delegated: ``forward(x (B, 6, T),
  conv.weight, conv.bias, hidden.weight, hidden.bias, out.weight, out.bias)`` -> logits ``(B, C)``.
  The weights are inputs, so a new model loads by name without re-exporting or rewriting files
  (the form for ExecuTorch's Java ``Module``); XNNPACK repacks them on every call;
* a **static-weights inference program** (``<key>.infer_static.pte`` + ``<key>.weights.ptd``):
  HarCNN's own layers, all delegated to XNNPACK, with the weights in a separate data file at byte
  offsets recorded in the metadata. New weights are written over that file (no export, no
  PyTorch) and XNNPACK packs them once per load (:func:`export_static_inference_program`).

The training program and the weights-as-inputs program take any batch from 1 to their maximum
(``train_batch``, ``infer_batch``; the batch dimension is exported dynamic). The static program has
fixed batches of 1 and ``infer_batch`` (see :func:`STATIC_METHODS`).

Formulation. The training program (and the weights-as-inputs program) compute the same function
as :class:`~har_models.nn.model.HarCNN` (same padding, same channel-first flatten, same parameter
shapes) in operators that ExecuTorch's kernels differentiate correctly and fast (``tests/test_backends.py`` checks every gradient
against PyTorch eager; ``benchmarks/bench_backends.py`` times them). The backward in the program is
autograd's own rule for each forward operator, as ``_export_forward_backward`` traces it (the
backward of a ``torch.autograd.Function`` does not reach the exported graph), so the forward is
written in operators whose derivatives are cheap in the runtime. What the runtime's kernels cost,
measured on 200,000 float32 elements (one thread, loaded machine): ``relu``, ``sub`` and ``mul``
0.1-0.2 ms, ``sign`` 0.5 ms; ``permute_copy`` and ``maximum``, which run generic per-element index
arithmetic, 1.6-1.7 ms; ``where`` about 4 ms, a comparison plus the bool -> float conversion about 5 ms;
and ``index`` gathering 393,000 im2col columns 19-28 ms (see :meth:`_TrainGraph.train_logits`):

* max-pooling is no ``max_pool2d``: in executorch 1.4.0 the portable
  ``max_pool2d_with_indices_backward`` returned gradients about 200 times too large (checked on
  a Conv2d + max_pool2d model against eager; Conv2d's own backward was correct);
* the convolution is im2col plus matrix products, one per pool offset ``i``:
  ``W (F, C*k) @ cols_i (C*k, B*T')`` with ``cols_i[(c, j), (b, t')] = x_pad[b, c, t' * pool + i + j]``,
  stacked from contiguous slices of the input's pool phases (no ``index``, no ``permute_copy`` of the
  columns). The pool is then an element-wise maximum of the ``pool`` products, written as
  ``sum_i z_i * m_i`` with constant first-maximum indicators ``m_i`` (:func:`_pool_max`): its backward is
  one ``mul`` per offset, and ties send the gradient to the first offset, as ``max_pool2d``'s index
  does (``amax`` split it);
* the bias and the ReLU come after the pool, on a quarter of the elements:
  ``max_i relu(z_i + b) = relu(max_i z_i + b)`` exactly, because rounding is monotone. Every ReLU is
  ``x * step(x)`` with ``step = sign(relu(x))`` held constant (:func:`_relu`): autograd's rule for
  ``relu`` is a comparison and a ``where``;
* the dense layers are ``mm(W, x.t()).t() + b``, never ``linear``: its ``addmm`` lowering ran the
  portable ``addmm`` kernel (a naive loop) and copied the 6.4-M-entry ``hidden.weight`` through
  ``permute_copy`` several times per step. With the input transposed (column-major when traced),
  autograd's rule for ``mm`` transposes only the ``(B, n)`` operands, never the weight.

Together (format 2) these took a batch-32 step of the paper CNN from 2.0-2.9x to 0.7-1.0x eager
PyTorch on the loaded development machine (``docs/backends.md``). The parameter gradients equal format 1's
to float32 rounding (the convolution's two gradients sum in another order).

Metadata. ``<key>.json`` also records the exporter's executorch release, the schema version it
writes and the file identifier, and each file's length and sha256 (:func:`exporter_versions`), so a
device checks a program against its runtime before loading it
(:func:`har_models.wire.pte_delivery.check_program_set`).

Cache. Programs are keyed by the SHA-256 of the spec's canonical JSON, the export format version,
the executorch version and the batch limits (:func:`program_key`); a ``<key>.json`` file next to
them records the spec, so a program for architecture version v refuses weights of v + 1.
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

    Attributes
    ----------
    train, infer : Path
        The training and the inference (weights as inputs) ``.pte`` files.
    meta : Path
        JSON with ``spec`` (the ArchSpec JSON), ``key``, ``train_batch``, ``infer_batch``, ``params``
        (name in the training program of each parameter) and ``weights_ptd`` (byte offset and length
        of each parameter in the weights template).
    infer_static, weights_ptd : Path
        The inference program with weights in a separate file, and that file's template
        (:func:`export_static_inference_program`).
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
    """``1`` where ``x > 0``, else ``0`` (float, no gradient), as ``sign(relu(x))``.

    Comparisons, ``where`` and the bool -> float conversion run the runtime's generic kernels, several
    times slower per element than ``relu``, ``sign`` and ``mul``.
    """
    return torch.sign(torch.relu(x)).detach()


def _relu(x: torch.Tensor) -> torch.Tensor:
    """``relu(x)`` as ``x * step(x)``: the backward is one ``mul`` where autograd's rule for ``relu`` is ``le`` + ``where``.

    Equal to ``relu`` for finite ``x`` up to the sign of zero (``-3 * 0 = -0``), which no later sum or
    product sees; the gradient at exactly 0 is 0, as for ``relu``.
    """
    return x * _step(x)


def _pool_max(zs: list[torch.Tensor]) -> torch.Tensor:
    """Element-wise maximum of same-shape tensors, its gradient to the first that attains it (as ``max_pool2d``'s index).

    ``sum_i z_i * m_i`` with ``m_i`` the constant 0/1 indicator of "z_i is the first maximum"; exact for
    finite values (one term is ``z_k * 1``, the others ``+-0``). ``z_i`` beats the running maximum
    ``c`` when ``step(z_i - c)`` is 1: ``z_i - c > 0`` exactly when ``z_i > c`` (a float difference is
    0 only for equal operands), so ties keep the earlier one. The backward is one ``mul`` per input.
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
    """The training program's bytes (see the module docstring), batch 1..``train_batch``.

    Initial parameters are :func:`har_models.nn.model.init_state` with seed 0; callers load theirs by name.

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
    """The XNNPACK-delegated inference program's bytes (weights as inputs), batch 1..``infer_batch``.

    Raises
    ------
    ImportError
        If executorch is not installed.
    """
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

    XNNPACK's convolution in executorch 1.4.0 fails on a dynamic batch above about 15 windows
    ("Attempted to resize a bounded tensor"), so this program has fixed batches: ``forward_1`` for
    live inference and ``forward_batch`` (``infer_batch`` windows, zero-padded) for evaluation.
    """
    return {"forward_1": 1, "forward_batch": int(infer_batch)}


def export_static_inference_program(spec: ArchSpec, infer_batch: int = 64) -> tuple[bytes, bytes, dict[str, list[int]]]:
    """An XNNPACK inference program whose weights live in a separate ``.ptd`` file, and where in it they are.

    Methods (:func:`STATIC_METHODS`) ``forward_1(x (1, 6, T))`` and ``forward_batch(x (infer_batch, 6, T))``
    -> logits; both read the same weights. XNNPACK packs the
    weights once when the program is loaded (the weights-as-inputs program repacks them on every
    call). To load new weights, write them over the template's bytes at the returned offsets and
    load the program with the patched file; no export is needed, and no PyTorch.

    The template holds distinct random values in every tensor so that no two tensors are
    deduplicated into one buffer and each can be found by its bytes.

    Returns
    -------
    (pte bytes, ptd bytes, {name: [byte offset, byte length, *axis order]}): where each parameter sits in the
    ptd, stored float32 little-endian as ``tensor.transpose(axis order)`` in C order (the convolution's
    weight is stored channels-last, axis order 0, 2, 3, 1)

    Raises
    ------
    RuntimeError
        If a parameter's bytes are not found exactly once in the ptd (the layout assumption broke).
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
    """The cached programs for ``spec`` under ``cache_dir``, exported first if absent.

    Parameters
    ----------
    spec : ArchSpec
    cache_dir : folder for ``<key>.train.pte``, ``<key>.infer.pte`` and ``<key>.json`` (created if missing)
    train_batch, infer_batch : int >= 1, the largest batch each program accepts (the static program's fixed batch)

    Returns
    -------
    ProgramFiles

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
    """What the metadata records of the exporter and of each file, for the device's checks before loading.

    ``executorch`` (the exporter's release), ``schema_version`` (``Program.version`` it writes,
    ``executorch.exir.version.EXECUTORCH_SCHEMA_VERSION``), ``pte_identifier`` (the flatbuffer file
    identifier, bytes 4..8 of each ``.pte``) and ``files`` (``{name: {"bytes", "sha256"}}`` of the
    four files); see :func:`har_models.wire.pte_delivery.check_program_set`.

    Raises
    ------
    OSError
        If a file cannot be read.
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
    """The ArchSpec and metadata recorded next to cached programs.

    Raises
    ------
    ValueError
        If the file is not valid metadata (names the file).
    """
    try:
        meta = json.loads(Path(meta_path).read_text())
        return ArchSpec.from_json(meta["spec"]), meta
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"read_program_spec: {meta_path} is not program metadata ({exc})") from None
