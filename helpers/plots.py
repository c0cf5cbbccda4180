"""Plots for the notebooks and the benchmark command: times, speedup vs cuDNN, thread mappings.

All functions return the matplotlib Figure and leave saving/showing to the caller.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter


def plot_bench(df: pd.DataFrame, title: str = "") -> plt.Figure:
    """Two panels per problem: median time (ms, log axis, p20–p80 whiskers) and × cuDNN.

    ``df`` is a `helpers.bench.bench` DataFrame; unsupported or failed rows are left out.
    """
    d = df[df.ms_p50.notna()].copy()
    order = list(dict.fromkeys(d.problem))
    variants = list(dict.fromkeys(d.variant))
    h = max(3.0, 0.32 * len(order) * max(1, len(variants)) / 2 + 1)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, h), sharey=True)
    # One distinct colour per variant in both panels (the right one has no cuDNN bar); cuDNN grey
    # (the baseline rows: "cudnn", and "cudnn <dtype> <layout>" for problems adapted to a variant).
    baselines = list(dict.fromkeys(d.variant[d.status == "baseline"])) if "status" in d else ["cudnn"]
    others = [v for v in variants if v not in baselines]
    tab20 = sns.color_palette("tab20", 20)  # dark shades first, then light ones; greys (14, 15) skipped
    colours = [tab20[i] for i in (0, 2, 4, 6, 8, 10, 12, 16, 18, 1, 3, 5, 7, 9, 11, 13, 17, 19)]
    colours = (colours * (len(others) // len(colours) + 1))[: len(others)]
    greys = [(0.45, 0.45, 0.45), (0.6, 0.6, 0.6), (0.3, 0.3, 0.3), (0.75, 0.75, 0.75)]
    palette = {**dict(zip(baselines, greys * len(baselines))), **dict(zip(others, colours))}
    sns.barplot(d, y="problem", x="ms_p50", hue="variant", order=order, hue_order=variants, palette=palette,
                ax=a1, errorbar=None)
    # p20..p80 whiskers: the bar containers are in hue order, one bar per problem each.
    for cont, v in zip(a1.containers, variants):
        dv = d[d.variant == v].set_index("problem")
        for bar, prob in zip(cont, [p for p in order if p in dv.index]):
            y = bar.get_y() + bar.get_height() / 2
            a1.plot([dv.at[prob, "ms_p20"], dv.at[prob, "ms_p80"]], [y, y], color="k", lw=0.8)
    a1.set_xscale("log")
    a1.set_xlabel("median time (ms, log scale; whiskers p20–p80)")
    a1.set_ylabel("")
    dk = d[~d.variant.isin(baselines)]
    sns.barplot(dk, y="problem", x="x_cudnn", hue="variant", order=order, palette=palette,
                hue_order=others, ax=a2, errorbar=None)
    a2.axvline(1.0, color="k", ls="--", lw=1)
    a2.set_xscale("log")
    a2.set_xlabel("speed vs cuDNN (× cuDNN, log scale; > 1 is faster)")
    for ax in (a1, a2):  # plain numbers on the log axes, no crowded minor labels
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    if a2.legend_:
        a2.legend_.remove()
    if a1.legend_:  # one legend, outside the bars
        a1.legend_.remove()
    handles, labels = a1.get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 0.98), title="variant", frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def draw_mapping(
    P: int,
    Q: int,
    block: tuple[int, int],
    highlight_block: tuple[int, int] = (1, 0),
    title: str = "",
) -> plt.Figure:
    """Draw a P×Q output plane tiled by ``block=(BX, BY)`` thread blocks.

    x (threadIdx.x, blockIdx.x) runs along columns q, y along rows p, as everywhere in the
    series. Blocks hanging over the edge are drawn hatched: their outside threads exit early.
    One block is highlighted with its threads' (x, y) indices.
    """
    bx, by = block
    gx, gy = -(-Q // bx), -(-P // by)
    fig, ax = plt.subplots(figsize=(min(12, 0.45 * gx * bx + 2), min(9, 0.45 * gy * by + 1.5)))
    colors = sns.color_palette("pastel", gx * gy)
    for j in range(gy):
        for i in range(gx):
            over = (i + 1) * bx > Q or (j + 1) * by > P
            ax.add_patch(Rectangle((i * bx, j * by), bx, by, fc=colors[j * gx + i], ec="k", lw=1.5,
                                   hatch="//" if over else None, alpha=0.9))
            ax.text(i * bx + bx / 2, j * by + by / 2, f"block\n({i},{j})", ha="center", va="center", fontsize=9)
    hi, hj = highlight_block
    if hi < gx and hj < gy:
        for ty in range(by):
            for tx in range(bx):
                q, p = hi * bx + tx, hj * by + ty
                ax.text(q + 0.5, p + 0.5, f"{tx},{ty}", ha="center", va="center", fontsize=6,
                        color="k" if (q < Q and p < P) else "red")
    ax.add_patch(Rectangle((0, 0), Q, P, fill=False, ec="crimson", lw=3, label=f"output plane {P}x{Q}"))
    ax.set_xlim(0, gx * bx)
    ax.set_ylim(gy * by, 0)
    ax.set_aspect("equal")
    ax.set_xlabel("q (output column)  ←  x: blockIdx.x·blockDim.x + threadIdx.x")
    ax.set_ylabel("p (output row)  ←  y")
    ax.legend(loc="lower right")
    ax.set_title(title or f"{gx}x{gy} blocks of {bx}x{by} threads over a {P}x{Q} output")
    fig.tight_layout()
    return fig
