"""Turning per-run measurements into the published figures: statistics, targets, JSON, markdown.

Stdlib only. A *series* is one value per run, ``None`` where that run failed; every statistic is
the median, min and max of a series, and a ratio is computed run by run (run i of the numerator
over run i of the denominator) before its statistics are taken, so that both sides of a ratio
always come from the same moment of the same run.
"""

import json
import statistics
from pathlib import Path
from typing import Dict, List, Optional, Sequence


def summary(series: Sequence[Optional[float]]) -> Optional[Dict[str, float]]:
    values = [v for v in series if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def pairwise(op: str, a: Sequence[Optional[float]], b: Sequence[Optional[float]]) -> List[Optional[float]]:
    """``a[i] / b[i]`` or ``a[i] - b[i]`` run by run; None where either side is missing."""
    out = []
    for x, y in zip(a, b):
        if x is None or y is None or (op == "/" and y == 0):
            out.append(None)
        else:
            out.append(x / y if op == "/" else x - y)
    return out


class Target:
    """One promise of the issue: a figure or a run-by-run comparison, held against a bound.

    ``left`` and ``right`` are figure keys ``(workload, subject, metric)``; with ``right`` None
    the target is on the figure itself. ``op`` is "/" or "-"; ``at_least`` says which way the
    bound goes.
    """

    def __init__(
        self,
        workload: str,
        text: str,
        left: tuple,
        bound: float,
        *,
        right: Optional[tuple] = None,
        op: str = "/",
        at_least: bool = True,
    ):
        self.workload, self.text, self.left, self.right = workload, text, left, right
        self.bound, self.op, self.at_least = bound, op, at_least

    def evaluate(self, figures: Dict[tuple, List[Optional[float]]]) -> dict:
        if self.left not in figures or (self.right is not None and self.right not in figures):
            return {"workload": self.workload, "target": self.text, "measured": None, "met": None}
        series = (
            figures[self.left] if self.right is None else pairwise(self.op, figures[self.left], figures[self.right])
        )
        stats = summary(series)
        met = None
        if stats is not None:
            met = stats["median"] >= self.bound if self.at_least else stats["median"] <= self.bound
        return {
            "workload": self.workload,
            "target": self.text,
            "bound": self.bound,
            "runs": series,
            "measured": stats,
            "met": met,
        }


def results_document(
    meta: dict, plan: dict, figures: Dict[tuple, List[Optional[float]]], targets: List[Target]
) -> dict:
    doc = {
        "meta": meta,
        "plan": plan,
        "figures": [
            {"workload": w, "subject": s, "metric": m, "runs": series, "summary": summary(series)}
            for (w, s, m), series in figures.items()
        ],
        "targets": [t.evaluate(figures) for t in targets],
    }
    if meta.get("baseline"):
        doc["before_after"] = before_after(figures, f"acp_lite@{meta['baseline']}")
    return doc


def before_after(figures: Dict[tuple, List[Optional[float]]], baseline: str) -> List[dict]:
    """Each figure of acp_lite over the same figure of ``baseline`` (a subject named like it, with
    ``acp_lite`` replaced), run by run."""
    out = []
    for (w, s, m), series in figures.items():
        if not s.startswith(baseline):
            continue
        today = (w, "acp_lite" + s[len(baseline) :], m)
        if today in figures:
            ratios = pairwise("/", figures[today], series)
            out.append({"workload": w, "subject": today[1], "metric": m, "runs": ratios, "summary": summary(ratios)})
    return out


def _fmt(value: Optional[float]) -> str:
    if value is None:
        return "–"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


WORKLOAD_TITLES = {
    "A": "A. Client receive (a turn of session/update notifications from the replay agent; the ceilings are "
    "bare readers of the same stream)",
    "B": "B. Agent send (the agent under test streams a turn to a bare line reader)",
    "C": "C. Round trip (extension request client → agent of the same SDK)",
    "D": "D. Paced stream latency (send → session_update callback; each agent to its own client, and to a bare reader)",
    "E": "E. Cost growth (acp_lite)",
    "F": "F. Each SDK's agent measured by `acp-lite bench` (start-up, round trip, one turn)",
}


def markdown(doc: dict) -> str:
    meta, plan = doc["meta"], doc["plan"]
    lines = [
        f"# Benchmark results: {meta['name']}",
        "",
        f"{meta['started_utc']} · {meta['machine']} · Python {meta['python']} · "
        f"acp_lite {meta['versions'].get('acp_lite')} (commit {meta['commit']}) · "
        + " · ".join(f"{k} {v}" for k, v in meta["versions"].items() if k != "acp_lite"),
        "",
        f"Load average (1 min) {meta['load_average_at_start'][0]:.2f} at the start, "
        f"{meta['load_average_at_end'][0]:.2f} at the end; anything "
        "else running shows up as spread between runs.",
        "",
        f"Median (min–max) over {plan['runs']} runs; ratios are taken run by run. "
        f"A, B: {plan['updates']:,} updates per turn; C: {plan['requests']:,} requests; "
        f"D: turns of {plan['paced_seconds']:g} s at "
        + " and ".join(f"{r:,}" for r in plan["rates"])
        + " updates/s; E: "
        + ", ".join(f"{n:,} updates of {size} B" for size, n in plan["sizes"].items())
        + f", {plan['sessions']} sessions sharing {plan['updates']:,} updates, "
        f"{plan['flat'][0]:,} vs {plan['flat'][1]:,} updates for memory; F: a turn of "
        f"{plan['requests']:,} updates.",
        "",
    ]
    for workload in "ABCDEF":
        rows = [f for f in doc["figures"] if f["workload"] == workload]
        if not rows:
            continue
        lines += [
            f"## {WORKLOAD_TITLES[workload]}",
            "",
            "| subject | metric | median | min | max |",
            "| --- | --- | ---: | ---: | ---: |",
        ]
        for f in rows:
            s = f["summary"] or {}
            lines.append(
                f"| {f['subject']} | {f['metric']} | {_fmt(s.get('median'))} | {_fmt(s.get('min'))} "
                f"| {_fmt(s.get('max'))} |"
            )
        lines.append("")
    if doc.get("before_after"):
        lines += [
            f"## acp_lite / acp_lite@{doc['meta']['baseline']} (run by run)",
            "",
            "| workload | subject | metric | median | min | max |",
            "| --- | --- | --- | ---: | ---: | ---: |",
        ]
        for f in doc["before_after"]:
            s = f["summary"] or {}
            lines.append(
                f"| {f['workload']} | {f['subject']} | {f['metric']} | {_fmt(s.get('median'))} "
                f"| {_fmt(s.get('min'))} | {_fmt(s.get('max'))} |"
            )
        lines.append("")
    lines += [
        "## Targets (issues 6 and 17)",
        "",
        "| workload | target | measured median (min–max) | met |",
        "| --- | --- | ---: | :---: |",
    ]
    for t in doc["targets"]:
        s = t["measured"]
        measured = "not measured" if s is None else f"{_fmt(s['median'])} ({_fmt(s['min'])}–{_fmt(s['max'])})"
        verdict = {True: "yes", False: "**no**", None: "–"}[t["met"]]
        lines.append(f"| {t['workload']} | {t['target']} | {measured} | {verdict} |")
    return "\n".join(lines) + "\n"


def write(doc: dict, out_dir: Path, name: str) -> List[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{name}.json", out_dir / f"{name}.md"
    json_path.write_text(json.dumps(doc, indent=1) + "\n")
    md_path.write_text(markdown(doc))
    return [json_path, md_path]
