"""Variants × problems → one tidy DataFrame, with cuDNN as just another row.

The cuDNN row runs the problem's operation through torch with ``torch.backends.cudnn.benchmark =
True`` (cuDNN tries its algorithms once per shape and keeps the fastest): fprop
``torch.nn.functional.conv2d``; dgrad and wgrad ``torch.ops.aten.convolution_backward`` with the
output mask of the one gradient wanted (see `cudnn_launcher`). For fp32 problems TF32 is turned
**off** (``torch.backends.cudnn.conv.fp32_precision = "ieee"``; ``allow_tf32 = False`` on older
torch): torch 2.11 runs fp32 convolutions in TF32 by default, a 10-bit-mantissa format that
would not be a like-for-like baseline for an fp32 kernel. fp16/bf16 run in channels_last.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable

import pandas as pd
import torch
import torch.nn.functional as F

from .problem import Conv2dProblem

COLUMNS = [
    "variant", "day", "problem", "ok", "status", "ms_p50", "ms_p20", "ms_p80", "reps",
    "tflops", "gbps", "x_cudnn", "rel_l2", "worst_err_over_bound", "exact",
]  # fmt: skip


@contextlib.contextmanager
def cudnn_fp32_ieee():
    """cuDNN with autotuning on and TF32 off for fp32; restores the previous settings.

    Yields the precision torch reports back (``"ieee"``), so callers can record it.
    """
    b = torch.backends.cudnn
    old_bench = b.benchmark
    conv = getattr(b, "conv", None)
    old_prec = getattr(conv, "fp32_precision", None) if conv is not None else None
    old_tf32 = b.allow_tf32
    b.benchmark = True
    if old_prec is not None:
        conv.fp32_precision = "ieee"
        prec = conv.fp32_precision
    else:  # torch < 2.9
        b.allow_tf32 = False
        prec = "ieee" if not b.allow_tf32 else "tf32"
    try:
        yield prec
    finally:
        b.benchmark = old_bench
        if old_prec is not None:
            conv.fp32_precision = old_prec
        else:
            b.allow_tf32 = old_tf32


def cudnn_launcher(problem: Conv2dProblem, a: torch.Tensor, b: torch.Tensor):
    """A closure that runs cuDNN's version of the problem's operation once and returns its output.

    Args:
        problem: the problem; its ``op`` picks the call.
        a, b: the op's inputs in `Conv2dProblem.inputs` order — fprop (x, w), dgrad (dy, w),
            wgrad (x, dy) — in the problem's layout, on one device.

    The closure returns y (fprop), dx (dgrad) or dw (wgrad) as a logical NCHW/KCRS tensor
    (channels_last-strided for NHWC problems: `Conv2dProblem.from_logical` of it is the kernel's
    layout, values as `helpers.check.reference`):

    * fprop: ``torch.nn.functional.conv2d(x, w, ...)``;
    * dgrad: ``torch.ops.aten.convolution_backward(dy, x, w, None, stride, padding, dilation,
      False, [0, 0], groups, [True, False, False])[0]``, where x only gives the shape (a zero
      tensor allocated once, here, not in the closure);
    * wgrad: the same call with mask ``[False, True, False]``, taking ``[1]``; here w is the
      shape-only tensor.

    The measured alternative, ``torch.nn.grad.conv2d_input`` with a channels_last dy, is several
    times slower (0.709 ms against 0.142 ms for dgrad at N=256 C64 56×56 K64 3×3 fp16 on the
    H200), hence ``convolution_backward`` directly. For NHWC problems every tensor is handed to
    torch as a channels_last view of the logical NCHW/KCRS tensor (`Conv2dProblem.to_logical`),
    which is what selects cuDNN's NHWC kernels. Call inside `cudnn_fp32_ieee`.
    """
    a4, b4 = problem.to_logical(a), problem.to_logical(b)
    kw = problem.torch_kwargs()
    if problem.op == "fprop":

        def launch() -> torch.Tensor:
            return F.conv2d(a4, b4, **kw)

        return launch
    return _backward_launcher(problem, a4, b4)


def _backward_launcher(problem: Conv2dProblem, a4: torch.Tensor, b4: torch.Tensor):
    """`cudnn_launcher` for dgrad/wgrad: one ``aten.convolution_backward`` with a one-gradient mask."""
    p = problem
    fmt = torch.channels_last if p.layout == "NHWC" else torch.contiguous_format
    if p.op == "dgrad":
        dy4, w4 = a4, b4
        x4 = torch.empty((p.N, p.C, p.H, p.W), dtype=dy4.dtype, device=dy4.device, memory_format=fmt)
        x4.zero_()
        mask, which = [True, False, False], 0
    else:
        x4, dy4 = a4, b4
        w4 = torch.empty((p.K, p.C_per_group, p.R, p.S), dtype=dy4.dtype, device=dy4.device, memory_format=fmt)
        w4.zero_()
        mask, which = [False, True, False], 1
    stride, padding, dilation = list(p.stride), list(p.padding), list(p.dilation)

    def launch() -> torch.Tensor:
        return torch.ops.aten.convolution_backward(
            dy4, x4, w4, None, stride, padding, dilation, False, [0, 0], p.groups, mask
        )[which]

    return launch


def _row(problem: Conv2dProblem, variant: str, day: int, **kw) -> dict:
    r = {c: math.nan for c in COLUMNS}
    r.update(problem.as_dict())
    r.update(variant=variant, day=day, ok=None, status="", exact=None)
    r.update(kw)
    return r


def _rates(problem: Conv2dProblem, ms: float) -> dict:
    return {"tflops": problem.flops / (ms * 1e-3) / 1e12, "gbps": problem.min_bytes / (ms * 1e-3) / 1e9}


def bench(
    variants: Iterable,
    problems: Iterable[Conv2dProblem],
    *,
    check: bool = True,
    kinds: tuple[str, ...] = ("normal", "int"),
    cudnn: bool = True,
    progress: bool = True,
    timing_kw: dict | None = None,
) -> pd.DataFrame:
    """Check and time every variant on every problem it supports, and cuDNN on every problem.

    Args:
        variants: names or `Variant` objects.
        problems: `Conv2dProblem` list (a suite).
        check: run `helpers.check.check` first for each kind in ``kinds``; a variant that
            fails is not timed (its row has ``ok=False`` and the reason in ``status``).
        cudnn: add a ``cudnn`` row per problem and the ``x_cudnn`` column
            (cuDNN's median time / the variant's median time: > 1 means faster than cuDNN).
        progress: show a tqdm progress bar.
        timing_kw: passed to `helpers.timing.time_gpu`.

    Returns:
        A DataFrame with one row per (variant, problem): the problem's fields (`as_dict`),
        ``ok`` (True/False, None for unsupported or cuDNN), ``status``, ``ms_p50``/``ms_p20``/
        ``ms_p80`` (ms), ``tflops`` (direct-conv FLOPs / median time, TFLOP/s), ``gbps``
        (minimum bytes / median time, GB/s), ``x_cudnn``, and the check's error measures.
    """
    from tqdm.auto import tqdm

    from .check import check as run_check
    from .gpu import device_info
    from .timing import time_gpu
    from .variants import get, prepare

    smem_limit = device_info().smem_per_block_optin
    vs = [get(v) for v in variants]
    problems = list(problems)
    rows: list[dict] = []
    timing_kw = timing_kw or {}
    bar = tqdm(total=len(problems) * (len(vs) + cudnn), disable=not progress, desc="bench")
    with cudnn_fp32_ieee():
        for p in problems:
            bar.set_postfix_str(p.name)
            cudnn_ms = math.nan
            x, w = p.make_inputs(device="cuda", kind="normal", seed=1)
            if cudnn:
                try:
                    t = time_gpu(cudnn_launcher(p, x, w), **timing_kw)
                    cudnn_ms = t.ms_p50
                    rows.append(_row(p, "cudnn", 0, status="baseline", ms_p50=t.ms_p50, ms_p20=t.ms_p20,
                                     ms_p80=t.ms_p80, reps=t.reps, x_cudnn=1.0, **_rates(p, t.ms_p50)))  # fmt: skip
                except RuntimeError as e:  # e.g. cuDNN refusing a shape: record, keep going
                    rows.append(_row(p, "cudnn", 0, status=f"error: {str(e).splitlines()[0][:200]}"))
                bar.update()
            for v in vs:
                reason = v.supports(p, smem_limit=smem_limit)
                if reason:
                    rows.append(_row(p, v.name, v.day, status=f"unsupported: {reason}"))
                    bar.update()
                    continue
                errs = {}
                if check:
                    results = [run_check(v, p, kind=k) for k in kinds if k != "cancel" or p.C_per_group % 2 == 0]
                    bad = [r for r in results if not r.ok]
                    normal = next((r for r in results if r.kind == "normal"), results[0])
                    exact = next((r.exact for r in results if r.kind == "int"), None)
                    errs = dict(rel_l2=normal.rel_l2, worst_err_over_bound=normal.worst_err_over_bound, exact=exact)
                    if bad:
                        status = "; ".join(f"FAIL {r.kind}: {r.reason}" for r in bad)
                        rows.append(_row(p, v.name, v.day, ok=False, status=status, **errs))
                        bar.update()
                        continue
                launch, _ = prepare(v, p, x, w)
                t = time_gpu(launch, **timing_kw)
                rows.append(_row(p, v.name, v.day, ok=True if check else None, status="ok" if check else "unchecked",
                                 ms_p50=t.ms_p50, ms_p20=t.ms_p20, ms_p80=t.ms_p80, reps=t.reps,
                                 x_cudnn=cudnn_ms / t.ms_p50, **_rates(p, t.ms_p50), **errs))  # fmt: skip
                bar.update()
            del x, w
    bar.close()
    df = pd.DataFrame(rows)
    front = [c for c in COLUMNS if c in df.columns]
    return df[front + [c for c in df.columns if c not in front]]


def geomean_x_cudnn(df: pd.DataFrame) -> pd.Series:
    """Geometric mean of ``x_cudnn`` per variant over the rows it was timed on (checked rows)."""
    d = df[(df.variant != "cudnn") & df.x_cudnn.notna() & (df.x_cudnn > 0)]
    return d.groupby("variant", sort=False).x_cudnn.apply(lambda s: float(math.exp(s.map(math.log).mean())))
