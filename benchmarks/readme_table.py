"""Regenerate the README's generated sections from the repository's files.

    python -m benchmarks.readme_table            # rewrite README.md in place
    python -m benchmarks.readme_table --check    # exit 1 if README.md is stale (CI runs this as a test)

Two sections, each between a pair of HTML comment markers:

* ``curriculum``: the day table of design.md; a day links its notebook when
  ``notebooks/day_NN_*.ipynb`` exists and says "planned" otherwise, and lists its registered
  variants (`helpers.variants.all_variants`) or, before there are any, the planned ones;
* ``results``: for every ``benchmarks/results/<gpu>/<suite>.csv`` written by
  ``python -m benchmarks`` (not the tuner's ``tune_*.csv``, which get one summary table per GPU:
  `tuning_table`), one table per GPU × suite: per variant that ran, the dtype and
  layout it ran in, the problems checked and passed and the geometric mean of ×cuDNN (cuDNN's
  median time in that dtype and layout / the variant's, > 1 is faster), one baseline row per
  dtype and layout, and the count of variants that refused every problem; with the GPU,
  driver, CUDA, torch and cuDNN versions read from the CSV's columns.

Everything is sorted, so regenerating an up-to-date README changes nothing.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from helpers.bench import geomean

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "benchmarks" / "results"
NOTEBOOKS = ROOT / "notebooks"
NO_RESULTS = "No results committed yet."
SUITE_ORDER = ["quick", "seed", "resnet50", "depthwise", "edge"]

# (day, idea, planned variants): the curriculum of design.md.
CURRICULUM = [
    (0, "setup: GPU facts, what conv2d computes (filter a real photo), harness tour", "—"),
    (1, "one thread per output pixel", "naive"),
    (2, "one block z per output channel", "z_out"),
    (3, "input tile in shared memory", "shared"),
    (4, "tile plus halo (extra threads load the halo; or a strided cooperative load)", "shared_halo"),
    (5, "float vs double vs compensated accumulation: error and speed", "accumulator flavours"),
    (6, "filters in constant/shared memory, register blocking over K and pixels", "blocked"),
    (7, "full semantics: batch, stride, padding, dilation, even/non-square filters, groups/depthwise",
     "general, depthwise"),
    (8, "im2col + GEMM, the memory cost of lowering", "im2col"),
    (9, "implicit GEMM on CUDA cores, NHWC, 2-D register tiles, vector loads, double buffering", "igemm_simt"),
    (10, "tensor cores with WMMA (fp16/bf16 in, fp32 accumulate)", "igemm_wmma"),
    (11, "mma.sync + ldmatrix, swizzled shared memory", "igemm_mma"),
    (12, "cp.async multistage pipeline alone: the ring of stages (a lean kernel, one tile, one iterator)",
     "igemm_pipelined"),
    (13, "the production kernel: tile descriptions as data, analytic/optimized/few-channels iterators, threadblock "
         "swizzle, fused epilogue (alpha·conv + beta·C, bias, ReLU)", "igemm_production"),
    (14, "backward: dgrad (unit and strided) and wgrad, fp32 accumulation, split-K serial and parallel; a training "
         "step through torch.autograd", "dgrad, wgrad"),
    (15, "the per-workload tuner: search space, pruning model, parallel compile, on-disk cache; judged on workloads "
         "it never saw", "tuner"),
    (16, "Hopper: wgmma, TMA (tiled + im2col), mbarriers, warp specialisation, persistent blocks (sm_90a only)",
     "igemm_wgmma"),
]  # fmt: skip


def markers(name: str) -> tuple[str, str]:
    """The start and end comment lines of generated section ``name``."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def replace_between(text: str, name: str, body: str) -> str:
    """``text`` with everything between the ``name`` markers replaced by ``body``.

    Raises:
        ValueError: a marker is missing, repeated, or the end comes before the start.
    """
    start, end = markers(name)
    if text.count(start) != 1 or text.count(end) != 1:
        raise ValueError(f"README must contain {start} and {end} exactly once each")
    i, j = text.index(start) + len(start), text.index(end)
    if j < i:
        raise ValueError(f"{end} comes before {start}")
    return text[:i] + "\n" + body.strip("\n") + "\n" + text[j:]


def registered_by_day() -> dict[int, list[str]]:
    """Names of the registered variants (`helpers.variants.all_variants`), by day."""
    from helpers.variants import all_variants

    out: dict[int, list[str]] = {}
    for v in all_variants():
        out.setdefault(v.day, []).append(v.name)
    return out


