"""PNG plots for `eyas eval --plots DIR`: acceptance by position and τ by category (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path


def write_plots(results: list[dict], out: str | Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        acc = r["accept_per_position"]
        ax.plot(range(1, len(acc) + 1), acc, marker="o", label=f"{r['setting']}  τ={r['tau']:.2f}")
    ax.set_xlabel("draft position")
    ax.set_ylabel("fraction of rounds accepting it")
    ax.set_ylim(0, 1)
    paths.append(_finish(plt, fig, ax, "acceptance by position", out / "acceptance_by_position.png"))

    cats = sorted({c for r in results for c in r["per_category"]})
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(cats) + 2), 4))
    width = 0.8 / max(1, len(results))
    for j, r in enumerate(results):
        xs = [i + j * width for i in range(len(cats))]
        ax.bar(xs, [r["per_category"].get(c, {}).get("tau", 0.0) for c in cats], width, label=r["setting"])
    ax.set_xticks([i + width * (len(results) - 1) / 2 for i in range(len(cats))])
    ax.set_xticklabels(cats, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("τ (tokens per verification step)")
    paths.append(_finish(plt, fig, ax, "τ by category", out / "tau_by_category.png"))
    return paths


def _finish(plt, fig, ax, title: str, path) -> str:
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)
    return str(path)
