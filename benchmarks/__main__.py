"""python -m benchmarks: check every variant on a suite, time it and cuDNN, save CSV and PNG.

    python -m benchmarks --suite quick
    python -m benchmarks --suite seed --variants naive z_out
    python -m benchmarks --suite resnet50 --dtype fp16 --layout NHWC
    python -m benchmarks --suite resnet50 --dtype fp16 --layout NHWC --tuned   # + the tuned flavours

Without ``--dtype``/``--layout`` every variant (or each named with ``--variants``) runs in its own
layout and dtype, against cuDNN in that layout and dtype; ``--dtype``/``--layout`` convert the
suite and pin it: by default only the variants that take it run, and a named variant that does
not take it is refused (and the run exits 1). Writes ``benchmarks/results/<gpu>/<suite>.csv`` and
``.png`` (suffixed with dtype/layout when given). The CSV's rows carry the GPU, driver, CUDA,
torch, cuDNN and pycuda versions.
The CSV is written after every problem, so an interrupted run (Ctrl-C: exit 130) keeps what it
measured; a fault in one (variant, problem) is recorded as its row and the run goes on.
Exit status: 0 if every check passed, 1 if any failed or faulted, if no (variant, problem) pair
was checked at all (every one refused: e.g. ``--suite depthwise --dtype fp16 --layout NHWC``), or
if a variant named with ``--variants`` ran on no problem of the suite; 2 without an NVIDIA GPU or
on bad arguments.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from helpers.suites import SUITES

    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="quick", choices=sorted(SUITES), help="problem suite (default: quick)")
    ap.add_argument("--variants", nargs="+", default=None, help="variant names (default: all registered)")
    ap.add_argument("--dtype", default=None, choices=["fp32", "fp16", "bf16"], help="override the suite's dtype")
    ap.add_argument("--layout", default=None, choices=["NCHW", "NHWC"], help="override the suite's layout")
    ap.add_argument("--op", default="fprop", choices=["fprop", "dgrad", "wgrad"],
                    help="the operation (default: fprop); dgrad/wgrad time cuDNN's backward baselines")
    ap.add_argument("--out", type=Path, default=None, help="results folder (default: benchmarks/results/<gpu>)")
    ap.add_argument("--no-check", action="store_true", help="time without checking correctness first")
    ap.add_argument("--skip-big", action="store_true", help="leave out problems with tensors of >= 2^31 elements")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--tuned", nargs="?", const="default", default=None, metavar="CACHE",
                    help="also run each tunable variant's tuned flavour (<name>_tuned: the choice python -m "
                         "benchmarks.tune cached, the rule's where none), from CACHE or the default cache")
    return ap.parse_args(argv)


def with_tuned(vs: list, cache_path: str | None) -> list:
    """``vs`` and, after each variant with a search space (`helpers.tune.SPACES`), its tuned flavour
    (`helpers.tune.tuned`) reading the cache at ``cache_path`` ("default": `helpers.tune.default_cache_path`)."""
    from helpers import tune

    cache = tune.TuneCache(None if cache_path in (None, "default") else Path(cache_path))
    out = []
    for v in vs:
        out.append(v)
        try:
            out.append(tune.tuned(v.name, cache))
        except KeyError:  # no search space: nothing to add
            pass
    return out


def default_variants(args: argparse.Namespace) -> list:
    """Without ``--variants``: every variant of ``--op``, each run in its own layout and dtype
    (`helpers.bench.bench` adapts the suite's problems); with ``--dtype``/``--layout``, the
    variants that take that dtype and layout as they are (the suite's default: fp32, NCHW)."""
    from helpers import variants

    vs = [v for v in variants.all_variants() if v.op == args.op]
    if not (args.dtype or args.layout):
        return vs
    dtype, layout = args.dtype or "fp32", args.layout or "NCHW"
    return [v for v in vs if dtype in v.dtypes and layout in v.layouts]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from helpers import gpu, variants

    try:  # bad arguments are reported as such, GPU or not
        vs = [variants.get(v) for v in args.variants] if args.variants else default_variants(args)
    except KeyError as e:
        print(f"python -m benchmarks: {e.args[0]}", file=sys.stderr)
        return 2
    if not vs and args.op != "fprop" and not any(v.op == args.op for v in variants.all_variants()):
        print(f"python -m benchmarks: no variant computes {args.op} yet: timing cuDNN's {args.op} baseline only",
              file=sys.stderr)
    elif not vs:
        takes = sorted({f"{d} {layout}" for v in variants.all_variants() for d in v.dtypes for layout in v.layouts})
        print(f"python -m benchmarks: no variant takes {args.dtype or 'fp32'} {args.layout or 'NCHW'}; "
              f"the variants take: {', '.join(takes)} (e.g. --dtype fp16 --layout NHWC)", file=sys.stderr)
        return 2

    if not gpu.has_gpu():
        print(
            "python -m benchmarks needs an NVIDIA GPU: torch sees no CUDA device here.\n"
            "The CPU-only parts (tests, problem shapes) run with: python -m pytest tests",
            file=sys.stderr,
        )
        return 2
    try:
        gpu.init()
    except gpu.NoGPUError as e:
        print(f"python -m benchmarks: {e}", file=sys.stderr)
        return 2
    if args.tuned:
        vs = with_tuned(vs, args.tuned)

    import pandas as pd

    from helpers import suites
    from helpers.bench import bench, cudnn_fp32_ieee, geomean_x_cudnn

    probs = suites.suite(args.suite, dtype=args.dtype, layout=args.layout, op=None if args.op == "fprop" else args.op)
    if args.skip_big:
        probs = [p for p in probs if not suites.is_big(p)]
    meta = gpu.versions()
    with cudnn_fp32_ieee() as prec:
        meta = {**meta, "cudnn_fp32_precision": prec, "suite": args.suite,
                "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")}
    stem = args.suite if args.op == "fprop" else f"{args.suite}_{args.op}"
    if args.dtype or args.layout:
        stem += "_" + "_".join(s for s in (args.dtype, args.layout) if s)
    out = args.out or RESULTS / gpu.gpu_slug(meta["gpu"])
    out.mkdir(parents=True, exist_ok=True)
    csv = out / f"{stem}.csv"

    def write(df: pd.DataFrame) -> None:
        """The CSV as the run goes (after every problem), so an interrupted run keeps what it measured."""
        df.assign(**meta).to_csv(csv, index=False)

    try:
        # --dtype/--layout pin the suite's dtype and layout: variants run in them or are refused, never adapted
        adapt = not (args.dtype or args.layout)
        df = bench(vs, probs, check=not args.no_check, adapt=adapt, progress=not args.no_progress, on_rows=write)
    except KeyboardInterrupt:
        print(f"\ninterrupted: {csv} holds the problems finished so far", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - bench records per-(variant, problem) faults; this is anything else
        print(f"\npython -m benchmarks stopped: {type(e).__name__}: {e}\n{csv} holds the problems finished "
              "so far (if any); it is partial", file=sys.stderr)
        return 1
    df = df.assign(**meta)
    df.to_csv(csv, index=False)
    from benchmarks.plot import redraw

    redraw(csv)

    pd.set_option("display.width", 200)
    shown = df[["problem", "variant", "ms_p50", "x_cudnn", "tflops", "status"]]
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    gm = geomean_x_cudnn(df, checked=not args.no_check)
    label = "geomean x cuDNN" + (" (unchecked)" if args.no_check else "")
    print(f"\n{label}:", ", ".join(f"{k} {v:.3f}" for k, v in gm.items()))
    print(f"wrote {out / stem}.csv and .png  ({meta['gpu']}, driver {meta['driver']}, CUDA {meta['cuda']}, "
          f"torch {meta['torch']}, cuDNN {meta['cudnn']})")
    failed = df[df.ok == False]  # noqa: E712 - ok is True/False/None
    if len(failed):
        print(f"\n{len(failed)} FAILED checks or faults:", file=sys.stderr)
        print(failed[["problem", "variant", "status"]].to_string(index=False), file=sys.stderr)
        return 1
    ran = set(df.variant[df.ms_p50.notna() & (df.status != "baseline")])
    idle = [v.name for v in vs if v.name not in ran]
    if args.variants and idle:  # asked for by name, yet nothing was checked or timed
        print(f"\npython -m benchmarks: {', '.join(idle)} ran on no problem of the {args.suite} suite "
              f"({', '.join(sorted(set(df.status[df.variant.isin(idle)].str.split(':').str[0])))})",
              file=sys.stderr)
        return 1
    ours = df[df.status != "baseline"]
    done = ours.ms_p50.notna() if args.no_check else ours.ok.notna()
    if vs and not done.any():  # every (variant, problem) pair refused or skipped: nothing was checked
        why = ", ".join(sorted(set(ours.status.astype(str).str.split(":").str[0]))) or "no rows"
        pinned = " ".join(s for s in (args.dtype, args.layout) if s)
        print(f"\npython -m benchmarks: no variant was {'timed' if args.no_check else 'checked'} on any problem of "
              f"the {args.suite} suite{' in ' + pinned if pinned else ''} ({why}): nothing was verified",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
