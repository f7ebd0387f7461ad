"""Anti-alias filter taps for the 50 Hz grid: scipy's design, shipped as data in ``anti_alias_taps.json``.

One entry per oversampling factor M that :func:`har_models.data.anti_alias.anti_alias_factor` can
choose for a 20 ms grid (the divisors of 20,000,000 in 2..32), so a device without scipy filters bit
for bit as a machine with it. tests/test_resample.py checks the file against scipy's design and
against its generator. Regenerate with::

    python -c "from har_models.data.anti_alias import write_anti_alias_table; write_anti_alias_table()"
"""

import json
from pathlib import Path

_TABLE = json.loads(Path(__file__).with_name("anti_alias_taps.json").read_text())

TAPS_PERIOD_NS: int = int(_TABLE["period_ns"])
"""Grid period the table is for, ns (50 Hz)."""

TAPS_20MS: dict[int, tuple[float, ...]] = {int(m): tuple(float(v) for v in taps) for m, taps in _TABLE["taps"].items()}
"""Factor M -> taps (odd length, symmetric, DC gain 1), float64 values."""
