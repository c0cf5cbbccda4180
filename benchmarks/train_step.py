"""python -m benchmarks.train_step: day 14's training step on this series' kernels against torch's.

    python -m benchmarks.train_step                 # day 14's kernels, and Hopper's where the GPU has them
    python -m benchmarks.train_step --batch 128

The model and batch are day 14's (`days.day14_backward.train.make_pair(16, 64, 32, 2)`: a stem and
two ResNet bottleneck blocks, fp16, channels_last). For each kernel set (day 14's `Kernels()`:
days 13 and 14; on compute capability 9.0 also day 19's `HOPPER_KERNELS`: days 16, 18 and 19,
falling back to 13 and 14 layer by layer) and for torch (cuDNN):

* the time of one forward + backward at N = ``--batch`` on 56 x 56 images (day 14's timing):
  `helpers.timing.time_gpu` (CUDA events, warm-up, L2 flushed before each repetition, median
  with p20 / p80), in the same process, so the ratios compare like with like;
* the host's time to enqueue that forward + backward (`host_ms`: `HOST_STEPS` of them back to
  back, timed with ``time.perf_counter`` without synchronising): where it exceeds the GPU's time,
  the step is host-bound and the GPU waits for Python;
* the same forward + backward captured once in a CUDA graph (`helpers.gpu.capture`) and timed
  as its replay, on both sides: the launches are then the driver's, not Python's, so the time is
  the GPU's own (``graph_ms``, ``torch_graph_ms``, ``x_torch_graph``);
* the loss of ``--steps`` SGD steps on day 14's 28 x 28 batch of 8, against torch's on the same
  network (the largest relative difference; day 14's tolerance is 1e-2);
* which kernel ran for each layer and why a preferred one did not (`train.paths`).

Writes ``benchmarks/results/<gpu>/train_step.csv`` with the versions. Exit status: 0; 1 if a loss
curve differs from torch's by more than the tolerance; 2 without a GPU.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CSV_NAME = "train_step.csv"
TRAIN_TOL = 1e-2  # day 14's: each convolution differs from cuDNN's by its own fp16 rounding
HOST_STEPS = 5  # steps `host_ms` enqueues back to back: a few hundred launches, short of the GPU's launch queue


def kernel_sets(cc: tuple[int, int]) -> dict:
    """The kernel sets timed on a GPU of compute capability ``cc``: day 14's always, Hopper's on 9.0."""
    from days.day14_backward.train import Kernels
    from days.day16_igemm_wgmma import HOPPER_CC
    from days.day19_wgrad_wgmma import HOPPER_KERNELS

    sets = {"days 13-14": Kernels()}
    if tuple(cc) == tuple(HOPPER_CC):
        sets["days 16-19 (Hopper)"] = HOPPER_KERNELS
    return sets


def host_ms(step, steps: int = HOST_STEPS) -> float:
    """Host milliseconds to enqueue one call of ``step`` (GPU work that does not synchronise):
    after one call and a synchronisation, ``steps`` calls back to back timed with
    ``time.perf_counter``, without synchronising, then a synchronisation outside the time."""
    import torch

    step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed / steps * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.train_step", description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64, help="N of the timed forward + backward (default 64, day 14's)")
    ap.add_argument("--steps", type=int, default=4, help="SGD steps compared with torch's (default 4)")
    ap.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results/<gpu>)")
    args = ap.parse_args(argv)
    if args.batch < 1 or args.steps < 1:
        ap.error(f"--batch and --steps must be at least 1; got {args.batch} and {args.steps}")
    from helpers import gpu

    try:
        if not gpu.has_gpu():
            raise gpu.NoGPUError("torch sees no CUDA device here")
        info = gpu.device_info()
    except gpu.NoGPUError as e:
        print(f"python -m benchmarks.train_step needs an NVIDIA GPU: {e}", file=sys.stderr)
        return 2
    import pandas as pd
    import torch
    import torch.nn.functional as F

    from days.day14_backward import train
    from helpers.timing import time_gpu

    torch.manual_seed(0)
    nhwc = torch.channels_last
    x_small = torch.randn(8, 16, 28, 28, device="cuda", dtype=torch.float16).to(memory_format=nhwc)
    y_small = torch.randint(0, 10, (8,), device="cuda")
    x_big = torch.randn(args.batch, 16, 56, 56, device="cuda", dtype=torch.float16).to(memory_format=nhwc)
    y_big = torch.randint(0, 10, (args.batch,), device="cuda")

    def fwd_bwd(net):
        def step():
            net.zero_grad(set_to_none=True)
            F.cross_entropy(net(x_big).float(), y_big).backward()
        return step

    def graphed(net) -> tuple[float, str]:
        """(median ms of the step's graph replayed, "") or (NaN, why the capture failed): a
        failure is recorded in the row and the run goes on."""
        try:
            return time_gpu(gpu.capture(fwd_bwd(net)).replay, target_ms=100).ms_p50, ""
        except Exception as e:  # noqa: BLE001 - recorded, the eager rows still stand
            torch.cuda.synchronize()
            return float("nan"), f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"

    rows, bad = [], []
    ref_t = ref_host = ref_graph = None
    train.paths(clear=True)
    for name, kernels in kernel_sets(info.cc).items():
        ours, ref = train.make_pair(16, 64, 32, 2, kernels=kernels)
        a = train.train_steps(ours, x_small, y_small, args.steps)
        b = train.train_steps(ref, x_small, y_small, args.steps)
        diff = max(abs(la - lb) / abs(lb) for la, lb in zip(a["loss"], b["loss"]))
        if not all(abs(la - lb) <= TRAIN_TOL * abs(lb) for la, lb in zip(a["loss"], b["loss"])):  # NaN fails
            bad.append(name)
        ours_b, ref_b = train.make_pair(16, 64, 32, 2, kernels=kernels)
        t = time_gpu(fwd_bwd(ours_b), target_ms=100)
        ref_t = ref_t or time_gpu(fwd_bwd(ref_b), target_ms=100)
        host = host_ms(fwd_bwd(ours_b))
        ref_host = ref_host if ref_host is not None else host_ms(fwd_bwd(ref_b))
        g_ms, g_err = graphed(ours_b)
        ref_graph = ref_graph or graphed(ref_b)
        taken = train.paths(clear=True)  # this set's calls only
        ran = sorted({(op, pick.variant.name) for (op, _), pick in taken.items()})
        rows.append({"kernels": name, "ms_p50": t.ms_p50, "ms_p20": t.ms_p20, "ms_p80": t.ms_p80,
                     "torch_ms_p50": ref_t.ms_p50, "x_torch": ref_t.ms_p50 / t.ms_p50,
                     "host_ms": host, "torch_host_ms": ref_host, "graph_ms_p50": g_ms,
                     "torch_graph_ms_p50": ref_graph[0], "x_torch_graph": ref_graph[0] / g_ms,
                     "graph_error": "; ".join(e for e in (g_err, ref_graph[1]) if e),
                     "loss_max_rel_diff": diff, "ran": "; ".join(f"{op}: {v}" for op, v in ran)})
        for (op, layer), pick in sorted(taken.items()):
            print(f"  {name}: {op} {layer}: {pick}")
        print(f"{name}: forward + backward at N = {args.batch}: {t.ms_p50:.3f} ms (p20 {t.ms_p20:.3f}, p80 "
              f"{t.ms_p80:.3f}); torch {ref_t.ms_p50:.3f} ms; x torch {ref_t.ms_p50 / t.ms_p50:.3f}; host "
              f"{host:.3f} ms to enqueue (torch {ref_host:.3f}); in a CUDA graph {g_ms:.3f} ms (torch "
              f"{ref_graph[0]:.3f}; x torch {ref_graph[0] / g_ms:.3f}{'; ' + g_err if g_err else ''}); losses within "
              f"{diff:.2g} of torch's", flush=True)
    today = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    meta = {**gpu.versions(), "batch": args.batch, "steps": args.steps, "date": today}
    out = args.out or RESULTS / gpu.gpu_slug(meta["gpu"])
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).assign(**meta).to_csv(out / CSV_NAME, index=False)
    print(f"wrote {out / CSV_NAME}")
    if bad:
        print(f"loss curves off torch's by more than {TRAIN_TOL}: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
