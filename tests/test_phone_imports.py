"""The phone-side modules import and decode a received model with torch, safetensors and scipy blocked.

python-for-android has no recipe for PyTorch or for safetensors (a Rust wheel), and scipy's
needs a legacy NDK with gfortran; the phone-side code must not need them. Each check runs
in a fresh interpreter where ``sys.modules[name] = None`` makes ``import name`` fail.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from har_models.wire import codec

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = ("torch", "safetensors", "scipy", "kivy")

PHONE_MODULES = (
    "har_models.wire.codec",
    "har_models.wire.safetensors_np",
    "har_models.wire.topics",
    "har_models.wire.chunking",
    "har_models.wire.messages",
    "har_models.settings",
    "har_models.data.splits",
    "har_models.data.pipeline",
    "har_models.data.resample",
    "har_models.data.anti_alias",
    "har_models.data.clock",
    "har_models.data.timebase",
    "har_models.data.sample_clock",
    "har_models.data.windowing",
    "har_models.data.labels",
    "edge_client.sensors.replay",
    "edge_client.sensors.base",
    "edge_client.sensors.android",
    "edge_client.sensors.mpu6050",
    "edge_client.store",
    "edge_client.window_log",
    "edge_client.recorder",
    "edge_client.power",
    "edge_client.app.controller",
    "edge_client.app.predictor",
    "edge_client.app.service",
    "edge_client.app.history_edits",
    "edge_client.history",
    "edge_client.server_state",
    "edge_client.record_cli",
    "edge_client.trainer",
    "edge_client.ala",
    "edge_client.agent",
    "edge_client.cli",
    "edge_client.backends.factory",
    "edge_client.backends.numpy_ref",
    "har_models.wire.update_meta",
)


def _run_blocked(code: str) -> subprocess.CompletedProcess[str]:
    prelude = f"import sys\nfor name in {BLOCKED!r}:\n    sys.modules[name] = None\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_phone_side_modules_import_without_torch_safetensors_scipy():
    r = _run_blocked(
        f"""
        import importlib
        for m in {PHONE_MODULES!r}:
            importlib.import_module(m)
        for name in {BLOCKED!r}:
            assert sys.modules[name] is None, name  # nothing imported them behind the block
        print("ok")
        """
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_a_received_model_decodes_and_persists_without_torch_or_safetensors(tmp_path):
    rng = np.random.default_rng(4)
    tensors = {
        "conv.weight": rng.standard_normal((8, 6, 16, 1)).astype(np.float32),
        "conv.bias": rng.standard_normal(8).astype(np.float32),
        "out.weight": rng.standard_normal((6, 32)).astype(np.float32),
    }
    env = codec.encode(tensors, kind="model", round=3, arch_version=1, meta={"arch": {"n_classes": 6}})  # the real library
    (tmp_path / "model.bin").write_bytes(env)
    np.savez(tmp_path / "want.npz", **tensors)
    r = _run_blocked(
        f"""
        import numpy as np
        from pathlib import Path
        from har_models.wire import codec
        from har_models.data.labels import HAPT_LABELS
        from edge_client.store import ClientStore
        from edge_client.app.predictor import load_predictor
        folder = Path({str(tmp_path)!r})
        data = (folder / "model.bin").read_bytes()
        env = codec.decode(data)
        want = np.load(folder / "want.npz")
        assert env.kind == "model" and env.round == 3 and env.meta == {{"arch": {{"n_classes": 6}}}}
        assert sorted(env.tensors) == sorted(want.files)
        for k in want.files:
            assert env.tensors[k].dtype == want[k].dtype and np.array_equal(env.tensors[k], want[k]), k
        again = codec.encode(env.tensors, kind="model", round=3, arch_version=1, meta=env.meta)
        assert again == data, "re-encoded bytes differ"
        store = ClientStore(folder / "state", HAPT_LABELS)
        store.save_local_model('{{"n_classes": 6}}', env.tensors)
        arch, back = store.load_local_model()
        assert arch == '{{"n_classes": 6}}' and all(np.array_equal(back[k], want[k]) for k in want.files)
        assert load_predictor(store) is None  # no PyTorch here: the Live screen waits for a numpy/ExecuTorch backend
        print("ok")
        """
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    # The file the torch-free store wrote reads back with the real library.
    from safetensors.numpy import load_file

    back = load_file(str(tmp_path / "state" / "local_model.safetensors"))
    for k, v in tensors.items():
        np.testing.assert_array_equal(back[k], v)


def test_live_predictions_without_pytorch_come_from_the_numpy_reference(tmp_path: Path) -> None:
    """With torch blocked, the Live screen's predictor is the numpy CNN and gives probabilities."""
    code = f"""
import sys
for name in ("torch",):
    sys.modules[name] = None
import numpy as np
from edge_client.app.predictor import load_predictor
from edge_client.backends.numpy_ref import NumpyBackend, init_weights
from edge_client.store import ClientStore
from har_models.nn.arch import ArchSpec
from har_models.data.labels import HAPT_LABELS
spec = ArchSpec(n_classes=6, conv_filters=4, dense_units=8)
store = ClientStore({str(tmp_path / "state")!r}, HAPT_LABELS)
store.save_local_model(spec.to_json(), init_weights(spec, 3))
p = load_predictor(store)
assert isinstance(p, NumpyBackend), type(p)
probs = p.predict(np.random.default_rng(0).normal(size=(5, 6, 128)).astype(np.float32))
assert probs.shape == (5, 6) and np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
print("numpy predictor ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and "numpy predictor ok" in r.stdout, r.stderr
