"""``acp-lite bench --plot FILE``: a chart of a measurement, as SVG written by hand (no plotting
library needed), or as PNG when FILE ends in ``.png``, drawn by matplotlib (not a dependency:
without it a ``.png`` is a usage error before the run, which says to install it or write SVG).

Two panels side by side: the update rate of each turn (bars, in turn order), and the latency
distribution (each turn's duration and each round trip, sorted: a percentile curve, so that the
median, p90 and p99 are read off the horizontal axis). Everything shown in the SVG is escaped; the
size is fixed whatever the number of turns.
"""

import argparse
import importlib
import io
from typing import Any, Dict, List, Sequence, Tuple
from xml.sax.saxutils import escape

from .argtypes import writable_file

_WIDTH, _HEIGHT = 960, 360
_PANEL = 440  # width of one panel
_TOP, _BOTTOM, _LEFT = 40, 300, 60


def plot_file(text: str) -> str:
    """``--plot``'s ``argparse`` type: a ``writable_file``, and for a ``.png`` an importable
    matplotlib, so that no run starts for a chart that cannot be drawn."""
    path = writable_file(text)
    if _is_png(path):
        try:
            importlib.import_module("matplotlib")
        except ImportError:
            raise argparse.ArgumentTypeError(
                f"{text}: a PNG chart needs matplotlib (pip install matplotlib); without it, write SVG: "
                f"--plot {text[:-4]}.svg"
            ) from None
    return path


def agent_report_chart(report: Dict[str, Any], path: str) -> bytes:
    """The chart of ``measure_agent``'s report, in the format ``path`` names (see ``plot_file``)."""
    return _agent_report_png(report) if _is_png(path) else agent_report_svg(report).encode()


def _is_png(path: str) -> bool:
    return path.lower().endswith(".png")


def agent_report_svg(report: Dict[str, Any]) -> str:
    """The chart of ``measure_agent``'s report, as SVG."""
    turns = report["turns"]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" '
        f'viewBox="0 0 {_WIDTH} {_HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{_WIDTH}" height="{_HEIGHT}" fill="white"/>',
        f'<text x="{_WIDTH // 2}" y="20" text-anchor="middle" font-size="14">{escape(_title(report))}</text>',
    ]
    parts += _rate_bars([turn["updates_per_s"] or 0.0 for turn in turns], _LEFT)
    parts += _percentile_curves(_latencies(report), _LEFT + _PANEL + 40)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _agent_report_png(report: Dict[str, Any]) -> bytes:
    """The same chart, drawn by matplotlib (on a ``Figure`` of its own: no pyplot, no global
    state, no display needed)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(_WIDTH / 100, _HEIGHT / 100), dpi=100, layout="constrained")
    figure.suptitle(_title(report))
    bars, curves = figure.subplots(1, 2)
    rates = [turn["updates_per_s"] or 0.0 for turn in report["turns"]]
    bars.bar(range(1, len(rates) + 1), rates, color="#27ae60")
    bars.set(title="update rate per turn", xlabel="turn", ylabel="updates/s")
    bars.xaxis.set_major_locator(MaxNLocator(integer=True))  # turns are counted, not measured
    for mark in (50, 90, 99):
        curves.axvline(mark, color="#bbb", linestyle="--", linewidth=1)
    for label, values, colour in _latencies(report):
        ordered = sorted(values)
        curves.plot([100 * (i + 1) / len(ordered) for i in range(len(ordered))], ordered, color=colour, label=label)
    curves.set(title="latency distribution", xlabel="percentile (50, 90, 99 marked)", ylabel="ms", xlim=(0, 100))
    curves.legend(loc="upper left")
    png = io.BytesIO()
    figure.savefig(png, format="png")
    return png.getvalue()


def _title(report: Dict[str, Any]) -> str:
    name = report["agent"]["name"] if report.get("agent") else "agent"
    return f"acp-lite bench: {name}, {len(report['turns'])} turn(s)"


def _latencies(report: Dict[str, Any]) -> List[Tuple[str, List[float], str]]:
    """The latency curves: (label, values in ms, colour)."""
    curves = [("turn duration", [turn["duration_ms"] for turn in report["turns"]], "#c0392b")]
    round_trips_ms = report["round_trip_ms"].get("samples")
    if round_trips_ms:
        curves.append(("round trip", list(round_trips_ms), "#2471a3"))
    return curves


def _axes(left: int, title: str, x_label: str, y_label: str, y_max: float) -> List[str]:
    right = left + _PANEL - 40
    return [
        f'<text x="{left + (_PANEL - 40) // 2}" y="{_TOP - 6}" text-anchor="middle">{escape(title)}</text>',
        f'<line x1="{left}" y1="{_BOTTOM}" x2="{right}" y2="{_BOTTOM}" stroke="black"/>',
        f'<line x1="{left}" y1="{_TOP}" x2="{left}" y2="{_BOTTOM}" stroke="black"/>',
        f'<text x="{left + (_PANEL - 40) // 2}" y="{_BOTTOM + 32}" text-anchor="middle">{escape(x_label)}</text>',
        f'<text x="{left - 6}" y="{_TOP + 4}" text-anchor="end">{_number(y_max)}</text>',
        f'<text x="{left - 6}" y="{_BOTTOM}" text-anchor="end">0</text>',
        f'<text x="{left - 45}" y="{(_TOP + _BOTTOM) // 2}" transform="rotate(-90 {left - 45} '
        f'{(_TOP + _BOTTOM) // 2})" text-anchor="middle">{escape(y_label)}</text>',
    ]


def _rate_bars(rates: Sequence[float], left: int) -> List[str]:
    top = max(rates, default=0.0) or 1.0
    parts = _axes(left, "update rate per turn", "turn", "updates/s", top)
    width = (_PANEL - 40) / max(1, len(rates))
    for index, rate in enumerate(rates):
        height = (_BOTTOM - _TOP) * rate / top
        parts.append(
            f'<rect x="{left + index * width + width * 0.1:.1f}" y="{_BOTTOM - height:.1f}" '
            f'width="{width * 0.8:.1f}" height="{height:.1f}" fill="#27ae60">'
            f"<title>turn {index + 1}: {rate:,.0f} updates/s</title></rect>"
        )
    return parts


def _percentile_curves(curves: List[Tuple[str, List[float], str]], left: int) -> List[str]:
    top = max((max(values) for _, values, _ in curves if values), default=0.0) or 1.0
    parts = _axes(left, "latency distribution", "percentile (50, 90, 99 marked)", "ms", top)
    span = _PANEL - 40
    for mark in (50, 90, 99):
        x = left + span * mark / 100
        parts.append(f'<line x1="{x:.1f}" y1="{_TOP}" x2="{x:.1f}" y2="{_BOTTOM}" stroke="#bbb" stroke-dasharray="3"/>')
        parts.append(f'<text x="{x:.1f}" y="{_BOTTOM + 14}" text-anchor="middle">p{mark}</text>')
    for row, (label, values, colour) in enumerate(curves):
        ordered = sorted(values)
        points = " ".join(
            f"{left + span * (i + 1) / len(ordered):.1f},{_BOTTOM - (_BOTTOM - _TOP) * value / top:.1f}"
            for i, value in enumerate(ordered)
        )
        if points:
            parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        parts.append(f'<text x="{left + 10}" y="{_TOP + 14 + 14 * row}" fill="{colour}">{escape(label)}</text>')
    return parts


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"
