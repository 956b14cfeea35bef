"""PNG plots (matplotlib, Agg): acceptance by position and τ by category (`eyas eval --plots DIR`), and the
learning curve of a training run (the demo's report).

Each plot has a title, labelled units and an axis range that shows the quantity's real scale: τ axes start
at 0 with the floor τ = 1 (no draft token accepted) drawn in, so a change of 0.001 looks like one; position
and step axes have integer ticks. The loss is one quantity everywhere: mean cross-entropy per predicted
token over all TTT steps (`token_loss` in metrics.jsonl), the number the training progress bar shows.
"""

from __future__ import annotations

import json
from pathlib import Path

_DPI = 110


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _integer_ticks(axis) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _tau_floor(ax) -> None:
    ax.axhline(1.0, color="0.4", lw=0.8, ls="--", label="τ = 1: no draft token accepted", zorder=0)


def _tau_top(values: list[float]) -> float:
    """Headroom above the largest τ, never a window around it."""
    return max([2.0] + [v * 1.15 for v in values])


def write_plots(results: list[dict], out: str | Path) -> list[str]:
    plt = _pyplot()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4))
    longest = 1
    for r in results:
        acc = r["accept_per_position"]
        longest = max(longest, len(acc))
        ax.plot(range(1, len(acc) + 1), acc, marker="o", label=f"{r['setting']}  (τ {r['tau']:.2f})")
    ax.set_xlim(0.5, longest + 0.5)
    _integer_ticks(ax.xaxis)
    ax.set_xlabel("draft position k (1 = first drafted token)")
    ax.set_ylabel("share of verification steps\naccepting ≥ k drafted tokens")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    paths.append(_finish(plt, fig, ax, "Acceptance by draft position", out / "acceptance_by_position.png"))

    cats = sorted({c for r in results for c in r["per_category"]})
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(cats) + 2), 4.2))
    width = 0.8 / max(1, len(results))
    taus = []
    for j, r in enumerate(results):
        xs = [i + j * width for i in range(len(cats))]
        vals = [r["per_category"].get(c, {}).get("tau", 0.0) for c in cats]
        taus += vals
        bars = ax.bar(xs, vals, width, label=f"{r['setting']}  (all: τ {r['tau']:.2f})")
        ax.bar_label(bars, fmt="%.2f", fontsize=6, padding=1)
    ax.set_xticks([i + width * (len(results) - 1) / 2 for i in range(len(cats))])
    ax.set_xticklabels(cats, rotation=45, ha="right", fontsize=8)
    ax.set_ylim(0, _tau_top(taus))
    _tau_floor(ax)
    ax.set_ylabel("τ (tokens per verification step)")
    paths.append(_finish(plt, fig, ax, "τ by Spec-Bench category", out / "tau_by_category.png"))
    return paths


def plot_learning_curve(metrics: str | Path, png: str | Path) -> Path | None:
    """Training loss per token (train and held-out) and held-out simulated τ against optimizer steps, side by
    side (no shared twin axis, no legend over the data). None when the run logged no token_loss."""
    metrics = Path(metrics)
    if not metrics.is_file():
        return None
    train, held_loss, held_tau = [], [], []
    for line in filter(str.strip, metrics.read_text(encoding="utf-8").split("\n")):
        m = json.loads(line)
        if "token_loss" not in m:
            continue
        if m.get("split", "train") == "train":
            train.append((m["step"], m["token_loss"]))
        elif m.get("split") == "eval":
            held_loss.append((m["step"], m["token_loss"]))
            held_tau.append((m["step"], m["tau"]))
    if not train:
        return None
    plt = _pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.6))
    ax.plot(*zip(*train), marker=".", label="train (mean of the last logging window)")
    if held_loss:
        ax.plot(*zip(*held_loss), "o", color="tab:orange", label="held-out")
    ax.set_ylim(0, max(v for _, v in train + held_loss) * 1.1 or 1.0)
    ax.set_ylabel("cross-entropy per token (nats)")
    ax.set_title("loss (all TTT steps)", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    if held_tau:
        bx.plot(*zip(*held_tau), "o-", color="tab:orange")
        for s, t in held_tau[-1:]:
            bx.annotate(f"{t:.3f}", (s, t), xytext=(-4, 6), textcoords="offset points", ha="right", fontsize=7)
        bx.set_ylim(0, _tau_top([t for _, t in held_tau]))
        _tau_floor(bx)
        bx.legend(fontsize=7, loc="lower right")
    else:
        bx.text(0.5, 0.5, "no held-out split", ha="center", va="center", transform=bx.transAxes)
    bx.set_ylabel("simulated τ (tokens per step)")
    bx.set_title("held-out simulated τ", fontsize=9)
    last = max(s for s, _ in train + held_tau)
    for a in (ax, bx):
        a.set_xlabel("optimizer step")
        a.set_xlim(0, last * 1.03)
        _integer_ticks(a.xaxis)
        a.grid(alpha=0.3)
    fig.suptitle("Draft training", fontsize=11)
    fig.tight_layout()
    fig.savefig(str(png), dpi=_DPI)
    plt.close(fig)
    return Path(png)


def _finish(plt, fig, ax, title: str, path) -> str:
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(str(path), dpi=_DPI)
    plt.close(fig)
    return str(path)
