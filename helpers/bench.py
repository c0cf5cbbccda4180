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
from collections.abc import Callable, Iterable

import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from . import gpu
from .check import check as run_check
from .launch import prepare
from .problem import Conv2dProblem
from .timing import time_gpu
from .variants import get

COLUMNS = [
    "variant", "day", "problem", "ok", "status", "ms_p50", "ms_p20", "ms_p80", "reps",
    "tflops", "gbps", "x_cudnn", "rel_l2", "worst_err_over_bound", "exact",
]


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
    layout, values as `helpers.reference.reference`):

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


def baseline_name(problem: Conv2dProblem, suite_problem: Conv2dProblem) -> str:
    """``"cudnn"`` for the suite's own dtype and layout; ``"cudnn <dtype> <layout>"`` for a
    problem adapted to a variant's (its own baseline row: ×cuDNN compares like with like)."""
    if (problem.dtype, problem.layout) == (suite_problem.dtype, suite_problem.layout):
        return "cudnn"
    return f"cudnn {problem.dtype} {problem.layout}"


class _SuiteProblem:
    """One suite problem inside `bench`: the seeded inputs and cuDNN's time of each adapted
    problem, made once and shared by the variants that run it; baseline rows go to ``rows``."""

    def __init__(self, suite_problem: Conv2dProblem, rows: list, cudnn: bool, timing_kw: dict):
        self.suite_problem, self.rows, self.cudnn, self.timing_kw = suite_problem, rows, cudnn, timing_kw
        self._inputs: dict = {}
        self._ms: dict = {}

    def inputs(self, p: Conv2dProblem) -> tuple:
        if p not in self._inputs:
            self._inputs[p] = p.make_inputs(device="cuda", kind="normal", seed=1)
        return self._inputs[p]

    def baseline(self, p: Conv2dProblem) -> float:
        """cuDNN's median ms on ``p`` (NaN without cuDNN or on its error), timed once, a row each."""
        if p in self._ms:
            return self._ms[p]
        self._ms[p] = math.nan
        if self.cudnn:
            name = baseline_name(p, self.suite_problem)
            try:
                t = time_gpu(cudnn_launcher(p, *self.inputs(p)), **self.timing_kw)
                self._ms[p] = t.ms_p50
                self.rows.append(_row(p, name, 0, status="baseline", ms_p50=t.ms_p50, ms_p20=t.ms_p20,
                                      ms_p80=t.ms_p80, reps=t.reps, x_cudnn=1.0, **_rates(p, t.ms_p50)))
            except Exception as e:  # noqa: BLE001 - e.g. cuDNN refusing a shape: record, keep going
                self.rows.append(_row(p, name, 0, status=f"error: {str(e).splitlines()[0][:200]}"))
        return self._ms[p]


def bench(
    variants: Iterable,
    problems: Iterable[Conv2dProblem],
    *,
    check: bool = True,
    kinds: tuple[str, ...] = ("normal", "int"),
    cudnn: bool = True,
    adapt: bool = True,
    progress: bool = True,
    timing_kw: dict | None = None,
    on_rows: Callable[[pd.DataFrame], None] | None = None,
) -> pd.DataFrame:
    """Check and time every variant on every problem it supports, and cuDNN on every problem.

    Args:
        variants: names or `Variant` objects.
        problems: `Conv2dProblem` list (a suite).
        check: run `helpers.check.check` first for each kind in ``kinds``; a variant that
            fails is not timed (its row has ``ok=False`` and the reason in ``status``).
        cudnn: add a baseline row per problem and the ``x_cudnn`` column (cuDNN's median time /
            the variant's median time: > 1 means faster than cuDNN).
        adapt: run each variant on the problem in its own layout and dtype
            (`helpers.variants.Variant.adapt`: e.g. an fp32 NCHW suite problem as fp16 NHWC for a
            tensor-core kernel), against cuDNN in that same layout and dtype (a baseline row
            named by `baseline_name`); without it, a variant that does not take the problem's
            layout or dtype gets an "unsupported" row.
        progress: show a tqdm progress bar.
        timing_kw: passed to `helpers.timing.time_gpu`.
        on_rows: called with the DataFrame so far after each suite problem (e.g. to write the CSV
            as the run goes, so an interrupted run keeps what it measured).

    A fault in one (variant, problem) — an exception from the check, the launch or the timer,
    out of memory included — becomes that row (``ok=False``, ``status`` "error: <type>:
    <message>") and the run goes on; a problem that does not fit the device's free memory
    (`memory_needed`) gets "skipped: <reason>" rows.

    Returns:
        A DataFrame with one row per (variant, problem): the problem's fields (`as_dict`, with
        the dtype and layout the variant ran in), ``ok`` (True/False, None for unsupported or
        cuDNN), ``status`` ("ok", "unchecked", "baseline", "unsupported: <reason>", "FAIL <kind>:
        ...", "error: ...", "skipped: ..."),
        ``ms_p50``/``ms_p20``/``ms_p80`` (ms), ``tflops`` (direct-conv FLOPs / median time,
        TFLOP/s), ``gbps`` (minimum bytes / median time, GB/s), ``x_cudnn``, and the check's error
        measures.
    """
    info = gpu.device_info()
    vs = [get(v) for v in variants]
    problems = list(problems)
    rows: list[dict] = []
    timing_kw = timing_kw or {}
    bar = tqdm(total=len(problems) * (len(vs) + cudnn), disable=not progress, desc="bench")
    with cudnn_fp32_ieee():
        for suite_p in problems:
            bar.set_postfix_str(suite_p.name)
            todo = {v.name: v.adapt(suite_p) if adapt else suite_p for v in vs}
            too_big = _too_big([suite_p, *todo.values()])
            if too_big:
                rows.append(_row(suite_p, "cudnn", 0, status=f"skipped: {too_big}"))
                rows += [_row(todo[v.name], v.name, v.day, status=f"skipped: {too_big}") for v in vs]
                bar.update(len(vs) + cudnn)
                if on_rows:
                    on_rows(_frame(rows))
                continue
            runs = _SuiteProblem(suite_p, rows, cudnn, timing_kw)
            runs.baseline(suite_p)
            bar.update(int(cudnn))
            for v in vs:
                p = todo[v.name]
                try:
                    rows.append(_bench_one(v, p, runs, info, check, kinds, timing_kw))
                except Exception as e:  # noqa: BLE001 - a fault in one (variant, problem) is recorded, the run goes on
                    if isinstance(e, torch.cuda.OutOfMemoryError):
                        torch.cuda.empty_cache()
                    msg = " ".join(str(e).split())[:300]
                    rows.append(_row(p, v.name, v.day, ok=False, status=f"error: {type(e).__name__}: {msg}"))
                bar.update()
            del runs
            if on_rows:
                on_rows(_frame(rows))
    bar.close()
    return _frame(rows)


