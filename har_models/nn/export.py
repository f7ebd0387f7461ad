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
against PyTorch eager; ``benchmarks/bench_backends.py`` times them):

* max-pooling is a reshape and ``amax``: in executorch 1.4.0 the portable
  ``max_pool2d_with_indices_backward`` returned gradients about 200 times too large (checked on
  a Conv2d + max_pool2d model against eager; Conv2d's own backward was correct);
* the convolution is im2col plus one matrix product (a gather of the padded input at ``t + j``
  for ``j < k``), so its forward and backward run as ``mm``. In the training program it is
  :class:`_ConvT`, ``W (F, C*k) @ cols (C*k, B*T)``, filters first: pooling then reduces the
  contiguous last axis and no ``(B*T, F)`` activation is transposed, which took about 30 % off a
  step whose remaining time was mostly portable layout and reduction kernels;
* every dense layer of the training program is :class:`_Dense`, ``x @ W.T + b`` with a
  hand-written backward: the ``linear`` -> ``addmm`` lowering ran the portable ``addmm`` kernel (a
  naive loop, the top entry of a ``perf`` profile of the step) and copied the 6.4-M-entry
  ``hidden.weight`` through ``permute_copy`` several times per step; ``mm`` without transposes of
  the weight runs through BLAS (in the pip wheel, the MKL that the torch wheel loads). One
  batch-32 step of the paper CNN went from about 1.9 s to about 0.15 s on the development machine.

Metadata. ``<key>.json`` also records the exporter's executorch release, the schema version it
writes and the file identifier, and each file's length and sha256 (:func:`exporter_versions`), so a
device checks a program against its runtime before loading it
(:func:`har_models.wire.programs.check_program_set`).

Cache. Programs are keyed by the SHA-256 of the spec's canonical JSON, the export format version,
the executorch version and the batch limits (:func:`program_key`); a ``<key>.json`` file next to
them records the spec, so a program for architecture version v refuses weights of v + 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from har_models.files import atomic_write_bytes
from har_models.nn.arch import PARAM_NAMES, ArchSpec
from har_models.nn.model import init_state

DenseFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

EXPORT_FORMAT = 1
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
    """The HAR CNN as im2col + matrix products, with parameters as attributes or as inputs."""

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

    def logits(
        self, x: torch.Tensor, w: dict[str, torch.Tensor], mask: torch.Tensor | None, dense: DenseFn | None = None
    ) -> torch.Tensor:
        dense = dense or _dense
        s = self.spec
        b = x.shape[0]
        x = (x - self.get_buffer("mean")) / self.get_buffer("std")
        x = F.pad(x, self.pad)
        cols = x[:, :, self.get_buffer("idx")]  # (B, C, T, k): cols[b, c, t, j] = x_pad[b, c, t + j]
        if dense is _dense:
            # Filters-first layout (F, B*T): pooling reduces the contiguous last axis and no (B*T, F)
            # activation is ever transposed (portable layout kernels dominated the step otherwise).
            cols_t = cols.permute(1, 3, 0, 2).reshape(s.n_channels * s.kernel, b * s.window)
            z = F.relu(_ConvT.apply(cols_t, w["conv.weight"].reshape(s.conv_filters, -1), w["conv.bias"]))  # (F, B*T)
            z = z.reshape(s.conv_filters, b, s.pooled_len, s.pool).amax(3)  # max-pool along time: (F, B, T')
            flat = z.permute(1, 0, 2).reshape(b, s.conv_filters * s.pooled_len)  # channel-first, as HarCNN
        else:
            cols = cols.permute(0, 2, 1, 3).reshape(b * s.window, s.n_channels * s.kernel)
            z = F.relu(dense(cols, w["conv.weight"].reshape(s.conv_filters, -1), w["conv.bias"]))  # (B*T, F)
            z = z.reshape(b, s.pooled_len, s.pool, s.conv_filters).amax(2)  # max-pool along time: (B, T', F)
            flat = z.permute(0, 2, 1).reshape(b, s.conv_filters * s.pooled_len)  # channel-first, as HarCNN
        h = F.relu(dense(flat, w["hidden.weight"], w["hidden.bias"]))
        if mask is not None:
            h = h * mask
        return dense(h, w["out.weight"], w["out.bias"])


class _Dense(torch.autograd.Function):
    """``x @ weight.T + bias`` with a hand-written backward that never transposes ``weight``.

    Forward ``(weight @ x.T).T``; backward ``dx = g @ weight``, ``dweight = g.T @ x``, ``dbias = sum_b g``.
    Only the small ``(B, n)`` operands are transposed, where autograd's own rule for ``linear``
    copies the ``(H, F*T')`` weight or its gradient through ``permute_copy`` several times per step.
    """

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.mm(weight, x.t()).t() + bias

    @staticmethod
    def setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        x, weight, _ = inputs
        ctx.save_for_backward(x, weight)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, weight = ctx.saved_tensors  # type: ignore[attr-defined]
        return torch.mm(g, weight), torch.mm(g.t(), x), g.sum(0)


class _ConvT(torch.autograd.Function):
    """The convolution as ``W (F, C*k) @ cols_t (C*k, B*T) + b`` with outputs filters-first; no input gradient."""

    @staticmethod
    def forward(cols_t: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.mm(weight, cols_t) + bias.unsqueeze(1)

    @staticmethod
    def setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor) -> tuple[None, torch.Tensor, torch.Tensor]:
        (cols_t,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return None, torch.mm(g, cols_t.t()), g.sum(1)


def _dense(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T + bias`` (see :class:`_Dense`)."""
    out: torch.Tensor = _Dense.apply(x, weight, bias)
    return out


def _param_fqn(name: str) -> str:
    """Attribute name of a parameter inside the exported module ("conv.weight" -> "conv_weight")."""
    return name.replace(".", "_")


class _TrainGraph(_Functional):
    def forward(self, x: torch.Tensor, y: torch.Tensor, sw: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = {n: getattr(self, _param_fqn(n)) for n in PARAM_NAMES}
        logits = self.logits(x, w, mask)
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
        return self.logits(x, w, None, F.linear)


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
        If executorch is not installed (``pip install 'fedhar[executorch]'``).
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
    four files); see :func:`har_models.wire.programs.check_program_set`.

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
