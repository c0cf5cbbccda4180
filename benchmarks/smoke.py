"""python -m benchmarks.smoke: every variant once on a small problem it claims, checked.

    python -m benchmarks.smoke                                   # every registered variant
    python -m benchmarks.smoke --variants igemm_pipelined igemm_production   # just these
    compute-sanitizer --tool memcheck python -m benchmarks.smoke # the run the sanitizers watch
    compute-sanitizer --tool racecheck python -m benchmarks.smoke --variants shared
    python -m benchmarks.smoke --variants igemm_wgmma --configs  # each compiled configuration forced

Each variant runs `helpers.check.check` (normal and exact integer inputs) on the first problem
of `SMALL`, adapted to its layout and dtype, that it claims on this GPU; small enough that the
sanitizers (tens of times slower) finish in seconds. With ``--configs`` a variant that compiles
several configurations (``Variant.configs_fn``, e.g. day 16's schedules and tiles) runs each of
them forced instead of its automatic choice (day 16: and each schedule that loops over tiles on a
grid of one block, or one pair, so each block takes several tiles). Prints one line per variant.

Exit status: 0 if every variant passed, 1 if any failed or claimed none of the problems, 2
without a GPU or on an unknown variant.
"""

from __future__ import annotations

import argparse
import sys

from helpers.problem import Conv2dProblem

# Small problems that divide no tile, in the order tried: a "same" conv (days 01-06), a strided
# dilated one, few channels, a depthwise one, a tensor-core-friendly one (C % 8 == 0, K % 8 == 0)
# whose 612 x 136 GEMM gives a block of day 16's schedules on a grid of one block (`--configs`:
# `days.day16_igemm_wgmma.capped`) several tiles.
SMALL = [
    Conv2dProblem(N=2, C=3, H=13, W=11, K=5, R=3, S=3, padding=1),
    Conv2dProblem(N=2, C=6, H=13, W=11, K=10, R=3, S=2, stride=(2, 1), padding=(1, 0), dilation=(1, 2)),
    Conv2dProblem(N=1, C=3, H=17, W=15, K=8, R=5, S=5, padding=2),
    Conv2dProblem(N=2, C=8, H=11, W=9, K=8, R=3, S=3, padding=1, groups=8),
    Conv2dProblem(N=2, C=16, H=17, W=18, K=136, R=3, S=3, padding=1),
]


def smoke_problem(v, smem_limit: int | None = None, cc: tuple[int, int] | None = None) -> Conv2dProblem | None:
    """The first of `SMALL` (in ``v``'s operation, layout and dtype) that ``v`` claims, or None."""
    for p in SMALL:
        q = v.adapt(p, op=True)
        if v.supports(q, smem_limit=smem_limit, cc=cc) is None:
            return q
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.smoke", description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", nargs="+", default=None, help="variant names (default: all registered)")
    ap.add_argument("--configs", action="store_true",
                    help="run every compiled configuration of variants that have several, forced")
    args = ap.parse_args(argv)
    from helpers import gpu, variants
    from helpers.check import check

    try:
        vs = [variants.get(n) for n in args.variants] if args.variants else variants.all_variants()
    except KeyError as e:
        print(f"python -m benchmarks.smoke: {e.args[0]}", file=sys.stderr)
        return 2
    if args.configs:
        vs = [c for v in vs for c in (v.configs_fn() if v.configs_fn else [v])]
    if not gpu.has_gpu():
        print("python -m benchmarks.smoke needs an NVIDIA GPU: torch sees no CUDA device here", file=sys.stderr)
        return 2
    info = gpu.device_info()
    failed = []
    for v in vs:
        p = smoke_problem(v, smem_limit=info.smem_per_block_optin, cc=info.cc)
        if p is None:
            failed.append(v.name)
            print(f"NONE  {v.name}: claims none of the smoke problems on {info.name}")
            continue
        r = check(v, p)
        why = "" if r.ok else f"; {r.reason}"
        print(f"{'ok  ' if r.ok else 'FAIL'}  {v.name:22s} {p.name} ({p.dtype} {p.layout}) {r.kind}: "
              f"worst err / bound {r.worst_err_over_bound:.3g}{why}", flush=True)
        if not r.ok:
            failed.append(v.name)
    if failed:
        print(f"{len(failed)} variant(s) failed or claimed nothing: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
