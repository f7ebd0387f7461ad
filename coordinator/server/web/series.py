"""The status page's per-round charts, folded one round record at a time into bounded sketches.

Each line is a :class:`coordinator.server.charts.Sketch` of at most
:data:`coordinator.server.charts.MAX_POINTS` buckets, so drawing the charts costs the same at
round 100 as at round 100,000, and adding a round is O(1).

The quality charts carry three lines per measure, drawn against the round that made each model:

* ``shared model`` — the devices' start measure (:attr:`coordinator.record.Evaluation.start`): every
  device measures the model it received on its own test windows before it trains, so round r's
  start figures are the quality of round r - 1's shared version, drawn at r - 1; this is what the
  quality guard judges;
* ``global`` — the global model on a union test set (only where one exists: a simulation);
* ``personalisation`` — each device's trained model on its own test windows (mean over devices).
"""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.record import RoundRecord
from coordinator.server import charts

QUALITY_LINES = (("shared model", "start"), ("global", "global"), ("personalisation", "personalisation"))
"""The quality charts' lines: (legend name, record measure)."""


class RoundSeries:
    """The page's chart series (module docstring)."""

    LINES = (*(f"{k}.{m}" for k in ("acc", "f1") for _, m in QUALITY_LINES), "up", "down", "seconds", "F", "H")

    def __init__(self) -> None:
        self.lines = {k: charts.Sketch() for k in self.LINES}
        self.feddwa: RoundRecord | None = None

    def add(self, r: RoundRecord) -> None:
        """Fold the newest completed round ``r``."""
        for _, measure in QUALITY_LINES:
            m = r.measure(measure)
            x = r.round - 1 if measure == "start" else r.round  # a start measure judges the version before
            if measure == "start" and x < 0:
                continue  # round 0's start measure is the initial model's, made by no round
            self.lines[f"acc.{measure}"].add(x, m.accuracy if m is not None else None)
            self.lines[f"f1.{measure}"].add(x, m.macro_f1 if m is not None else None)
        self.lines["up"].add(r.round, r.traffic.bytes_up / 1e6 if r.traffic else None)
        self.lines["down"].add(r.round, r.traffic.bytes_down / 1e6 if r.traffic else None)
        self.lines["seconds"].add(r.round, r.seconds)
        self.lines["F"].add(r.round, r.arch.conv_filters)
        self.lines["H"].add(r.round, r.arch.dense_units)
        if r.feddwa_weights is not None:
            self.feddwa = r

    def draw(self) -> list[str]:
        """The charts (SVG text): accuracy, macro-F1, bytes, duration, widths, and FedDWA's p_ij of the latest round that has them."""

        def S(name: str, key: str) -> charts.BucketSeries:  # noqa: N802
            return charts.BucketSeries(name, self.lines[key].buckets())

        out = [
            charts.line_chart([S(name, f"{key}.{m}") for name, m in QUALITY_LINES], title=title, x_label="round of the version",
                              y_label=label, y_range=(0, 1), y_format="%")
            for key, title, label in (("acc", "Accuracy", "accuracy"), ("f1", "Macro-F1", "macro-F1"))
        ]  # fmt: skip
        out += [
            charts.line_chart([S("up", "up"), S("down", "down")], title="Traffic per round", x_label="round", y_label="MB"),
            charts.line_chart([S("duration", "seconds")], title="Round duration", x_label="round", y_label="seconds"),
            charts.line_chart([S("conv filters F", "F"), S("dense units H", "H")],
                              title="Architecture widths", x_label="round", y_label="units"),
        ]  # fmt: skip
        if self.feddwa is not None and (w := self.feddwa.feddwa_weights) is not None:
            out.append(charts.heat_map(w.p, w.clients, title=f"FedDWA weights p_ij, round {self.feddwa.round}"))
        return out


def round_charts(recs: Sequence[RoundRecord]) -> list[str]:
    """The page's per-round charts (SVG text) of ``recs`` (:meth:`RoundSeries.draw`)."""
    series = RoundSeries()
    for r in recs:
        series.add(r)
    return series.draw()
