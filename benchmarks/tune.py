"""python -m benchmarks.tune: tune variants per problem of a suite, against the fitted rule and cuDNN.

    python -m benchmarks.tune --suite resnet50 --dtype fp16 --layout NHWC            # every tunable variant
    python -m benchmarks.tune --suite outside --variants igemm_production --budget 120
    python -m benchmarks.tune --suite resnet50 --exhaustive                          # also the full sweep
    python -m benchmarks.tune --suite resnet50 --no-time                             # the model's picks, untimed

For each tunable variant (`helpers.tune.SPACES`) and each problem it runs `helpers.tune.tune`
(model pruning, parallel builds, short timings with early stopping, the winner re-timed), with the
cache at ``--cache`` (default `helpers.tune.default_cache_path`; ``--cold`` starts from an empty
one in a temporary file, so the run measures a cold search). Then, unless ``--no-cudnn``: cuDNN's
time on the problem (benchmark mode, channels_last; TF32 off for fp32), the wall time of its
first call (its own benchmark-mode search plus one run) and the kernels it launched (torch's
profiler). Writes ``benchmarks/results/<gpu>/tune_<suite>_<variant>_<dtype>_<layout>.csv``
(``..._untimed.csv`` with ``--no-time``), one row per problem, with the versions (and with
``--exhaustive`` the sweep itself, one row per
problem and configuration, in ``..._sweep.csv``, and the model's picks without timing: ``top1_ms``, the
best of its first three ``top3_ms``), and prints the summary (geomean x cuDNN of the tuned choice and of
the rule; with ``--exhaustive`` the tuned time, the model's top-1 and its top-3 over the sweep's best).
Rows a variant refuses (day 20's 1 x 1 and strided layers) have status ``unsupported: <reason>``; a variant
that does not take the suite's dtype or layout runs in its own (day 20: fp32), as its file name says.
Exit status: 0 if every problem a variant takes was tuned, 1 if any faulted, ran over the budget or found the
rule's own pick wrong (it failed the float64 check), 2 without a GPU or on bad arguments.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def at_least_one(text: str) -> int:
    """An argparse type: an int of 1 or more (0 used to be taken as the default silently)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: at least 1 candidate must be timed")
    return n


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from helpers.suites import SUITES

    ap = argparse.ArgumentParser(prog="python -m benchmarks.tune", description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="resnet50", choices=sorted(SUITES), help="problem suite (default: resnet50)")
    ap.add_argument("--variants", nargs="+", default=None, help="tunable variants (default: every one)")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "fp32"],
                    help="the suite's dtype (default: fp16); a variant that does not take it runs in its own")
    ap.add_argument("--layout", default="NHWC", choices=["NHWC", "NCHW"],
                    help="the suite's layout (default: NHWC); a variant that does not take it runs in its own")
    ap.add_argument("--budget", type=float, default=None, help="seconds per variant; later problems are left")
    ap.add_argument("--keep", type=at_least_one, default=None,
                    help="candidates timed after pruning, 1 or more (default: tune.KEEP)")
    ap.add_argument("--exhaustive", action="store_true", help="also time every candidate (the best_ms column)")
    ap.add_argument("--no-time", action="store_true",
                    help="cache the model's first choice per problem, nothing built or timed (implies --no-cudnn; "
                    "the tuned flavour checks each choice on first use)")
    ap.add_argument("--cache", type=Path, default=None, help="cache file (default: tune.default_cache_path())")
    ap.add_argument("--cold", action="store_true", help="start from an empty cache (a temporary file)")
    ap.add_argument("--no-cudnn", action="store_true", help="do not time cuDNN")
    ap.add_argument("--out", type=Path, default=None, help="results folder (default: benchmarks/results/<gpu>)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap.parse_args(argv)


def cudnn_columns(p) -> dict:
    """cuDNN on ``p``: ``cudnn_first_s`` (wall seconds of the first call in this process, which
    runs benchmark mode's search), ``cudnn_ms`` (median, `helpers.timing.time_gpu`) and
    ``cudnn_kernels`` (the CUDA kernels of one call, from torch's profiler, ``;``-joined)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from helpers.bench import cudnn_fp32_ieee, cudnn_launcher
    from helpers.timing import time_gpu

    a, b = p.make_inputs(device="cuda", seed=1)
    with cudnn_fp32_ieee():
        launch = cudnn_launcher(p, a, b)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        launch()
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        t = time_gpu(launch)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            launch()
            torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"cudnn_ms": t.ms_p50, "cudnn_first_s": first_s, "cudnn_kernels": ";".join(dict.fromkeys(names))}


def write_sweep(df, path: Path) -> None:
    """The exhaustive sweep, one row per (problem, configuration): ``model_us`` (the model's
    prediction) and ``ms`` (measured; NaN for a disagreeing or faulting configuration)."""
    import pandas as pd

    rows = [{"problem": prob, "config": cfg, "model_us": round(m, 3), "ms": float(f"{ms:.4g}")}
            for prob, sw in zip(df.problem, df.sweep) if isinstance(sw, dict)
            for cfg, (m, ms) in sw.items()]
    pd.DataFrame(rows).to_csv(path, index=False)


def top_k_ms(sweep: dict, k: int, variations: frozenset | set = frozenset()) -> float:
    """The fastest measured time (ms) among the ``k`` candidates the model ranks first in a sweep
    ({config: (model_us, ms)}; ties in the sweep's order; ``variations``, the configurations the
    sweep tried as a candidate's runtime variation, are not the model's picks and are left out):
    ``k`` = 1 is the model's pick with no timing at all. The times are the sweep's own short
    timings: compare with the sweep's minimum (``sweep_best_ms``), timed alike. NaN if none of
    them passed the check.

    Raises:
        ValueError: k < 1."""
    if k < 1:
        raise ValueError(f"k = {k}: at least the model's first choice")
    ranked = [kv for kv in sweep.items() if kv[0] not in variations]
    first = sorted(ranked, key=lambda kv: kv[1][0])[:k]  # stable: the sweep's order breaks ties
    times = [ms for _, (_, ms) in first if ms == ms]
    return min(times) if times else float("nan")


def add_top_k(df):
    """``top1_ms`` and ``top3_ms`` (`top_k_ms`) from each row's sweep: the model's pick timed not
    at all, and the best of its three first picks; ``sweep_best_ms``, the sweep's fastest short
    time (variations included), what they are compared with."""
    df = df.copy()
    varied = df.sweep_variations if "sweep_variations" in df else [frozenset()] * len(df)
    for k in (1, 3):
        df[f"top{k}_ms"] = [top_k_ms(sw, k, set(v)) if isinstance(sw, dict) else float("nan")
                            for sw, v in zip(df.sweep, varied)]
    df["sweep_best_ms"] = [min((ms for _, ms in sw.values() if ms == ms), default=float("nan"))
                           if isinstance(sw, dict) else float("nan") for sw in df.sweep]
    return df


def summary(df) -> dict:
    """Geomeans over the tuned rows: x cuDNN of the tuned choice and of the rule, tuned over
    exhaustive best (with ``best_ms``), the model's top-1 and top-3 over the exhaustive best
    (with ``top1_ms``, over the sweep's own fastest short time, timed alike; a pick that failed
    the check counts as missing: ``top1_failed``), and the summed tuning seconds."""
    from helpers.bench import geomean as geo

    ok = df[df.status == "ok"]
    out = {"problems": len(df), "tuned": len(ok), "tune_s": float(ok.tune_s.sum()) if len(ok) else 0.0}
    if not len(ok):  # every problem refused or faulted: nothing to compare
        return out
    if "cudnn_ms" in ok:
        out["tuned_x_cudnn"] = geo(ok.cudnn_ms / ok.ms)
        out["rule_x_cudnn"] = geo(ok.cudnn_ms / ok.rule_ms)
    if "best_ms" in ok:
        out["tuned_over_best"] = geo(ok.best_ms / ok.ms)
    if "top1_ms" in ok:
        for k in (1, 3):
            timed = ok[ok[f"top{k}_ms"].notna()]
            out[f"top{k}_over_best"] = geo(timed.sweep_best_ms / timed[f"top{k}_ms"])
        out["top1_failed"] = int(ok.top1_ms.isna().sum())
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.no_time and args.exhaustive:
        print("python -m benchmarks.tune: --no-time and --exhaustive exclude each other (the sweep is timing)",
              file=sys.stderr)
        return 2
    from helpers import gpu, tune
    from helpers.suites import suite
    from helpers.variants import get

    try:
        spaces = [tune.space_of(v) for v in args.variants] if args.variants else None
    except KeyError as e:
        print(f"python -m benchmarks.tune: {e.args[0]}", file=sys.stderr)
        return 2
    if not gpu.has_gpu():
        print("python -m benchmarks.tune needs an NVIDIA GPU: torch sees no CUDA device here.", file=sys.stderr)
        return 2
    import pandas as pd

    if spaces is None:  # every space whose variant builds for this GPU (the Hopper days' only on 9.0)
        tune.space_of("igemm_production")  # imports the days package: every space registers
        cc = gpu.device_info().cc
        spaces = [sp for sp in tune.SPACES.values() if get(sp.variant).build_reason(cc) is None]
    ver = gpu.versions()
    out_dir = args.out or RESULTS / gpu.gpu_slug(ver["gpu"])
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.TemporaryDirectory() if args.cold else None
    cache = tune.TuneCache(Path(tmp.name) / "tune.json" if tmp else args.cache)
    problems = suite(args.suite, dtype=args.dtype, layout=args.layout)
    status = 0
    for space in spaces:
        t0 = time.perf_counter()
        keep = tune.KEEP if args.keep is None else args.keep
        df = tune.tune(space.variant, problems, cache, keep=keep, exhaustive=args.exhaustive,
                       budget_s=args.budget, progress=not args.no_progress, timed=not args.no_time)
        wall_s = time.perf_counter() - t0
        untimed = "_untimed" if args.no_time else ""
        ran = get(space.variant).adapt(problems[0], op=True)  # the dtype and layout the variant ran in
        stem = out_dir / f"tune_{args.suite}_{space.variant}_{ran.dtype}_{ran.layout}{untimed}"
        if "sweep" in df:
            write_sweep(df, stem.with_name(stem.name + "_sweep.csv"))
            df = add_top_k(df).drop(columns=[c for c in ("sweep", "sweep_variations") if c in df])
        df.to_csv(stem.with_suffix(".csv"), index=False)  # the tuning, before cuDNN's columns: kept if they fail
        if not (args.no_cudnn or args.no_time):
            base = get(space.variant)
            extra = []
            for p, st in zip(problems, df.status):
                try:
                    extra.append(cudnn_columns(base.adapt(p, op=True)) if st == "ok" else {})
                except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                    extra.append({"cudnn_error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"})
            df = pd.concat([df, pd.DataFrame(extra, index=df.index)], axis=1)
            if "cudnn_ms" in df:
                df["x_cudnn"] = df.cudnn_ms / df.ms
                df["rule_x_cudnn"] = df.cudnn_ms / df.rule_ms
        for k, v in ver.items():
            df[k] = v
        df["date"] = dt.date.today().isoformat()
        path = stem.with_suffix(".csv")
        df.to_csv(path, index=False)
        s = summary(df)
        print(f"{space.variant} on {args.suite}: {s} | wall {wall_s:.1f} s (tuning, without cuDNN) -> {path}")
        status |= int((~df.status.eq("ok") & ~df.status.str.startswith("unsupported")).any())
    if tmp:
        tmp.cleanup()
    return status


if __name__ == "__main__":
    sys.exit(main())
