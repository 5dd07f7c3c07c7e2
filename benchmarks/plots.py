"""The report's figures (matplotlib, Agg: no browser, no display)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks.cases import Run
from benchmarks.quality import BASELINE_NAMES, quality_summary


def draw_plots(run: Run) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    if run.accuracy:
        frame = pd.DataFrame(run.accuracy)
        fig, ax = plt.subplots(figsize=(5.5, 5))
        for (case, backend), group in frame.groupby(["case", "backend"], sort=False):
            ax.scatter(
                1e3 * group["evaluated_s"], 1e3 * group["predicted_s"], s=14,
                label=f"{case} ({backend})",
            )  # fmt: skip
        lo = 1e3 * min(frame["evaluated_s"].min(), frame["predicted_s"].min())
        hi = 1e3 * max(frame["evaluated_s"].max(), frame["predicted_s"].max())
        ax.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("evaluated (whole step compiled), ms")
        ax.set_ylabel("predicted (composed profiles), ms")
        ax.set_title("Prediction accuracy")
        ax.legend(fontsize=6)
        made.append(_save(fig, run.out / "accuracy.png", "Prediction against whole-step truth"))
    if run.symbolic:
        frame = pd.DataFrame(run.symbolic)
        frame = frame[frame["segment"] == frame["segment"].mode()[0]]  # the repeated layer
        frame = frame.sort_values("profiled_s").reset_index(drop=True)
        fig, ax = plt.subplots(figsize=(8, 3.5))
        ax.bar(frame.index, 1e3 * frame["profiled_s"], color="#0072B2", label="profiled (ms)")
        ax.set_ylabel("profiled time, ms")
        ax.set_xlabel(f"configurations of {frame['segment'].iloc[0]}, by profiled time")
        twin = ax.twinx()
        twin.plot(frame.index, frame["symbolic_s"], "o", color="#D55E00", markersize=3)
        twin.set_ylabel("Alpa-style symbolic cost", color="#D55E00")
        ax.set_title(f"Symbolic against profiled cost ({frame['case'].iloc[0]})")
        made.append(_save(fig, run.out / "symbolic.png", "Symbolic against profiled cost (Fig. 9)"))
    summary = quality_summary(pd.DataFrame(run.quality)) if run.quality else pd.DataFrame()
    if not summary.empty:
        fig, ax = plt.subplots(figsize=(8, 4))
        names = [n for n in BASELINE_NAMES if f"{n}_ratio" in summary]
        width = 0.8 / max(1, len(names))
        for k, name in enumerate(names):
            ratios = summary[f"{name}_ratio"]
            ax.bar([i + k * width for i in range(len(summary))], ratios, width, label=name)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_ylabel("baseline time / CFP time (evaluated)")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(summary))])
        ax.set_xticklabels(
            [f"{c}\n{p}" for c, p in zip(summary["case"], summary["platform"], strict=True)],
            rotation=90, fontsize=5,
        )  # fmt: skip
        ax.legend(fontsize=7)
        ax.set_title("Plan quality (> 1: the CFP plan is faster)")
        made.append(_save(fig, run.out / "quality.png", "Plan quality against baselines"))
    if run.overhead:
        frame = pd.DataFrame(run.overhead).sort_values("layers")
        fig, ax = plt.subplots(figsize=(6, 4))
        if "profile_s" in frame:  # cold and cache-served profiling are different series
            cold = frame["from_cache"] == 0
            frame["profile_cold_s"] = frame["profile_s"].where(cold)
            frame["profile_warm_s"] = frame["profile_s"].where(~cold)
        for column, label in (
            ("trace_s", "trace"),
            ("blocks_s", "blocks"),
            ("segments_s", "segments"),
            ("profile_cold_s", "profile (cold cache)"),
            ("profile_warm_s", "profile (served by the cache)"),
            ("solve_s", "solve"),
            ("alpa_solve_s", "Alpa-style ILP solve"),
        ):
            part = frame.dropna(subset=[column]) if column in frame else frame.iloc[:0]
            if len(part):
                ax.plot(part["layers"], part[column], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("layers (tiny GPT, mesh 4)")
        ax.set_ylabel("seconds")
        ax.set_title("Search overhead against depth")
        ax.legend(fontsize=7)
        made.append(_save(fig, run.out / "overhead.png", "Search overhead"))
    return made


def _save(fig: Any, path: Path, title: str) -> tuple[str, str]:
    """Write a finished figure and free it; the report's (title, file name) for it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return title, path.name
