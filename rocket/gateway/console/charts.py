"""Charts of rates over the last hour as inline SVG, rendered on the server (pure): no script, no assets."""

from __future__ import annotations

import html

WIDTH, HEIGHT = 560, 150
LEFT, RIGHT, TOP, BOTTOM = 64, 10, 22, 22  # the plot's margins


def number(value: float) -> str:
    """A rate's label: 0, 0.25, 12.5, 1.2k, 3.4M, 5.6G."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.2f}".rstrip("0").rstrip(".") if value < 100 else f"{value:.0f}"


def line_chart(title: str, unit: str, points: list[tuple[int, float]], now_ms: int, window_ms: int = 3_600_000,
               empty: str = "no points yet") -> str:
    """An SVG line chart of (wall_ms, value) points over the window that ends at now_ms; the y axis from 0 to the
    highest value. data-points and data-max say what it drew (tests and scrapers read them)."""
    shown = [(at, value) for at, value in points if now_ms - window_ms <= at <= now_ms]
    top = max((value for _, value in shown), default=0.0)
    scale = top if top > 0 else 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(at: int) -> float:
        return LEFT + plot_w * (1 - (now_ms - at) / window_ms)

    def y(value: float) -> float:
        return TOP + plot_h * (1 - value / scale)

    parts = [f'<svg class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
             f'data-points="{len(shown)}" data-max="{top:g}" xmlns="http://www.w3.org/2000/svg">',
             f"<title>{html.escape(title)}</title>",
             f'<text class="title" x="{LEFT}" y="14">{html.escape(title)} ({html.escape(unit)})</text>',
             f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}"/>',
             f'<text class="axis" x="{LEFT - 6}" y="{TOP + 4}" text-anchor="end">{number(top)}</text>',
             f'<text class="axis" x="{LEFT - 6}" y="{TOP + plot_h}" text-anchor="end">0</text>']
    for minutes in (60, 45, 30, 15, 0):
        at = LEFT + plot_w * (1 - minutes * 60_000 / window_ms)
        label = "now" if minutes == 0 else f"-{minutes} min"
        parts.append(f'<line class="grid" x1="{at:.1f}" y1="{TOP}" x2="{at:.1f}" y2="{TOP + plot_h}"/>'
                     f'<text class="axis" x="{at:.1f}" y="{HEIGHT - 6}" text-anchor="middle">{label}</text>')
    if len(shown) >= 2:
        line = " ".join(f"{x(at):.1f},{y(value):.1f}" for at, value in shown)
        area = f"{x(shown[0][0]):.1f},{TOP + plot_h} {line} {x(shown[-1][0]):.1f},{TOP + plot_h}"
        parts.append(f'<polygon class="area" points="{area}"/><polyline class="line" points="{line}"/>')
    else:
        parts.append(f'<text class="empty" x="{LEFT + plot_w / 2:.1f}" y="{TOP + plot_h / 2:.1f}" '
                     f'text-anchor="middle">{html.escape(empty)}</text>')
    parts.append("</svg>")
    return "".join(parts)
