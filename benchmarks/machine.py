"""python -m benchmarks.machine: measure the tuner's machine on this GPU and write it down.

    python -m benchmarks.machine               # measure now, print, write benchmarks/results/<gpu>/machine.json
    python -m benchmarks.machine --cached      # this environment's cached measurement, if there is one
    python -m benchmarks.machine --out DIR     # write DIR/machine.json instead

`helpers.tune.probe.measure` runs the probe (a second or two: DRAM and L2 copies, the mma.sync
rate with fp32 accumulation, the FMA rate, the launch cost; the limits from the driver), the result
goes to the machine cache the tuner reads (`helpers.tune.probe.machine_for`, file
`helpers.tune.probe.default_machine_cache_path`), every value is printed with its unit, where it
comes from and its ratio to the committed H200 record day 15's figures use, and the record
(`helpers.tune.probe.record`) is written as ``machine.json``. The CPU tests read
``benchmarks/results/nvidia-h100-80gb-hbm3/machine.json`` once it is committed.
Exit status: 0 on success, 2 without a GPU, on a GPU below compute capability 8.0 or on bad
arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.machine", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cached", action="store_true",
                    help="use this environment's cached measurement if there is one (default: measure now)")
    ap.add_argument("--cache", type=Path, default=None,
                    help="machine cache file (default: helpers.tune.probe.default_machine_cache_path())")
    ap.add_argument("--out", type=Path, default=None, help="folder of machine.json (default: benchmarks/results/<gpu>)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from helpers import gpu
    from helpers.tune import probe

    if not gpu.has_gpu():
        print("python -m benchmarks.machine needs an NVIDIA GPU: torch sees no CUDA device here.", file=sys.stderr)
        return 2
    try:
        if args.cached:
            m = probe.machine_for(path=args.cache)
        else:
            m = probe.measure()
            probe.store(m, args.cache)
    except ValueError as e:  # below sm_80, or a limit the driver does not report
        print(f"python -m benchmarks.machine: {e}", file=sys.stderr)
        return 2
    rec = probe.record(m)
    try:
        h200 = probe.committed("nvidia-h200").as_dict()
    except (FileNotFoundError, ValueError):
        h200 = {}
    print(f"{rec['gpu']} | driver {rec['environment']['driver']} | CUDA {rec['environment']['cuda']} | "
          f"torch {rec['environment']['torch']}")
    for name, value, how in probe.describe(m):
        ratio = f"{getattr(m, name) / h200[name]:6.2f}x" if h200.get(name) else " " * 7
        print(f"  {name:24s} {value:>22s}  {ratio} the H200's  {how}")
    out_dir = args.out or RESULTS / gpu.gpu_slug(rec["gpu"])
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / probe.MACHINE_JSON
    path.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
