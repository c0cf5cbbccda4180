"""Plots drawn on the CPU from committed results and synthetic frames (no GPU)."""

from __future__ import annotations

import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from benchmarks.plot import redraw  # noqa: E402
from helpers.plots import draw_mapping, plot_bench  # noqa: E402

# python -m benchmarks's CSVs (the tuner's tune_*.csv, the notebooks' run times and the training step have no plot)
RESULTS = sorted(p for p in (Path(__file__).resolve().parents[1] / "benchmarks" / "results").glob("*/*.csv")
                 if not p.name.startswith("tune_") and p.name not in ("notebooks.csv", "train_step.csv"))


@pytest.mark.skipif(not RESULTS, reason="no committed results")
@pytest.mark.parametrize("csv", RESULTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_redraw_committed_results(csv: Path, tmp_path: Path):
    copy = tmp_path / csv.name
    shutil.copy(csv, copy)
    png = redraw(copy)
    assert png == copy.with_suffix(".png") and png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _frame(n_variants: int) -> pd.DataFrame:
    rows = []
    for p in ("A", "B"):
        rows.append(dict(problem=p, variant="cudnn", ms_p50=1.0, ms_p20=0.9, ms_p80=1.1, x_cudnn=1.0))
        for i in range(n_variants):
            ms = 0.5 + i / 10
            rows.append(dict(problem=p, variant=f"v{i}", ms_p50=ms, ms_p20=ms * 0.9, ms_p80=ms * 1.1, x_cudnn=1.0 / ms))
    return pd.DataFrame(rows)


def test_plot_bench_gives_every_variant_its_own_colour():
    fig = plot_bench(_frame(12), "t")
    (legend,) = fig.legends
    colours = [tuple(h.get_facecolor()) for h in legend.legend_handles]
    assert len(colours) == 13 and len(set(colours)) == 13


def test_plot_bench_skips_rows_without_a_time():
    df = _frame(2)
    df.loc[df.variant == "v1", ["ms_p50", "x_cudnn"]] = float("nan")
    fig = plot_bench(df)
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["cudnn", "v0"]


def test_draw_mapping_marks_the_overhanging_blocks():
    fig = draw_mapping(P=5, Q=7, block=(4, 2))
    ax = fig.axes[0]
    hatched = [p for p in ax.patches if p.get_hatch()]
    assert len(ax.patches) == 2 * 3 + 1  # 2x3 blocks and the output outline
    # Q = 7 over 2 columns of 4 and P = 5 over 3 rows of 2: the last column (3 blocks) and the
    # last row (2 blocks, one shared with the column) hang over the edge.
    assert len(hatched) == 3 + 2 - 1
