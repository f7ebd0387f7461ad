"""The app's agent trains with the backend fedhar-client would choose: numpy on a device without PyTorch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_app_agent_takes_numpy_when_torch_is_absent(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None
        import logging
        logging.basicConfig(level=logging.INFO)
        from pathlib import Path
        import numpy as np
        from edge_client.app.controller import AppConfig, DeviceController
        from edge_client.sensors.factory import make_source
        from har_models.data.labels import HAPT_LABELS
        from har_models.data.windowing import WindowSet

        folder = Path({str(tmp_path)!r})
        source = make_source("replay:hapt:{ROOT / 'datasets/hapt/user01.npz'}", HAPT_LABELS, speed=None)
        cfg = AppConfig(state_dir=folder, labels=HAPT_LABELS, client_id="phone-1", broker="127.0.0.1:9")  # nobody listens there
        ctl = DeviceController(cfg, source, charging=lambda: False, supervise_s=60)
        rng = np.random.default_rng(0)
        ctl.window_log.append(WindowSet(rng.normal(size=(40, 6, 128)).astype(np.float32), np.arange(40) % 6, HAPT_LABELS))
        ctl._start_agent()
        try:
            print(ctl._agent.cfg.backend, ctl._agent.trainer.backend_name)
        finally:
            ctl.close()
        assert sys.modules["torch"] is None
        """
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["numpy", "numpy"], r.stdout
    assert "training backend: numpy (best installed; torch: torch not installed" in r.stderr