def curriculum_table(nb_dir: Path = NOTEBOOKS, registered: dict[int, list[str]] | None = None) -> str:
    """The day table as markdown.

    A day links its notebooks (``notebooks/day_NN_*.ipynb``) where they exist, else says
    "planned"; its variants are the registered ones (in backticks) or, before they exist, the
    plan of design.md (in italics).
    """
    registered = registered_by_day() if registered is None else registered
    lines = ["| day | notebook | idea | variants |", "|---|---|---|---|"]
    for day, idea, plan in CURRICULUM:
        nbs = sorted(nb_dir.glob(f"day_{day:02d}_*.ipynb"))
        cell = ", ".join(f"[{p.stem}](notebooks/{p.name})" for p in nbs) or "planned"
        names = registered.get(day)
        variants = ", ".join(f"`{n}`" for n in names) if names else plan if plan == "—" else f"*{plan}*"
        lines.append(f"| {day:02d} | {cell} | {idea} | {variants} |")
    return "\n".join(lines)


def _csv_key(path: Path) -> tuple:
    stem = path.stem
    base = stem.split("_")[0]
    return (SUITE_ORDER.index(base) if base in SUITE_ORDER else len(SUITE_ORDER), stem)


def _first(df: pd.DataFrame, col: str) -> str:
    if col not in df.columns:
        return "?"
    vals = df[col].dropna().astype(str)
    return vals.iloc[0] if len(vals) else "?"


def _as_bool(v) -> bool | None:
    s = str(v).strip().lower()
    return True if s == "true" else False if s == "false" else None


def results_table(csv: Path) -> str:
    """One GPU × suite section: a heading, the versions and the per-variant summary table."""
    df = pd.read_csv(csv)
    gpu = _first(df, "gpu")
    heading = f"### {gpu} — `{csv.stem}`"
    date = _first(df, "date")
    versions = (
        f"driver {_first(df, 'driver')} · CUDA {_first(df, 'cuda')} · torch {_first(df, 'torch')} · "
        f"cuDNN {_first(df, 'cudnn')} (fp32 precision: {_first(df, 'cudnn_fp32_precision')}) · "
        f"{df['problem'].nunique()} problems · measured {date} · "
        f"[CSV](benchmarks/results/{csv.parent.name}/{csv.name})"
    )
    rows = ["| variant | day | runs in | problems checked | passed | timed | geomean ×cuDNN |",
            "|---|---:|---|---:|---:|---:|---:|"]  # fmt: skip
    refused, skipped = [], []
    labels = [f"{v} (unchecked)" if st == "unchecked" else v for v, st in zip(df["variant"], df["status"])]
    df = df.assign(_label=labels)
    for variant, d in df.groupby("_label", sort=False):
        ok = d["ok"].map(_as_bool) if "ok" in d.columns else pd.Series([None] * len(d))
        checked = int(ok.notna().sum())
        passed = int((ok == True).sum())  # noqa: E712 - True/False/None
        timed = int(d["ms_p50"].notna().sum())
        status = d["status"].fillna("").astype(str)
        baseline = str(variant).startswith("cudnn")  # "cudnn", or "cudnn <dtype> <layout>" for adapted problems
        unchecked = (status == "unchecked").all()
        if not baseline and status.str.startswith("unsupported").all():
            refused.append(str(variant))
            continue
        if not baseline and status.str.startswith("skipped").all():
            skipped.append(str(variant))
            continue
        # checked rows: only those that passed; --no-check rows are their own line, never mixed in
        gm_rows = d if baseline or unchecked else d[ok == True]  # noqa: E712
        gm = geomean(gm_rows["x_cudnn"]) if "x_cudnn" in d.columns else math.nan
        runs_in = " / ".join(sorted(set(d["dtype"] + " " + d["layout"]))) if {"dtype", "layout"} <= set(d) else "—"
        if baseline:
            day_s = checked_s = passed_s = "baseline"
        else:
            day = pd.to_numeric(d["day"], errors="coerce").iloc[0] if "day" in d.columns else math.nan
            day_s = f"{int(day):02d}" if day == day else "?"
            checked_s, passed_s = (str(checked), str(passed)) if not unchecked else ("unchecked", "unchecked")
        gm_s = f"{gm:.3f}" if gm == gm else "—"
        rows.append(f"| {variant} | {day_s} | {runs_in} | {checked_s} | {passed_s} | {timed} | {gm_s} |")
    if refused:
        rows += ["", f"{len(refused)} variant(s) refused every problem of this suite: {', '.join(refused)}."]
    if skipped:
        rows += ["", f"{len(skipped)} variant(s) skipped every problem (not enough device memory, or no input kind "
                     f"applies): {', '.join(skipped)}."]  # fmt: skip
    return "\n".join([heading, "", versions, "", *rows])


