"""Line charts as inline SVG: drawn on the server, no script, nothing fetched.

`line_chart(series, ...)` draws one line per named series of (epoch seconds, value) points
over a shared time axis, with a few labelled gridlines, the latest value of each series
in the legend, and `data-` attributes stating what is drawn (the browser tests read them).
"""

from __future__ import annotations

import math
import time
from html import escape

from markupsafe import Markup

# colour-blind-safe qualitative palette (Okabe-Ito), as presentation attributes: the page's
# content security policy allows no inline style
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")

Series = dict[str, list[tuple[float, float]]]


def _nice_ceiling(value: float) -> float:
    """1, 2 or 5 times a power of ten, at least `value` (and at least 1)."""
    if value <= 1:
        return 1.0
    exp = math.floor(math.log10(value))
    for m in (1, 2, 5, 10):
        if m * 10**exp >= value:
            return float(m * 10**exp)
    return float(10 ** (exp + 1))  # pragma: no cover


def _fmt(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    if value >= 100 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.1f}"


def line_chart(
    series: Series, *, title: str, unit: str, chart_id: str, width: int = 420, height: int = 200
) -> Markup:
    left, right, top, bottom = 40, 10, 28, 24
    plot_w, plot_h = width - left - right, height - top - bottom
    points = [p for values in series.values() for p in values]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="{escape(chart_id)}" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{escape(title)}" data-series="{len(series)}" '
        f'data-points="{len(points)}">',
        f"<title>{escape(title)}</title>",
        f'<text x="4" y="15" class="chart-title" font-size="13" font-weight="600" '
        f'fill="#222">{escape(title)} <tspan font-weight="400" fill="#666">'
        f"({escape(unit)})</tspan></text>",
    ]
    if len(points) < 2:
        out.append(
            f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" '
            f'font-size="12" fill="#777">'
            f"{'collecting samples…' if series else 'nothing to draw yet'}</text></svg>"
        )
        return Markup("".join(out))
    t0 = min(t for t, _ in points)
    t1 = max(t for t, _ in points)
    span = max(t1 - t0, 1.0)
    top_value = _nice_ceiling(max(v for _, v in points))

    def x(t: float) -> float:
        return left + (t - t0) / span * plot_w

    def y(v: float) -> float:
        return top + plot_h - v / top_value * plot_h

    for i in range(5):  # horizontal gridlines with values
        v = top_value * i / 4
        out.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
            f'stroke="#e3e3e3" stroke-width="1"/>'
        )
        out.append(
            f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end" '
            f'font-size="10" fill="#666">{_fmt(v)}</text>'
        )
    for i in range(4):  # time labels
        t = t0 + span * i / 3
        label = time.strftime("%H:%M:%S", time.gmtime(t))
        anchor = "start" if i == 0 else "end" if i == 3 else "middle"
        out.append(
            f'<text x="{x(t):.1f}" y="{height - 8}" text-anchor="{anchor}" '
            f'font-size="10" fill="#666">{label}</text>'
        )
    legend_y = top + 12
    for n, (name, values) in enumerate(sorted(series.items())):
        colour = PALETTE[n % len(PALETTE)]
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in values)
        last = values[-1][1] if values else 0.0
        out.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" '
            f'points="{path}" data-name="{escape(name)}" data-last="{last:g}"/>'
        )
        out.append(
            f'<text x="{left + plot_w - 4}" y="{legend_y + 14 * n}" text-anchor="end" '
            f'font-size="11" fill="{colour}">{escape(name)} {_fmt(last)}</text>'
        )
    out.append("</svg>")
    return Markup("".join(out))
