"""Pictures regenerated with the table (matplotlib, headless): S5's DoRA/LoRA memory ratio per peft release."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_real_size(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Grouped bars: per peft release, the DoRA/LoRA peak ratio of each base (dense, nf4, nf4 under autocast)
    for the baseline and each variant; a hatched bar is a run whose target check failed (fp32 leaked)."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    releases = sorted({r["peft"] for r in rows}, key=lambda v: tuple(int(x) for x in v.split(".") if x.isdigit()))
    series = sorted({(r["base"], r["autocast"], r["variant"]) for r in rows}, key=lambda s: (s[0], s[1], s[2]))
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.8 * len(releases) + 3), 4.5))
    colours = plt.get_cmap("tab20").colors
    labelled: set[int] = set()
    for i, (base, autocast, variant) in enumerate(series):
        for j, release in enumerate(releases):
            found = [
                r
                for r in rows
                if (r["peft"], r["base"], r["autocast"], r["variant"]) == (release, base, autocast, variant)
                and r["ratio"]
            ]
            if not found:
                continue
            row = found[0]
            label = None if i in labelled else f"{base}{', autocast' if autocast else ''}: {variant}"
            labelled.add(i)
            ax.bar(
                j + (i - (len(series) - 1) / 2) * width,
                row["ratio"],
                width,
                color=colours[i % len(colours)],
                hatch="//" if row["outcome"] != "pass" else None,
                edgecolor="black",
                linewidth=0.4,
                label=label,
            )
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(releases)), [f"peft {r}" for r in releases])
    ax.set_ylabel("DoRA / LoRA peak memory")
    shape = rows[0]["shape"]
    title = f"S5 at real size: {shape}, {rows[0]['device']}\nhatched: the target failed (fp32 leaves a DoRA layer)"
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})  # no version stamp: the file changes with the data only
    plt.close(fig)
    return path
