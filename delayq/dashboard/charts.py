"""Small inline SVG charts, drawn here (no chart library, nothing fetched by the browser).

Every text that ends up in the markup is escaped; numbers are formatted by us.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

__all__ = ["Series", "bar_chart", "line_chart"]

_W, _H = 420, 120  # viewBox; the SVG scales to its box
_PAD_L, _PAD_R, _PAD_T, _PAD_B = 38, 6, 8, 18


@dataclass(frozen=True, slots=True)
class Series:
    """One line of a chart."""

    label: str
    css: str  # class name: colour comes from the stylesheet
    values: Sequence[float | None]  # None: no data (a gap)
    bars: bool = False  # stacked bars instead of a line


def _num(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.1f}"
    return f"{value:.2g}"


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    magnitude = 10 ** len(str(int(value))) / 10 if value >= 1 else 1.0
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return value


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    unit: str = "",
    start_label: str = "",
    end_label: str = "now",
    point_labels: Sequence[str] = (),
) -> Markup:
    """A line chart of equally spaced points; hovering a column shows its values."""
    n = max((len(s.values) for s in series), default=0)
    stacked = [
        sum((s.values[i] or 0.0) for s in series if s.bars and i < len(s.values)) for i in range(n)
    ]
    top = _nice_max(
        max([v for s in series if not s.bars for v in s.values if v is not None] + stacked + [0.0])
    )
    plot_w, plot_h = _W - _PAD_L - _PAD_R, _H - _PAD_T - _PAD_B

    def x(i: int) -> float:
        return _PAD_L + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

    def y(v: float) -> float:
        return _PAD_T + plot_h * (1 - v / top)

    out = [
        f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
    ]
    for frac in (0, 0.5, 1):
        gy = _PAD_T + plot_h * frac
        out.append(
            f'<line class="grid" x1="{_PAD_L}" x2="{_W - _PAD_R}" y1="{gy:.1f}" y2="{gy:.1f}"/>'
        )
        label = _num(top * (1 - frac)) + (unit if frac == 0 else "")
        out.append(
            f'<text class="axis" x="{_PAD_L - 3}" y="{gy + 3:.1f}" text-anchor="end">{escape(label)}</text>'
        )
    base = [0.0] * n
    bar_w = max(0.6, plot_w / max(n, 1) * 0.75)
    for s in series:
        if not s.bars:
            continue
        for i, v in enumerate(s.values):
            if v:
                y0, y1 = y(base[i]), y(base[i] + v)
                out.append(
                    f'<rect class="{escape(s.css)}" x="{x(i) - bar_w / 2:.1f}" y="{y1:.1f}" '
                    f'width="{bar_w:.1f}" height="{max(0.6, y0 - y1):.1f}"/>'
                )
                base[i] += v
    for s in series:
        if s.bars:
            continue
        segment: list[str] = []
        segments: list[list[str]] = []
        for i, v in enumerate(s.values):
            if v is None:
                if segment:
                    segments.append(segment)
                segment = []
            else:
                segment.append(f"{x(i):.1f},{y(v):.1f}")
        if segment:
            segments.append(segment)
        for seg in segments:
            if len(seg) == 1:
                cx, cy = seg[0].split(",")
                out.append(f'<circle class="{escape(s.css)}" cx="{cx}" cy="{cy}" r="1.8"/>')
            else:
                out.append(f'<polyline class="{escape(s.css)}" points="{" ".join(seg)}"/>')
    # hover targets: one transparent column per point with its values as a tooltip
    if n:
        col = plot_w / n
        for i in range(n):
            parts = [point_labels[i]] if i < len(point_labels) else []
            for s in series:
                v = s.values[i] if i < len(s.values) else None
                parts.append(f"{s.label}: {'–' if v is None else _num(v) + unit}")
            left = max(_PAD_L, x(i) - col / 2)
            out.append(
                f'<rect class="hover" x="{left:.1f}" y="{_PAD_T}" width="{col:.1f}" '
                f'height="{plot_h}"><title>{escape(" · ".join(parts))}</title></rect>'
            )
    out.append(f'<text class="axis" x="{_PAD_L}" y="{_H - 3}">{escape(start_label)}</text>')
    out.append(
        f'<text class="axis" x="{_W - _PAD_R}" y="{_H - 3}" text-anchor="end">{escape(end_label)}</text>'
    )
    out.append("</svg>")
    return Markup("".join(out))


def bar_chart(bars: Sequence[tuple[str, int]], *, title: str) -> Markup:
    """Labelled horizontal bars (the due-time histogram)."""
    top = max((v for _, v in bars), default=0) or 1
    row, label_w, count_w = 22, 92, 70
    height = row * len(bars) + 4
    bar_w = _W - label_w - count_w
    out = [
        f'<svg class="bars" viewBox="0 0 {_W} {height}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
    ]
    for i, (label, value) in enumerate(bars):
        y = 2 + i * row
        w = max(1.0 if value else 0.0, bar_w * value / top)
        out.append(
            f'<text class="axis" x="{label_w - 6}" y="{y + 14}" text-anchor="end">{escape(label)}</text>'
        )
        out.append(
            f'<rect class="bar" x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row - 8}"><title>{escape(label)}: {value:,}</title></rect>'
        )
        out.append(f'<text class="count" x="{label_w + w + 4:.1f}" y="{y + 14}">{value:,}</text>')
    out.append("</svg>")
    return Markup("".join(out))