def _frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    front = [c for c in COLUMNS if c in df.columns]
    return df[front + [c for c in df.columns if c not in front]]


def _bench_one(v, p: Conv2dProblem, runs: _SuiteProblem, info, check: bool, kinds: tuple, timing_kw: dict) -> dict:
    """The row of one (variant, problem): unsupported, failed checks, or checked and timed; the
    variant's plan for ``p`` is made once and run by each of them."""
    plan = v.plan(p)
    reason = plan.refusal(smem_limit=info.smem_per_block_optin, cc=info.cc)
    if reason:
        return _row(p, v.name, v.day, status=f"unsupported: {reason}")
    errs = {}
    if check:
        usable = [k for k in kinds if p.supports_kind(k) is None]  # e.g. "cancel" needs an even C/groups
        if not usable:
            why = "; ".join(f"{k}: {p.supports_kind(k)}" for k in kinds)
            return _row(p, v.name, v.day, status=f"skipped: no input kind of {kinds} applies ({why})")
        results = [run_check(plan, kind=k) for k in usable]
        bad = [r for r in results if not r.ok]
        normal = next((r for r in results if r.kind == "normal"), results[0])
        exact = next((r.exact for r in results if r.kind == "int"), None)
        errs = dict(rel_l2=normal.rel_l2, worst_err_over_bound=normal.worst_err_over_bound, exact=exact)
        if bad:
            status = "; ".join(f"FAIL {r.kind}: {r.reason}" for r in bad)
            return _row(p, v.name, v.day, ok=False, status=status, **errs)
    prepared, _ = prepare(plan, *runs.inputs(p))
    t = time_gpu(prepared, **timing_kw)
    return _row(p, v.name, v.day, ok=True if check else None, status="ok" if check else "unchecked",
                ms_p50=t.ms_p50, ms_p20=t.ms_p20, ms_p80=t.ms_p80, reps=t.reps,
                x_cudnn=runs.baseline(p) / t.ms_p50, **_rates(p, t.ms_p50), **errs)


REFERENCE_BAND_BYTES = 6 * 2**26 * 8  # `helpers.reference.compare`'s float64 bands: reference, |x|·|w| scale, errors


def memory_needed(p: Conv2dProblem) -> int:
    """Bytes of device memory `bench` needs at once for ``p``, an estimate: the timed inputs and
    the check's own (2 × the op's two inputs), the check's two outputs and the timed one (3 × the
    op's output), and the float64 reference bands of `helpers.reference.compare` (`REFERENCE_BAND_BYTES`)."""
    numel = {nm: math.prod(p.tensor_shape(nm)) for nm in (*p.inputs, p.output)}
    inputs = sum(numel[nm] for nm in p.inputs)
    return (2 * inputs + 3 * numel[p.output]) * p.itemsize + REFERENCE_BAND_BYTES


def _too_big(problems: list[Conv2dProblem]) -> str:
    """'' if the largest of ``problems`` fits the device's free memory (`memory_needed`), else why not."""
    need = max(memory_needed(p) for p in problems)
    try:
        free, _total = torch.cuda.mem_get_info()
    except Exception:  # noqa: BLE001 - free memory unknown: try the problem; an OOM becomes its row
        return ""
    if need <= free:
        return ""
    return (f"needs about {need / 1e9:.1f} GB of device memory (inputs, outputs, reference bands); "
            f"{free / 1e9:.1f} GB free")


def geomean(values) -> float:
    """Geometric mean of the positive finite values of ``values`` (NaN if there are none): how the
    series averages ratios such as ×cuDNN."""
    v = [float(a) for a in values if a == a and a > 0 and math.isfinite(a)]
    return math.exp(sum(math.log(a) for a in v) / len(v)) if v else math.nan


def geomean_x_cudnn(df: pd.DataFrame, checked: bool = True) -> pd.Series:
    """Geometric mean of ``x_cudnn`` per variant over the rows it was timed on: with ``checked``
    only the rows that passed their checks (``status == "ok"``), else only the ``--no-check``
    ones (``"unchecked"``); the two are never mixed, and baselines are left out."""
    d = df[(df.status == ("ok" if checked else "unchecked")) & df.x_cudnn.notna() & (df.x_cudnn > 0)]
    return d.groupby("variant", sort=False).x_cudnn.apply(geomean)
