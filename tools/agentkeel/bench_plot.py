"""`agentkeel bench --plot FILE.png`: throughput over time and against workers, and the
storage of the side's tables over time, drawn with matplotlib (the optional `plot` extra).
"""

from __future__ import annotations

from pathlib import Path

from agentkeel.workloads import SLICE_S, Run, summarize

COLORS = {"floor": "tab:gray", "keel": "tab:blue"}


def plot(runs: list[Run], path: Path, title: str) -> None:
    """Write a PNG: one row per workload with its throughput per slice (every run of both
    sides at the largest worker count) and the storage of its tables; a last panel with the
    median ops/s against workers when more than one count was measured. Needs matplotlib
    (the plot extra; the CLI checks for it before any run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.workload for r in runs))
    counts = sorted({r.workers for r in runs})
    rows = len(workloads) + (1 if len(counts) > 1 else 0)
    fig, axes = plt.subplots(rows, 2, figsize=(13, 3.4 * rows), squeeze=False)
    fig.suptitle(title)
    for row, name in enumerate(workloads):
        top = [r for r in runs if r.workload == name and r.workers == counts[-1]]
        over_time, storage = axes[row][0], axes[row][1]
        dead = storage.twinx()
        for n, r in enumerate(top):
            seconds = [(i + 1) * SLICE_S for i in range(len(r.slices))]
            label = r.side if n < 2 else None
            over_time.plot(
                seconds, [s / SLICE_S for s in r.slices], color=COLORS[r.side], label=label
            )
            if r.storage:
                t = [s[0] for s in r.storage]
                mb = [(s[1] + s[2]) / 1e6 for s in r.storage]
                storage.plot(t, mb, color=COLORS[r.side], label=label)
                dead.plot(t, [s[3] for s in r.storage], color=COLORS[r.side], linestyle=":")
        over_time.set_title(f"{name}, {counts[-1]} workers: throughput")
        over_time.set_xlabel("seconds into the run")
        over_time.set_ylabel("ops/s")
        over_time.set_ylim(bottom=0)
        over_time.legend(loc="lower left")
        storage.set_title(f"{name}: tables + indexes")
        storage.set_xlabel("seconds into the run")
        storage.set_ylabel("MB (solid)")
        storage.legend(loc="upper left")
        dead.set_ylabel("dead tuples (dotted)")
    if len(counts) > 1:
        scaling = axes[-1][0]
        summary = summarize(runs)
        for name in workloads:
            mine = [s for s in summary if s.workload == name]
            scaling.plot(
                [s.workers for s in mine],
                [s.keel.ops_per_s for s in mine],
                marker="o",
                label=f"{name} keel",
            )
            scaling.plot(
                [s.workers for s in mine],
                [s.floor.ops_per_s for s in mine],
                marker="o",
                linestyle="--",
                label=f"{name} floor",
            )
        scaling.set_title("median ops/s against workers")
        scaling.set_xlabel("workers")
        scaling.set_ylabel("ops/s")
        scaling.set_xticks(counts)
        scaling.legend(fontsize="small")
        axes[-1][1].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
