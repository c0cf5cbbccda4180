"""python -m benchmarks.plot CSV [CSV ...]: redraw a results PNG from its committed CSV.

The PNG is only a rendering of the CSV's numbers (measured by ``python -m benchmarks`` on the
GPU named in it), so it can be redrawn anywhere, without a GPU, after a change to the plot.
"""

from __future__ import annotations

import sys
from pathlib import Path


def redraw(csv: Path) -> Path:
    """Write ``csv`` with a ``.png`` suffix from `helpers.plots.plot_bench`; return its path.

    Raises:
        FileNotFoundError: no such CSV.
        IsADirectoryError: ``csv`` is a folder.
        KeyError: the CSV lacks the columns ``python -m benchmarks`` writes.
        ValueError: the CSV is empty or has no timed row.
    """
    import pandas as pd

    from helpers.plots import plot_bench

    try:
        df = pd.read_csv(csv)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{csv} is empty") from None
    if df.empty:
        raise ValueError(f"{csv} has a header but no rows")
    prec = df["cudnn_fp32_precision"].iloc[0] if "cudnn_fp32_precision" in df else "?"
    fig = plot_bench(df, f"{df['suite'].iloc[0]} on {df['gpu'].iloc[0]} (cuDNN fp32 precision: {prec})")
    out = csv.with_suffix(".png")
    fig.savefig(out, dpi=110, bbox_inches="tight")
    return out


def main(argv: list[str] | None = None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    paths = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not paths:
        print("usage: python -m benchmarks.plot CSV [CSV ...]", file=sys.stderr)
        return 2
    for p in paths:
        try:
            print("wrote", redraw(p))
        except FileNotFoundError:
            print(f"python -m benchmarks.plot: no such file: {p}", file=sys.stderr)
            return 2
        except IsADirectoryError:
            print(f"python -m benchmarks.plot: {p} is a folder; give the CSV files in it", file=sys.stderr)
            return 2
        except ValueError as e:
            print(f"python -m benchmarks.plot: {e}", file=sys.stderr)
            return 2
        except KeyError as e:
            print(f"python -m benchmarks.plot: {p} lacks the column {e} that python -m benchmarks writes",
                  file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
