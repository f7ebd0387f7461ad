"""The status page's SVG charts: coordinates of known points, ticks, the heat map's cells and colours, well-formed XML."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from coordinator.server import charts

NS = {"s": "http://www.w3.org/2000/svg"}


def _a(el: ET.Element, name: str) -> str:
    """Attribute ``name`` of ``el`` (AssertionError if it has none)."""
    v = el.get(name)
    assert v is not None, f"<{el.tag}> has no {name!r}"
    return v


def _text(root: ET.Element, path: str) -> str | None:
    """Text of the first element at ``path`` (AssertionError if there is none)."""
    el = root.find(path, NS)
    assert el is not None, f"no {path}"
    return el.text


def test_scale_and_ticks_have_known_values() -> None:
    assert charts.scale(5, 0, 10, 100, 200) == 150
    assert charts.scale(0.5, 0, 1, 198, 34) == 116  # y grows downwards
    assert charts.scale(3, 3, 3, 0, 10) == 5  # a single value sits in the middle
    assert charts.nice_ticks(0, 1, 6) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert charts.nice_ticks(0, 37, 5) == [0, 10, 20, 30]
    assert charts.nice_ticks(2, 2) == [2]
    with pytest.raises(ValueError, match="finite lo <= hi"):
        charts.nice_ticks(1, 0)


def test_a_line_chart_puts_each_point_where_its_values_say() -> None:
    s = charts.Series("personalisation", [(0, 0.1), (1, 0.5), (2, math.nan), (3, 0.9)])
    svg = charts.line_chart([s], title="Accuracy", x_label="round", y_label="accuracy", y_range=(0, 1), y_format="%")
    root = ET.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg" and root.get("width") == "460" and root.get("height") == "240"
    # plot area: x in [56, 444], y in [34, 198]
    pts = [(c.get("data-x"), c.get("data-y"), float(_a(c, "cx")), float(_a(c, "cy"))) for c in root.iterfind(".//s:circle", NS)]
    assert pts == [("0", "0.1", 56.0, 181.6), ("1", "0.5", 185.33, 116.0), ("3", "0.9", 444.0, 50.4)]
    # the NaN breaks the line: one polyline through rounds 0 and 1; round 3 stands alone
    lines = [p.get("points") for p in root.iterfind(".//s:polyline", NS)]
    assert lines == ["56,181.6 185.33,116"]
    yticks = [t.text for t in root.iterfind(".//s:text[@class='ytick']", NS)]
    assert yticks == ["0%", "20%", "40%", "60%", "80%", "100%"]
    assert [t.text for t in root.iterfind(".//s:text[@class='xtick']", NS)] == ["0", "1", "2", "3"]
    assert _text(root, ".//s:text[@class='xlabel']") == "round"
    assert _text(root, ".//s:text[@class='ylabel']") == "accuracy"


def test_an_automatic_axis_starts_at_zero_and_ends_on_a_tick_above_the_data() -> None:
    svg = charts.line_chart([charts.Series("F", [(0, 8), (1, 37)]), charts.Series("H", [(0, 32), (1, 32)])],
                            title="Widths", x_label="round", y_label="units")  # fmt: skip
    root = ET.fromstring(svg)
    assert [t.text for t in root.iterfind(".//s:text[@class='ytick']", NS)] == ["0", "10", "20", "30", "40"]
    cy = [float(_a(c, "cy")) for c in root.iterfind(".//s:circle", NS)]
    assert cy[1] == pytest.approx(198 - 37 / 40 * 164, abs=0.01)
    assert [g.get("data-name") for g in root.iterfind(".//s:g[@class='series']", NS)] == ["F", "H"]
    assert len(root.findall(".//s:g[@class='legend']", NS)) == 2


def test_text_is_escaped_and_an_empty_chart_says_so() -> None:
    root = ET.fromstring(charts.line_chart([charts.Series("a<b", [(0, None)])], title="<script>&", x_label="x", y_label="y"))
    assert _text(root, ".//s:text[@class='title']") == "<script>&"
    assert _text(root, ".//s:text[@class='empty']") == "no data yet"
    with pytest.raises(ValueError, match="at least 160x120"):
        charts.line_chart([], title="t", x_label="x", y_label="y", width=100)
    with pytest.raises(ValueError, match="at most 8 fit"):
        charts.line_chart([charts.Series(str(i), []) for i in range(9)], title="t", x_label="x", y_label="y")


def test_the_heat_map_has_one_cell_per_entry_coloured_by_value() -> None:
    p = [[0.75, 0.25, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]
    root = ET.fromstring(charts.heat_map(p, ["a", "b", "c"], title="p_ij"))
    cells = root.findall(".//s:rect[@class='cell']", NS)
    assert len(cells) == 9
    by_ij = {(int(_a(c, "data-i")), int(_a(c, "data-j"))): c for c in cells}
    assert by_ij[(2, 2)].get("fill") == "rgb(8,48,107)"  # 1: dark blue
    assert by_ij[(0, 2)].get("fill") == "rgb(247,251,255)"  # 0: white
    assert by_ij[(0, 1)].get("fill") == "rgb(187,200,218)"  # 0.25: a quarter of the way
    assert by_ij[(1, 0)].get("data-value") == "0.5"
    assert float(_a(by_ij[(0, 1)], "x")) - float(_a(by_ij[(0, 0)], "x")) == 28  # columns one cell apart
    assert [t.text for t in root.iterfind(".//s:text[@class='row']", NS)] == ["a", "b", "c"]
    assert charts.heat_colour(math.nan) == "rgb(204,204,204)" and charts.heat_colour(7) == "rgb(8,48,107)"
    with pytest.raises(ValueError, match="must be 2 x 2"):
        charts.heat_map([[1.0]], ["a", "b"], title="t")
