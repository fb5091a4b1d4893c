"""Draw the throughput chart of a results file: python chart.py RESULTS.json OUT.png

Runs in the peers' venv, the one place matplotlib is installed. One panel per headline figure
(A with its ceilings, B, C sequential, C in flight, E's payload sizes); a bar per subject at its median, with a
whisker from min to max.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

ACP_LITE_COLOR, PEER_COLOR, CEILING_COLOR = "#2b7bba", "#d9822b", "#9a9a9a"


def panels(doc):
    figures = doc["figures"]
    inflight = doc["plan"]["inflight"]

    def pick(workloads, metric):
        return [f for f in figures if f["workload"] in workloads and f["metric"] == metric and f["summary"]]

    return [
        ("A. Client receive: updates/s", pick("A", "updates/s")),
        ("B. Agent send: updates/s", pick("B", "updates/s")),
        ("C. Round trips/s, sequential", pick("C", "requests/s (sequential)")),
        (f"C. Round trips/s, {inflight} in flight", pick("C", f"requests/s ({inflight} in flight)")),
        ("E. MB/s by update size", [f for f in pick("E", "MB/s") if f["subject"].endswith("B updates")]),
    ]


def color(subject):
    if subject.startswith("acp_lite"):
        return ACP_LITE_COLOR
    if subject.startswith(("ceiling", "bare")):
        return CEILING_COLOR
    return PEER_COLOR


def main(src, dst):
    with open(src) as f:
        doc = json.load(f)
    shown = [(title, rows) for title, rows in panels(doc) if rows]
    fig, axes = plt.subplots(
        len(shown),
        1,
        figsize=(9, 1.2 + sum(0.45 * len(rows) + 0.8 for _, rows in shown)),
        gridspec_kw={"height_ratios": [len(rows) for _, rows in shown]},
        squeeze=False,
    )
    for ax, (title, rows) in zip(axes[:, 0], shown):
        labels = [r["subject"] for r in rows]
        medians = [r["summary"]["median"] for r in rows]
        spread = [
            [m - r["summary"]["min"] for m, r in zip(medians, rows)],
            [r["summary"]["max"] - m for m, r in zip(medians, rows)],
        ]
        ax.barh(labels, medians, xerr=spread, color=[color(s) for s in labels], capsize=3)
        ax.invert_yaxis()
        ax.set_title(title, loc="left", fontsize=10)
        for y, r in enumerate(rows):
            ax.text(r["summary"]["max"], y, f"  {r['summary']['median']:,.0f}", va="center", fontsize=8)
        ax.set_xlim(0, max(r["summary"]["max"] for r in rows) * 1.25)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
        ax.tick_params(labelsize=8)
    meta, plan = doc["meta"], doc["plan"]
    fig.suptitle(
        f"acp_lite bench ({meta['name']}): median of {plan['runs']} runs, whiskers min–max\n{meta['machine']}",
        fontsize=8,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
