"""A small line chart of the device's start and personalised macro-F1 over rounds, drawn on Kivy's canvas."""

from __future__ import annotations

from typing import Any

from kivy.graphics import Color, Line, Rectangle
from kivy.metrics import dp
from kivy.uix.widget import Widget

START_COLOUR = (0.45, 0.65, 0.95, 1)
"""The start measure's line: the shared model as this device starts from it."""
PERSONAL_COLOUR = (0.35, 0.85, 0.45, 1)
"""The personalised model's line: after training on this device."""


class CurveChart(Widget):
    """Two curves over rounds on a 0..100 % scale, grid lines at 25 % steps; a round without a value leaves a gap."""

    def __init__(self, **kw: Any):
        super().__init__(size_hint_y=None, height=dp(140), **kw)
        self.points: list[tuple[int, float | None, float | None]] = []
        self.bind(pos=lambda *_: self.draw(), size=lambda *_: self.draw())

    def set(self, points: list[tuple[int, float | None, float | None]]) -> None:
        """Show ``(round, start F1, personalised F1)`` per round (:func:`edge_client.history.f1_curve`), oldest first."""
        self.points = list(points)
        self.draw()

    def _xy(self, i: int, v: float) -> tuple[float, float]:
        n = max(1, len(self.points) - 1)
        pad = dp(6)
        return self.x + pad + (self.width - 2 * pad) * i / n, self.y + pad + (self.height - 2 * pad) * v

    def draw(self) -> None:
        self.canvas.clear()
        with self.canvas:
            Color(0.16, 0.16, 0.18, 1)
            Rectangle(pos=self.pos, size=self.size)
            Color(0.35, 0.35, 0.38, 1)
            for q in (0.0, 0.25, 0.5, 0.75, 1.0):
                y = self._xy(0, q)[1]
                Line(points=[self.x, y, self.right, y], width=1)
            for k, colour in ((1, START_COLOUR), (2, PERSONAL_COLOUR)):
                Color(*colour)
                run: list[float] = []
                for i, p in enumerate(self.points):
                    v = p[k]
                    if v is None:  # a gap: draw what came before it
                        if len(run) >= 4:
                            Line(points=run, width=dp(1.5))
                        run = []
                        continue
                    run += list(self._xy(i, float(v)))
                if len(run) >= 4:
                    Line(points=run, width=dp(1.5))
                elif len(run) == 2:  # a single round: a dot
                    Rectangle(pos=(run[0] - dp(2), run[1] - dp(2)), size=(dp(4), dp(4)))
