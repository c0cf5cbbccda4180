"""Regenerate the README's generated sections, RESULTS.md and the README's picture from the
repository's files.

    python -m benchmarks.readme_table            # rewrite README.md, RESULTS.md, benchmarks/results/overview.png
    python -m benchmarks.readme_table --check    # exit 1 if README.md or RESULTS.md is stale (a test runs this)

README.md has two sections, each between a pair of HTML comment markers:

* ``overview``: the first picture and table, each day's fastest variant against cuDNN on the
  ``quick`` suite, one run on one GPU (`overview_section`, `draw_overview`);
* ``curriculum``: the day table (`CURRICULUM`) with the GPU each day needs, its notebook's run
  time and peak GPU memory as ``python -m benchmarks.notebooks`` measured them
  (``results/<gpu>/notebooks.csv``); a day links its notebook when ``notebooks/day_NN_*.ipynb``
  exists and says "planned" otherwise, and lists its registered variants
  (`helpers.variants.all_variants`) or, before there are any, the planned ones.

RESULTS.md holds, for every ``benchmarks/results/<gpu>/<suite>.csv`` written by ``python -m
benchmarks`` (not the tuner's ``tune_*.csv``, which get one summary table per GPU:
`tuning_table`), one table per GPU × suite: per variant that ran, the dtype and layout it ran
in, the problems checked and passed and the geometric mean of ×cuDNN (cuDNN's median time in
that dtype and layout / the variant's, > 1 is faster), one baseline row per dtype and layout,
and the count of variants that refused every problem; with the GPU, driver, CUDA, torch and
cuDNN versions read from the CSV's columns.

Everything is sorted, so regenerating up-to-date files changes nothing.
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
TRAIN_STEP_CSV = "train_step.csv"  # python -m benchmarks.train_step: not a suite
RESULTS_MD = ROOT / "RESULTS.md"
RESULTS = ROOT / "benchmarks" / "results"
NOTEBOOKS = ROOT / "notebooks"
NO_RESULTS = "No results committed yet."
SUITE_ORDER = ["quick", "seed", "resnet50", "depthwise", "edge"]

# (day, idea, planned variants): the curriculum.
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
    (16, "Hopper's data path on one warpgroup: TMA (tiled + im2col), wgmma from shared memory, an mbarrier ring "
         "(sm_90a only)", "igemm_wgmma"),
    (17, "Hopper's schedules: warp specialisation, persistent blocks, ping-pong, clusters; a per-layer rule; against "
         "cuBLAS (sm_90a only)", "igemm_wgmma's schedules (day 16's variant)"),
    (18, "dgrad on Hopper: the filter turned around for day 16's fprop, strided layers by phases and one scatter "
         "(sm_90a only)", "dgrad_wgmma"),
    (19, "wgrad on Hopper: wgmma on transposed (MN-major) operands, persistent work units, a deterministic split-K "
         "chosen by cost; a training step on Hopper's kernels (sm_90a only)", "wgrad_wgmma"),
]


# A few words per day, for the README's first table.
SHORT = {
    0: "setup, what conv2d computes, the harness", 1: "one thread per output pixel",
    2: "one block z per output channel",
    3: "the input tile in shared memory", 4: "tile plus halo", 5: "float, double or compensated sums",
    6: "register blocking", 7: "stride, padding, dilation, groups", 8: "im2col + GEMM", 9: "implicit GEMM, CUDA cores",
    10: "tensor cores: WMMA", 11: "mma.sync + ldmatrix", 12: "the cp.async pipeline", 13: "the production kernel",
    14: "backward: dgrad and wgrad", 15: "a per-workload tuner", 16: "Hopper: TMA, wgmma, mbarriers",
    17: "Hopper: warp specialisation, the rule", 18: "dgrad on Hopper", 19: "wgrad on Hopper",
}
# The GPU a day needs where no variant of its own says (day 00 needs none of its own; day 15 tunes day 13's kernel;
# day 17 runs day 16's).
DAY_GPU = {0: ((7, 5), ""), 15: ((8, 0), ""), 17: ((9, 0), "a")}
LAPTOP_MIB = 8 * 1024  # "fits an 8 GB laptop GPU": its peak under this (the display and driver take some)
OVERVIEW_PNG = RESULTS / "overview.png"
OVERVIEW_SUITE = "quick"


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


def day_gpu() -> dict[int, str]:
    """The GPU each day's notebook needs: the newest compute capability its variants build for
    (`helpers.variants.Variant.min_cc`), e.g. "sm_80+", or "sm_90a only" for Hopper-only code."""
    from helpers.variants import all_variants

    need: dict[int, tuple] = dict(DAY_GPU)
    for v in all_variants():
        cur = need.get(v.day, ((7, 5), ""))
        need[v.day] = max(cur, (tuple(v.min_cc), v.arch_suffix))
    return {d: f"sm_{cc[0]}{cc[1]}{sfx} only" if sfx else f"sm_{cc[0]}{cc[1]}+" for d, (cc, sfx) in need.items()}


def notebook_costs(results_dir: Path = RESULTS) -> dict[int, dict]:
    """Per day, the newest measured run of its notebook (``results/<gpu>/notebooks.csv``, written
    by ``python -m benchmarks.notebooks``): {day: {"minutes", "peak_gpu_mib", "gpu"}}."""
    out: dict[int, dict] = {}
    for csv in sorted(results_dir.glob(f"*/{NOTEBOOKS_CSV}")):
        df = pd.read_csv(csv)
        for r in df.itertuples():
            if r.day not in out or str(r.date) > out[r.day]["date"]:
                out[int(r.day)] = {"minutes": r.seconds / 60, "peak_gpu_mib": r.peak_gpu_mib, "gpu": str(r.gpu),
                                   "date": str(r.date)}
    return out


def curriculum_table(nb_dir: Path = NOTEBOOKS, registered: dict[int, list[str]] | None = None,
                     results_dir: Path = RESULTS) -> str:
    """The day table as markdown: the notebook, the idea, the GPU it needs (`day_gpu`), the run time
    and peak GPU memory measured when it was last executed (`notebook_costs`; "—" before), whether
    that fits an 8 GB laptop GPU, and the variants.

    A day links its notebooks (``notebooks/day_NN_*.ipynb``) where they exist, else says
    "planned"; its variants are the registered ones (in backticks) or, before they exist, the
    plan of `CURRICULUM` (in italics).
    """
    registered = registered_by_day() if registered is None else registered
    gpus, costs = day_gpu(), notebook_costs(results_dir)
    lines = ["| day | notebook | idea | GPU | run (min) | peak GPU memory | fits an 8 GB laptop GPU | variants |",
             "|---|---|---|---|---:|---:|---|---|"]
    for day, idea, plan in CURRICULUM:
        nbs = sorted(nb_dir.glob(f"day_{day:02d}_*.ipynb"))
        cell = ", ".join(f"[{p.stem}](notebooks/{p.name})" for p in nbs) or "planned"
        names = registered.get(day)
        variants = ", ".join(f"`{n}`" for n in names) if names else plan if plan == "—" else f"*{plan}*"
        c = costs.get(day)
        if c is None or c["peak_gpu_mib"] != c["peak_gpu_mib"]:  # not measured (NaN)
            run = mem = fits = "—"
        else:
            run, mem = f"{c['minutes']:.1f}", f"{c['peak_gpu_mib'] / 1024:.1f} GiB"
            fits = "yes" if c["peak_gpu_mib"] < LAPTOP_MIB and "only" not in gpus.get(day, "") else "no"
        costs_s = f" {run} | {mem} | {fits} |" if costs else ""
        lines.append(f"| {day:02d} | {cell} | {idea} | {gpus.get(day, '—')} |{costs_s} {variants} |")
    if not costs:  # no notebook measured yet: no empty columns
        lines[:2] = ["| day | notebook | idea | GPU | variants |", "|---|---|---|---|---|"]
    measured = sorted({c["gpu"] for c in costs.values()})
    note = (f"Run time and peak GPU memory: the notebook executed with `QUICK = True` on {', '.join(measured)} "
            "(`python -m benchmarks.notebooks`, which measures both), a first run on a fresh machine with its "
            "kernel builds; peak memory is the CUDA context plus torch's peak reserved memory (what its caching "
            "allocator held, which can exceed what the day needs at once); a laptop GPU takes longer."
            if measured else "GPU: the oldest GPU the day's kernels build for (sm_75: Turing, sm_80: Ampere, "
            "sm_90a: Hopper only). Each notebook's run time and peak GPU memory join this table when the notebooks "
            "are next executed (`python -m benchmarks.notebooks` measures both).")
    return "\n".join(lines) + "\n\n" + note


def best_by_day(csv: Path) -> dict[int, tuple[str, float, int, int]]:
    """Per day, its fastest variant on a results CSV by geomean ×cuDNN over the problems it passed
    and was timed on: {day: (variant, geomean, problems it was timed on, problems in the suite)}."""
    df = pd.read_csv(csv)
    total = df.problem.nunique()
    ok = df[(df.status != "baseline") & (df["ok"].map(_as_bool) == True) & df.x_cudnn.notna()]  # noqa: E712
    out: dict[int, tuple[str, float, int, int]] = {}
    for (day, variant), d in ok.groupby(["day", "variant"]):
        gm = geomean(d.x_cudnn)
        if int(day) not in out or gm > out[int(day)][1]:
            out[int(day)] = (str(variant), gm, len(d), total)
    return out


def overview_csv(results_dir: Path = RESULTS) -> Path | None:
    """The `OVERVIEW_SUITE` CSV that covers the most days (the newest on a tie), or None."""
    csvs = sorted(results_dir.glob(f"*/{OVERVIEW_SUITE}.csv"))
    if not csvs:
        return None
    return max(csvs, key=lambda c: (len(best_by_day(c)), _first(pd.read_csv(c), "date")))


def resnet50_by_day(gpu_dir: Path) -> dict[int, tuple[str, float, int, int]]:
    """Per day, its fastest variant on the forward ResNet-50 runs of one GPU (``resnet50*.csv``,
    not dgrad / wgrad), as `best_by_day`."""
    out: dict[int, tuple[str, float, int, int]] = {}
    for csv in sorted(gpu_dir.glob("resnet50*.csv")):
        if "grad" in csv.stem:
            continue
        for day, row in best_by_day(csv).items():
            if day not in out or row[1] > out[day][1]:
                out[day] = row
    return out


def overview_section(results_dir: Path = RESULTS) -> str:
    """The README's first picture and table: each day's fastest variant against cuDNN on the
    `OVERVIEW_SUITE` suite, all measured in one run on one GPU (`overview_csv`), and on ResNet-50's
    layers where that GPU has a run (`resnet50_by_day`)."""
    csv = overview_csv(results_dir)
    best = best_by_day(csv) if csv is not None else {}
    resnet = resnet50_by_day(csv.parent) if csv is not None else {}
    gpu = _first(pd.read_csv(csv), "gpu") if csv is not None else "?"
    lines = ["| day | idea | fastest variant | ×cuDNN, quick | ×cuDNN, ResNet-50 |", "|---|---|---|---:|---:|"]
    for day, _, _ in CURRICULUM:
        variant, gm, n, total = best.get(day, ("—", math.nan, 0, 0))
        gm_s = "—" if gm != gm else f"{gm:.2f}" + ("" if n == total else f" ({n} of {total} layers)")
        r = resnet.get(day)
        r_s = "—" if r is None else f"{r[1]:.2f}" + ("" if r[0] == variant else f" (`{r[0]}`)")
        name = f"`{variant}`" if variant != "—" else variant
        lines.append(f"| {day:02d} | {SHORT[day]} | {name} | {gm_s} | {r_s} |")
    if csv is None:
        return "\n".join(lines)
    rel = OVERVIEW_PNG.relative_to(ROOT).as_posix()
    where = f"benchmarks/results/{csv.parent.name}"
    head = (f"![Each day's fastest kernel against cuDNN on one GPU, {gpu}]({rel})\n\n"
            "1.0 is as fast as cuDNN, 0.5 twice as slow. The baseline is cuDNN in each day's own dtype and layout, "
            "so it changes at day 08 (fp32 NHWC) and day 10 (fp16 tensor cores).\n\n"
            f"×cuDNN is cuDNN's median time over the kernel's (> 1: faster than cuDNN), geometric mean, on an {gpu} "
            f"([{OVERVIEW_SUITE} CSV]({where}/{csv.name}); the others in {RESULTS_MD.name}): the `{OVERVIEW_SUITE}` "
            "suite is 6 small layers, each day in its own dtype "
            "and layout against cuDNN in the same; ResNet-50 is its 19 forward layers at N = 32 and 256. Days 14 "
            "(backward) and 15 (the tuner) were measured on ResNet-50 on another GPU: "
            "[RESULTS.md](RESULTS.md) has every run. Day 17 teaches the schedules of day 16's variant: its numbers are "
            "in day 16's row. Day 18 (dgrad) is measured in its notebook.")
    return head + "\n\n" + "\n".join(lines)


def draw_overview(path: Path = OVERVIEW_PNG, results_dir: Path = RESULTS) -> Path | None:
    """Draw `overview_section`'s numbers as bars (one per day, cuDNN's 1.0 as a line) into ``path``;
    None without a CSV."""
    csv = overview_csv(results_dir)
    if csv is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best, resnet = best_by_day(csv), resnet50_by_day(csv.parent)
    days = sorted(set(best) | set(resnet))
    fig, ax = plt.subplots(figsize=(10, 3.8), dpi=120)
    width = 0.4
    for k, (label, data, color) in enumerate(((f"{OVERVIEW_SUITE} suite", best, "#4c72b0"),
                                              ("ResNet-50 layers", resnet, "#dd8452"))):
        xs = [i + (k - 0.5) * width for i, d in enumerate(days) if d in data]
        ys = [data[d][1] for d in days if d in data]
        bars = ax.bar(xs, ys, width, label=label, color=color)
        for b, y in zip(bars, ys):
            ax.annotate(f"{y:.2f}", (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(days)), [f"{d:02d}" for d in days])
    for first, label in ((1, "fp32 NCHW"), (8, "fp32 NHWC"), (10, "fp16 NHWC, tensor cores")):  # the baselines
        if first in days:
            x = days.index(first) - 0.5
            ax.axvline(x, color="#999999", lw=0.8, ls=":")
            ax.text(x + 0.08, 1.13, label, fontsize=8, color="#555555", va="bottom")
    ax.axhline(1.0, color="#c44e52", lw=1.2)
    ax.text(-0.6, 1.03, "cuDNN = 1", color="#c44e52", ha="left", va="bottom", fontsize=10)
    ax.set_ylim(0, max(1.25, *(v[1] * 1.1 for v in (*best.values(), *resnet.values()))))
    ax.set_xlabel("day")
    ax.set_ylabel("× cuDNN (higher is faster)")
    ax.legend(loc="upper left", bbox_to_anchor=(0.12, 0.76), ncols=2, frameon=False, fontsize=9)
    ax.set_title(f"Each day's fastest kernel against cuDNN, {_first(pd.read_csv(csv), 'gpu')}", fontsize=11)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


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
            "|---|---:|---|---:|---:|---:|---:|"]
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
                     f"applies): {', '.join(skipped)}."]
    return "\n".join([heading, "", versions, "", *rows])


TUNE_PREFIX = "tune_"  # python -m benchmarks.tune's CSVs (and ``*_sweep.csv``, its exhaustive sweeps)
NOTEBOOKS_CSV = "notebooks.csv"  # python -m benchmarks.notebooks's run times and memory: the day table's, not a suite


def tuning_table(gpu_dir: Path) -> str:
    """The tuner's committed runs on one GPU (``tune_<suite>_<variant>_<dtype>_<layout>.csv``), a
    row each: problems tuned, summed tuning seconds (cold cache, builds included), geomean x cuDNN
    of the tuned choice and of the fitted rule, and of the tuned time over the exhaustive best
    where the run swept; "" without such files."""
    rows, gpu = [], gpu_dir.name
    for csv in sorted(gpu_dir.glob(f"{TUNE_PREFIX}*.csv")):
        if csv.stem.endswith(("_sweep", "_untimed")):  # a sweep; the model's picks, nothing tuned
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
        tops = [geo(ok.sweep_best_ms / ok[c]) if c in ok and ok[c].notna().any() else "—"
                for c in ("top1_ms", "top3_ms")]
        rows.append(f"| [{csv.stem.removeprefix(TUNE_PREFIX)}](benchmarks/results/{gpu_dir.name}/{csv.name}) | "
                    f"{len(ok)} of {len(df)} | {ok.tune_s.sum():.1f} | {tuned} | {rule} | {best} | {tops[0]} | "
                    f"{tops[1]} |")
    if not rows:
        return ""
    head = ["| tuning run | problems tuned | tune s (sum) | tuned ×cuDNN | rule ×cuDNN | tuned / exhaustive best | "
            "model top-1 / best | top-3 / best |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    return "\n".join([f"### {gpu} — tuning (`python -m benchmarks.tune`)", "", *head, *rows])


def train_table(gpu_dir: Path) -> str:
    """The committed training step on one GPU (``train_step.csv``, `benchmarks.train_step`), a row
    per kernel set: the forward + backward in ms against torch's, eager (and the host's time to
    enqueue it) and captured in a CUDA graph where the run did; "" without the file."""
    csv = gpu_dir / TRAIN_STEP_CSV
    if not csv.is_file():
        return ""
    df = pd.read_csv(csv)

    def cell(row, col: str, fmt: str = ".3f") -> str:
        v = row.get(col)
        return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    r0 = df.iloc[0]
    head = ["| kernels | step ms | torch ms | ×torch | host ms | torch host ms | graphed ms | torch graphed ms "
            "| ×torch graphed |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rows = [f"| {r['kernels']} | {cell(r, 'ms_p50')} | {cell(r, 'torch_ms_p50')} | {cell(r, 'x_torch')} | "
            f"{cell(r, 'host_ms')} | {cell(r, 'torch_host_ms')} | {cell(r, 'graph_ms_p50')} | "
            f"{cell(r, 'torch_graph_ms_p50')} | {cell(r, 'x_torch_graph')} |" for _, r in df.iterrows()]
    return "\n".join([f"### {r0.gpu} — training step (`python -m benchmarks.train_step`)", "",
                      f"Day 14's model, N = {r0.batch}, fp16 channels_last; torch {r0.torch}, {r0.date}. "
                      "×torch > 1: faster than torch's step.", "", *head, *rows])


def results_section(results_dir: Path = RESULTS) -> str:
    """Every committed results CSV as a table, GPUs and suites in a fixed order, then each GPU's
    tuning runs (`tuning_table`) and training step (`train_table`); or `NO_RESULTS`."""
    csvs = sorted((p for p in results_dir.glob("*/*.csv")
                   if not p.name.startswith(TUNE_PREFIX) and p.name not in (NOTEBOOKS_CSV, TRAIN_STEP_CSV)),
                  key=lambda p: (p.parent.name, _csv_key(p)))
    dirs = sorted(p for p in results_dir.iterdir() if p.is_dir())
    tuning = [t for d in dirs if (t := tuning_table(d))] + [t for d in dirs if (t := train_table(d))]
    if not csvs and not tuning:
        return NO_RESULTS
    intro = (
        "×cuDNN is cuDNN's median time divided by the variant's (> 1: faster than cuDNN), "
        "geometric mean over the problems the variant passed and was timed on (runs with "
        "`--no-check` are listed apart, as unchecked). Regenerate with `python -m benchmarks.readme_table`."
    )
    return "\n\n".join([intro, *(results_table(c) for c in csvs), *tuning])


def render_readme(text: str, results_dir: Path = RESULTS, nb_dir: Path = NOTEBOOKS) -> str:
    """``text`` (a README) with its overview and curriculum sections regenerated."""
    text = replace_between(text, "overview", overview_section(results_dir))
    return replace_between(text, "curriculum", curriculum_table(nb_dir, results_dir=results_dir))


def render_results(results_dir: Path = RESULTS) -> str:
    """RESULTS.md: every committed results table (`results_section`)."""
    return ("# Results\n\nEvery committed run of `python -m benchmarks` and `python -m benchmarks.tune`, by GPU and "
            "suite (generated by `python -m benchmarks.readme_table` from `benchmarks/results/`; the caveats that "
            "go with these numbers are in the [README](README.md#caveats)).\n\n"
            + results_section(results_dir) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Rewrite README.md's generated sections, RESULTS.md and the overview picture (or with
    ``--check``, exit 1 if README.md or RESULTS.md is stale)."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.readme_table", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if README.md or RESULTS.md is stale")
    ap.add_argument("--readme", type=Path, default=README, help="the README to update (default: ./README.md)")
    ap.add_argument("--results-md", type=Path, default=RESULTS_MD, help="the results page (default: ./RESULTS.md)")
    args = ap.parse_args(argv)
    try:
        pages = {args.readme: render_readme(args.readme.read_text()), args.results_md: render_results()}
        old = {p: p.read_text() if p.is_file() else None for p in pages}
    except (OSError, ValueError) as e:  # missing file, a folder, markers missing or out of order
        print(f"python -m benchmarks.readme_table: {args.readme}: {e}", file=sys.stderr)
        return 2
    stale = [p for p, text in pages.items() if old[p] != text]
    if args.check:
        for p in stale:
            print(f"{p} is stale: run python -m benchmarks.readme_table", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(pages[p])
        print(f"updated {p}")
    if not stale:
        print(f"{', '.join(map(str, pages))} up to date")
    if args.readme == README and draw_overview():
        print(f"drew {OVERVIEW_PNG}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
