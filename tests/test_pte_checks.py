"""ExecuTorch programs a runtime cannot run: refused before loading, and fed only the batches they were built for.

Real executorch 1.4.0 programs of a small CNN (8 filters, 16 hidden units), exported once for the
module (about 30 s on a 2-core machine: the tests that use them are ``slow``). A program one schema version ahead is
written by executorch's own serializer (``Program.version = 1``); a truncated one loses its last
byte. Each is refused with ``pte_incompatible`` / ``pte_corrupt`` before the runtime sees it, and a
client round falls back to the numpy backend (checked in a subprocess, where a native crash would
show as a signal exit). docs/backends.md ("Programs the runtime cannot run").
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_client.backends import BackendOptions, make_backend
from edge_client.backends.torch_eager import TorchBackend
from har_models.nn.arch import PARAM_NAMES
from har_models.nn.model import ArchSpec, init_state
from har_models.wire.messages import ClientStatus, MessageError
from har_models.wire.pte_delivery import (
    PTE_IDENTIFIER,
    ProgramRefused,
    ProgramSet,
    RuntimeInfo,
    check_program_set,
    decode_programs,
    encode_programs,
    exporter_differs,
    program_paths,
    read_pte_header,
)

ROOT = Path(__file__).resolve().parents[1]
SPEC = ArchSpec(
    n_classes=4, conv_filters=8, dense_units=16, input_mean=(0.5, -0.2, 9.0, 0.0, 0.1, -0.1), input_std=(2.0, 1.5, 3.0, 0.5, 0.4, 0.6)
)


def _data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(n, 6, SPEC.window)) * 3).astype(np.float32)
    return x, rng.integers(0, SPEC.n_classes, n).astype(np.int64)


def _weights(seed: int = 1) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in init_state(SPEC, seed).items()}


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("executorch")
    from har_models.nn.export import ensure_programs

    return ensure_programs(SPEC, tmp_path_factory.mktemp("programs"))


def _copy_set(files: Any, dest: Path) -> dict[str, Path]:
    """Copy a program set into ``dest``; its paths there (program_paths)."""
    dest.mkdir(parents=True, exist_ok=True)
    key = files.meta.name[: -len(".json")]
    for p in (files.train, files.infer, files.infer_static, files.weights_ptd, files.meta):
        shutil.copy(p, dest / p.name)
    return program_paths(dest, key)


def _program_files(paths: dict[str, Path]) -> Any:
    from har_models.nn.export import ProgramFiles

    return ProgramFiles(paths["train"], paths["infer"], paths["meta"], paths["infer_static"], paths["weights_ptd"])


def _rewrite(paths: dict[str, Path], name: str, data: bytes, record: bool) -> None:
    """Replace one file; with ``record`` also its length and sha256 in the metadata (so only the header can tell)."""
    import hashlib

    paths[name].write_bytes(data)
    if record:
        meta = json.loads(paths["meta"].read_text())
        meta["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        paths["meta"].write_text(json.dumps(meta))


def _schema_ahead(data: bytes) -> bytes:
    """The same program with ``Program.version`` one above executorch 1.4.0's, written by executorch's serializer."""
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    pte = deserialize_pte_binary(data)
    pte = dataclasses.replace(pte, program=dataclasses.replace(pte.program, version=pte.program.version + 1))
    return bytes(serialize_pte_binary(pte, extract_delegate_segments=True))


# -- the header and the metadata ------------------------------------------------------------------


@pytest.mark.slow
def test_header_of_real_programs_and_their_metadata(programs: Any) -> None:
    from importlib.metadata import version

    meta = json.loads(programs.meta.read_text())
    assert meta["executorch"] == version("executorch") and meta["executorch"].startswith("1.4.0")
    assert meta["schema_version"] == 0 and meta["pte_identifier"] == "ET12" == PTE_IDENTIFIER
    for name, path in (("train", programs.train), ("infer", programs.infer), ("infer_static", programs.infer_static)):
        data = path.read_bytes()
        head = read_pte_header(data, name)
        assert (head.identifier, head.schema_version) == ("ET12", 0)
        assert data[8:12] == b"eh00" and head.expected_size == len(data) == meta["files"][name]["bytes"]
        assert 0 < head.program_size < len(data)  # the flatbuffer, then the data segments
    from edge_client.backends.executorch_rt import python_runtime

    rt = python_runtime()
    assert (rt.identifier, rt.schema_version, rt.executorch) == ("ET12", 0, version("executorch"))


@pytest.mark.slow
def test_schema_version_one_ahead_is_read_from_the_serialized_program(programs: Any) -> None:
    ahead = _schema_ahead(programs.train.read_bytes())
    head = read_pte_header(ahead)
    assert head.schema_version == 1 and head.identifier == "ET12" and head.expected_size == len(ahead)


@pytest.mark.slow
def test_metadata_travels_with_delivered_programs(programs: Any) -> None:
    from har_models.nn.export import read_program_spec

    _, meta = read_program_spec(programs.meta)
    files = {"train": programs.train, "infer": programs.infer, "infer_static": programs.infer_static,
             "weights_ptd": programs.weights_ptd}  # fmt: skip
    env = encode_programs(ProgramSet(SPEC, dict(meta), {n: p.read_bytes() for n, p in files.items()}), client_id="c1",
                          run_id="r", executorch_version=str(meta["executorch"]))  # fmt: skip
    got = decode_programs(env, client_id="c1", run_id="r", spec=SPEC)
    assert got.meta["executorch"] == meta["executorch"] and got.meta["schema_version"] == 0
    assert got.meta["files"] == meta["files"]


# -- refused before loading ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "record", "reason"), [
    ("ahead", True, "pte_incompatible"),
    ("truncated", True, "pte_corrupt"),   # the metadata agrees: the header's own length tells
    ("truncated", False, "pte_corrupt"),  # the metadata's length and sha256 tell
])  # fmt: skip
def test_program_the_runtime_cannot_run_is_refused_before_loading(
    programs: Any, tmp_path: Path, fault: str, record: bool, reason: str
) -> None:
    paths = _copy_set(programs, tmp_path / "set")
    data = programs.train.read_bytes()
    _rewrite(paths, "train", _schema_ahead(data) if fault == "ahead" else data[:-1], record)
    with pytest.raises(ProgramRefused) as err:
        make_backend("executorch", SPEC, _weights(), BackendOptions(programs=_program_files(paths)))
    assert err.value.reason == reason
    if fault == "ahead":
        assert "schema version 1" in str(err.value) and "1.4.0" in str(err.value)


@pytest.mark.slow
def test_android_runtime_is_checked_against_its_aar(programs: Any, tmp_path: Path) -> None:
    from edge_client.backends.android_executorch import AndroidExecuTorchBackend

    paths = _copy_set(programs, tmp_path / "set")
    _rewrite(paths, "train", _schema_ahead(programs.train.read_bytes()), True)
    loaded: list[str] = []

    def autoclass(name: str) -> Any:  # the Java runtime must never be reached
        loaded.append(name)
        raise AssertionError(f"{name} reached before the check")

    with pytest.raises(ProgramRefused) as err:
        AndroidExecuTorchBackend(SPEC, paths["train"], paths["infer"], paths["meta"], autoclass=autoclass)
    assert err.value.reason == "pte_incompatible" and "executorch-android AAR" in str(err.value) and loaded == []
    meta = json.loads(paths["meta"].read_text())
    newer = RuntimeInfo("newer AAR", "1.5.0", schema_version=1)
    check_program_set({"train": paths["train"], "infer": paths["infer"]}, meta, newer, ("train", "infer"))  # reads it: no error


@pytest.mark.slow
def test_client_round_falls_back_in_a_subprocess(programs: Any, tmp_path: Path) -> None:
    """The refusal and the fallback in a fresh process: a native crash would be a negative return code."""
    results = {}
    for fault in ("ahead", "truncated"):
        paths = _copy_set(programs, tmp_path / fault)
        data = programs.train.read_bytes()
        _rewrite(paths, "train", _schema_ahead(data) if fault == "ahead" else data[:-1], True)
        script = textwrap.dedent(f"""
            import json
            from edge_client.backends import BackendOptions
            from edge_client.trainer import ClientTrainer
            from har_models.nn.arch import ArchSpec
            from har_models.nn.export import ProgramFiles
            from har_models.nn.model import init_state
            from har_models.wire.messages import ClientStatus
            spec = ArchSpec.from_json(json.loads({json.dumps(SPEC.to_json())!r}))
            p = {{k: v for k, v in json.loads({json.dumps({k: str(v) for k, v in paths.items()})!r}).items()}}
            files = ProgramFiles(p["train"], p["infer"], p["meta"], p["infer_static"], p["weights_ptd"])
            trainer = ClientTrainer(None, "c1", "executorch", BackendOptions(programs=files))
            backend = trainer._make_backend(spec, {{k: v.numpy() for k, v in init_state(spec, 1).items()}})
            status = ClientStatus.from_bytes(ClientStatus("c1", "idle", program_fault=trainer.program_fault).to_bytes())
            print(json.dumps([type(backend).__name__, status.program_fault]))
        """)
        proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        results[fault] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results == {"ahead": ["NumpyBackend", "pte_incompatible"], "truncated": ["NumpyBackend", "pte_corrupt"]}


def test_header_check_refuses_bytes_that_are_no_program() -> None:
    with pytest.raises(ProgramRefused, match="cannot hold") as err:
        read_pte_header(b"\x10\x00\x00\x00ET12")
    assert err.value.reason == "pte_corrupt"
    with pytest.raises(ProgramRefused, match="identifier") as err:
        read_pte_header(b"\x10\x00\x00\x00PK\x03\x04" + bytes(40))
    assert err.value.reason == "pte_corrupt"
    with pytest.raises(ProgramRefused, match="root table") as err:
        read_pte_header(b"\xff\xff\x00\x00ET12" + bytes(40))
    assert err.value.reason == "pte_corrupt"


def test_exporter_release_is_named_and_part_of_the_cache_key(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    from har_models.nn.export import program_key

    rt = RuntimeInfo("Python runtime", "1.4.0+cpu")
    assert exporter_differs({"executorch": "1.4.0"}, rt) is None
    said = exporter_differs({"executorch": "1.5.0"}, rt)
    assert said is not None and "1.5.0" in said and "1.4.0+cpu" in said
    monkeypatch.setattr(importlib.metadata, "version", lambda _name: "1.4.0")
    key_140 = program_key(SPEC, 32, 64)
    monkeypatch.setattr(importlib.metadata, "version", lambda _name: "1.5.0")
    assert program_key(SPEC, 32, 64) != key_140


def test_status_program_fault_is_optional_and_checked() -> None:
    old = json.dumps({"protocol": json.loads(ClientStatus("c1", "idle").to_bytes())["protocol"], "client_id": "c1", "state": "idle"})
    assert ClientStatus.from_bytes(old.encode()).program_fault == ""
    assert "program_fault" not in json.loads(ClientStatus("c1", "idle").to_bytes())  # older coordinators read it as before
    assert ClientStatus.from_bytes(ClientStatus("c1", "idle", program_fault="pte_corrupt").to_bytes()).program_fault == "pte_corrupt"
    bad = json.loads(ClientStatus("c1", "idle").to_bytes())
    bad["program_fault"] = 7
    with pytest.raises(MessageError, match="program_fault"):
        ClientStatus.from_bytes(json.dumps(bad).encode())


# -- batches ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("b", [1, 7, 8, 32])
def test_training_program_gradients_equal_eager_at_every_batch(programs: Any, b: int) -> None:
    """The batch dimension is exported dynamic (1..train_batch): each batch runs as it is, neither padded nor split."""
    x, y = _data(b, seed=b)
    w = _weights()
    cw = np.array([1.0, 2.0, 0.5, 1.5], np.float32)
    et = make_backend("executorch", SPEC, w, BackendOptions(programs=programs))
    loss_et, g_et = et.top_layer_grads(x, y, PARAM_NAMES, class_weights=cw)
    loss_t, g_t = TorchBackend(SPEC, w).top_layer_grads(x, y, PARAM_NAMES, class_weights=cw)
    assert abs(loss_et - loss_t) <= 1e-5 * max(1.0, abs(loss_t))
    for n in PARAM_NAMES:
        scale = float(np.abs(g_t[n]).max())
        assert float(np.abs(g_et[n] - g_t[n]).max()) <= 1e-5 * scale, n


@pytest.mark.slow
def test_training_batch_above_the_program_bound_is_refused(programs: Any) -> None:
    x, y = _data(33)
    et = make_backend("executorch", SPEC, _weights(), BackendOptions(programs=programs))
    with pytest.raises(ValueError, match="exceeds the training program's limit 32"):
        et.top_layer_grads(x, y, ("out.bias",))


class _Recorder:
    """Wraps the loaded static program and records the batch of every call."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.calls: list[tuple[str, int]] = []

    def run_method(self, method: str, inputs: tuple[Any, ...]) -> Any:
        self.calls.append((method, int(inputs[0].shape[0])))
        return self.inner.run_method(method, inputs)


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 7, 64, 65, 130])
def test_static_program_is_fed_only_its_built_batches(programs: Any, n: int) -> None:
    """Partial chunks are zero-padded to ``infer_batch``; outputs equal the dynamic-batch program's within 1e-4."""
    from edge_client.backends.executorch_rt import ExecuTorchBackend

    x, _ = _data(n, seed=3)
    w = _weights()
    static = make_backend("executorch", SPEC, w, BackendOptions(programs=programs, inference="static"))
    assert isinstance(static, ExecuTorchBackend)
    static._static_program()
    rec = _Recorder(static._static)
    static._static = rec
    got = static.logits(x)
    dynamic_backend = make_backend("executorch", SPEC, w, BackendOptions(programs=programs, inference="inputs"))
    assert isinstance(dynamic_backend, ExecuTorchBackend)
    dynamic = dynamic_backend.logits(x)
    assert got.shape == dynamic.shape == (n, SPEC.n_classes)
    assert float(np.abs(got - dynamic).max()) <= 1e-4 * max(1.0, float(np.abs(dynamic).max()))
    assert rec.calls and all((m, b) in (("forward_1", 1), ("forward_batch", 64)) for m, b in rec.calls)