TUNE_PREFIX = "tune_"  # python -m benchmarks.tune's CSVs (and ``*_sweep.csv``, its exhaustive sweeps)


def tuning_table(gpu_dir: Path) -> str:
    """The tuner's committed runs on one GPU (``tune_<suite>_<variant>_<dtype>_<layout>.csv``), a
    row each: problems tuned, summed tuning seconds (cold cache, builds included), geomean x cuDNN
    of the tuned choice and of the fitted rule, and of the tuned time over the exhaustive best
    where the run swept; "" without such files."""
    rows, gpu = [], gpu_dir.name
    for csv in sorted(gpu_dir.glob(f"{TUNE_PREFIX}*.csv")):
        if csv.stem.endswith("_sweep"):
            continue
        df = pd.read_csv(csv)
        gpu = str(df.gpu.iloc[0]) if "gpu" in df and len(df) else gpu
        ok = df[df.status == "ok"]

        def geo(s: pd.Series) -> str:
            g = geomean(s)
            return "—" if math.isnan(g) else f"{g:.3f}"

        best = geo(ok.best_ms / ok.ms) if "best_ms" in ok else "—"
        tuned = geo(ok.x_cudnn) if "x_cudnn" in ok else "—"
        rule = geo(ok.rule_x_cudnn) if "rule_x_cudnn" in ok else "—"
        rows.append(f"| [{csv.stem.removeprefix(TUNE_PREFIX)}](benchmarks/results/{gpu_dir.name}/{csv.name}) | "
                    f"{len(ok)} of {len(df)} | {ok.tune_s.sum():.1f} | {tuned} | {rule} | {best} |")  # fmt: skip
    if not rows:
        return ""
    head = ["| tuning run | problems tuned | tune s (sum) | tuned ×cuDNN | rule ×cuDNN | tuned / exhaustive best |",
            "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    return "\n".join([f"### {gpu} — tuning (`python -m benchmarks.tune`)", "", *head, *rows])


def results_section(results_dir: Path = RESULTS) -> str:
    """Every committed results CSV as a table, GPUs and suites in a fixed order, then each GPU's
    tuning runs (`tuning_table`); or `NO_RESULTS`."""
    csvs = sorted((p for p in results_dir.glob("*/*.csv") if not p.name.startswith(TUNE_PREFIX)),
                  key=lambda p: (p.parent.name, _csv_key(p)))  # fmt: skip
    tuning = [t for d in sorted(p for p in results_dir.iterdir() if p.is_dir()) if (t := tuning_table(d))]
    if not csvs and not tuning:
        return NO_RESULTS
    intro = (
        "×cuDNN is cuDNN's median time divided by the variant's (> 1: faster than cuDNN), "
        "geometric mean over the problems the variant passed and was timed on (runs with "
        "`--no-check` are listed apart, as unchecked). Regenerate with `python -m benchmarks.readme_table`."
    )
    return "\n\n".join([intro, *(results_table(c) for c in csvs), *tuning])


def render_readme(text: str, results_dir: Path = RESULTS, nb_dir: Path = NOTEBOOKS) -> str:
    """``text`` (a README) with its curriculum and results sections regenerated."""
    text = replace_between(text, "curriculum", curriculum_table(nb_dir))
    return replace_between(text, "results", results_section(results_dir))


def main(argv: list[str] | None = None) -> int:
    """Rewrite README.md (or with ``--check``, exit 1 if it is stale)."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.readme_table", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if README.md is out of date")
    ap.add_argument("--readme", type=Path, default=README, help="the README to update (default: ./README.md)")
    args = ap.parse_args(argv)
    try:
        old = args.readme.read_text()
        new = render_readme(old)
    except (OSError, ValueError) as e:  # missing file, a folder, markers missing or out of order
        print(f"python -m benchmarks.readme_table: {args.readme}: {e}", file=sys.stderr)
        return 2
    if args.check:
        if new != old:
            print(f"{args.readme} is stale: run python -m benchmarks.readme_table", file=sys.stderr)
            return 1
        return 0
    if new != old:
        args.readme.write_text(new)
        print(f"updated {args.readme}")
    else:
        print(f"{args.readme} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
