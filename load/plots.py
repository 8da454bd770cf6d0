"""Plots of a sweep: p50/p99 requeue latency (or throughput) against cluster size, hints on vs off,
as PNG files and one HTML page that shows them with the numbers."""

from __future__ import annotations

import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def _series(rows, hints: bool, pending: int, key: str):
    points = sorted((r["nodes"], r[key]) for r in rows if r["hints"] == hints and r["pending"] == pending
                    and r[key] is not None)
    return [p[0] for p in points], [p[1] for p in points]


def write(rows: list[dict], report_dir: Path) -> list[Path]:
    if not rows:
        return []
    scenario = rows[0]["scenario"]
    throughput = scenario in ("throughput", "extended-throughput")  # load.scenarios.BURST_SCENARIOS
    keys = ["pods_per_second"] if throughput else ["p50_ms", "p99_ms"]
    files = []
    for key in keys:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for pending in sorted({r["pending"] for r in rows}):
            for hints, style in ((True, "-o"), (False, "--s")):
                xs, ys = _series(rows, hints, pending, key)
                if xs:
                    ax.plot(xs, ys, style, label=f"{pending} pods, hints {'on' if hints else 'off'}")
        ax.set_xlabel("nodes")
        ax.set_ylabel("pods/s" if throughput else f"{key.split('_')[0]} latency (ms)")
        ax.set_title(f"{scenario}: {'throughput' if throughput else key.split('_')[0] + ' requeue latency'}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        path = report_dir / f"{scenario}-{key}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    head = list(rows[0])
    table = "".join("<tr>" + "".join(f"<td>{html.escape(str(r[k]))}</td>" for k in head) + "</tr>" for r in rows)
    images = "".join(f'<p><img src="{p.name}" alt="{p.stem}"></p>' for p in files)
    (report_dir / "sweep.html").write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{scenario} sweep</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{border:1px solid #ccc;padding:3px 6px}"
        "table{border-collapse:collapse}</style></head>"
        f"<body><h1>{html.escape(scenario)} sweep</h1>{images}<table><tr>"
        + "".join(f"<th>{html.escape(k)}</th>" for k in head) + f"</tr>{table}</table></body></html>")
    return files