# -- BR-40: the max-pool backward kernel --------------------------------------------------------------


@pytest.mark.slow
def test_no_program_uses_the_max_pool_backward_kernel(programs: Any) -> None:
    """executorch 1.4.0's portable ``max_pool2d_with_indices_backward`` does not zero its output (pytorch/executorch #21686)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    ops: dict[str, set[str]] = {}
    delegates: dict[str, set[str]] = {}
    for name, path in (("train", programs.train), ("infer", programs.infer), ("infer_static", programs.infer_static)):
        prog = deserialize_pte_binary(path.read_bytes()).program
        ops[name] = {op.name for plan in prog.execution_plan for op in plan.operators}
        delegates[name] = {d.id for plan in prog.execution_plan for d in plan.delegates}
    assert all(not any("max_pool" in o and "backward" in o for o in names) for names in ops.values()), ops
    # Format 2: the conv is an mm per pool offset over columns stacked from slices (no index gather), the pool an
    # element-wise maximum (no amax reduction).
    assert "aten::mm" in ops["train"] and "aten::cat" in ops["train"], ops["train"]
    assert not {"aten::amax", "aten::index", "aten::max_pool2d_with_indices"} & ops["train"], ops["train"]
    assert delegates["train"] == set()  # no backend kernel hides a backward either
    assert delegates["infer_static"] == {"XnnpackBackend"}  # inference only: no backward in it
