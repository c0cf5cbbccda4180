"""Correctness checks that can fail: a float64 reference, poisoned outputs, a rounding bound.

`check` runs a variant on seeded inputs and compares with ``torch.nn.functional.conv2d`` in
float64 on the same (already rounded) inputs:

* the output is filled with NaN before every launch; any NaN/Inf left afterwards fails;
* every element must satisfy ``|y - ref| <= (gamma_n + u_out) * conv(|x|, |w|)``, the standard
  forward error bound of an n-term dot product in any summation order, with
  ``gamma_n = n*u / (1 - n*u)``, n = C/groups·R·S and u the accumulator's unit roundoff
  (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.1); ``u_out`` covers
  rounding the result to the output dtype. A wrong index breaks it by orders of magnitude;
* the relative L2 error must stay under a norm-wise limit (catches a dropped filter tap, which
  the worst-case element bound can miss on large reductions);
* with integer inputs (``kind="int"``) every product and partial sum is exact in fp32, so the
  output must equal the reference bit for bit;
* a second launch must give bitwise the same output (a race shows up as a difference).

Large problems are compared in bands of images and output rows, so a tensor of more than 2^31
elements needs no float64 copy of itself.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from .problem import Conv2dProblem

UNIT_ROUNDOFF = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8, "fp64": 2.0**-53, "double": 2.0**-53}


@dataclass
class CheckResult:
    """Outcome of `check`. ``ok`` is the verdict; ``reason`` says what failed, if anything.

    Errors are measured on the output in its own dtype against the float64 reference:
    ``max_abs_err``, ``worst_err_over_bound`` (≤ 1 passes), ``rel_l2`` (‖y − ref‖₂ / ‖ref‖₂).
    """

    variant: str
    problem: str
    kind: str
    ok: bool
    reason: str
    max_abs_err: float
    worst_err_over_bound: float
    rel_l2: float
    nonfinite: int
    exact: bool | None
    repeat_bitwise: bool

    def as_dict(self) -> dict:
        return asdict(self)


def _bands(problem: Conv2dProblem, max_elems: int):
    """Yield (n0, n1, p0, p1) blocks of the output whose input+output slices fit ``max_elems``."""
    p = problem
    per_image = p.C * p.H * p.W + p.K * p.P * p.Q
    if per_image <= max_elems:
        step = max(1, max_elems // per_image)
        for n0 in range(0, p.N, step):
            yield n0, min(p.N, n0 + step), 0, p.P
        return
    per_row = p.C * p.stride[0] * p.W + p.K * p.Q  # input rows per output row, roughly
    rows = max(1, max_elems // per_row)
    for n in range(p.N):
        for p0 in range(0, p.P, rows):
            yield n, n + 1, p0, min(p.P, p0 + rows)


def reference_band(
    problem: Conv2dProblem,
    x_nchw: torch.Tensor,
    w_kcrs: torch.Tensor,
    n0: int,
    n1: int,
    p0: int,
    p1: int,
    absolute: bool = False,
) -> torch.Tensor:
    """``conv2d`` of images n0..n1, output rows p0..p1, in float64, as NCHW.

    ``x_nchw`` and ``w_kcrs`` are logical NCHW/KCRS views (any dtype, any device). The input rows
    the band needs are sliced out and zero-padded by hand, so only the band is upcast. With
    ``absolute`` the band computes conv(|x|, |w|), the scale of the rounding bound.
    """
    p = problem
    sh, dh, ph = p.stride[0], p.dilation[0], p.padding[0]
    h_lo = p0 * sh - ph
    h_hi = (p1 - 1) * sh - ph + dh * (p.R - 1)  # inclusive
    rows = h_hi - h_lo + 1  # input rows the band reads, padding included
    top = min(max(-h_lo, 0), rows)  # of them above the image (all of them if the band lies in the padding)
    bottom = min(max(h_hi - (p.H - 1), 0), rows - top)  # and below it
    lo = min(max(h_lo, 0), p.H)
    xs = x_nchw[n0:n1, :, lo : lo + rows - top - bottom].to(torch.float64)
    ws = w_kcrs.to(torch.float64)
    if absolute:
        xs, ws = xs.abs(), ws.abs()
    if top or bottom:
        xs = F.pad(xs, (0, 0, top, bottom))
    return F.conv2d(
        xs,
        ws,
        stride=p.stride,
        padding=(0, p.padding[1]),
        dilation=p.dilation,
        groups=p.groups,
    )


def reference(problem: Conv2dProblem, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The whole float64 reference output, logical NCHW, on x's device (small problems only)."""
    x4, w4 = problem.to_nchw(x), problem.w_to_kcrs(w)
    return reference_band(problem, x4, w4, 0, problem.N, 0, problem.P)


def compare(
    problem: Conv2dProblem,
    x: torch.Tensor,
    w: torch.Tensor,
    y: torch.Tensor,
    accum: str = "fp32",
    exact: bool = False,
    max_elems: int = 2**26,
) -> dict:
    """Compare ``y`` (problem layout) with the float64 reference, band by band.

    Returns a dict with ``max_abs_err``, ``worst_err_over_bound``, ``rel_l2``, ``nonfinite`` and
    ``exact_equal`` (bitwise equal to the reference rounded to y's dtype).

    Raises:
        ValueError: ``y`` does not have the problem's output shape (it would broadcast).
    """
    p = problem
    if tuple(y.shape) != p.y_shape:
        raise ValueError(f"y must have shape {p.y_shape} ({p.layout}); got {tuple(y.shape)}")
    u_acc = UNIT_ROUNDOFF[accum]
    n = p.gemm.k
    gamma = n * u_acc / (1 - n * u_acc)
    u_out = UNIT_ROUNDOFF[p.dtype]
    x4, w4, y4 = p.to_nchw(x), p.w_to_kcrs(w), p.to_nchw(y)
    max_abs = worst = 0.0
    err2 = ref2 = 0.0
    nonfinite = 0
    exact_equal = True
    for n0, n1, p0, p1 in _bands(p, max_elems):
        ref = reference_band(p, x4, w4, n0, n1, p0, p1)
        yb = y4[n0:n1, :, p0:p1]
        fin = torch.isfinite(yb)
        nonfinite += int((~fin).sum())
        yd = yb.to(torch.float64)
        err = (yd - ref).abs()
        err = torch.where(fin, err, torch.full_like(err, math.inf))
        bound = (gamma + u_out) * reference_band(p, x4, w4, n0, n1, p0, p1, absolute=True) + 1e-300
        max_abs = max(max_abs, float(err.max()))
        worst = max(worst, float((err / bound).max()))
        err2 += float((torch.where(fin, yd - ref, torch.zeros_like(ref)) ** 2).sum())
        ref2 += float((ref**2).sum())
        if exact:
            exact_equal &= bool(torch.equal(yb, ref.to(yb.dtype)))
    rel_l2 = math.sqrt(err2 / ref2) if ref2 > 0 else math.sqrt(err2)
    return {
        "max_abs_err": max_abs,
        "worst_err_over_bound": worst,
        "rel_l2": rel_l2,
        "nonfinite": nonfinite,
        "exact_equal": exact_equal if exact else None,
    }


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when two tensors hold the same bits (NaN == NaN, -0.0 != +0.0)."""
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a.view(ints), b.view(ints)))


def rel_l2_limit(problem: Conv2dProblem, accum: str = "fp32") -> float:
    """Norm-wise limit: 16·sqrt(n)·u_acc + 4·u_out, at least 1e-4 for fp32 outputs.

    Rounding errors of an n-term sum grow like sqrt(n)·u on random data; a dropped or doubled
    filter tap moves the result by about 1/sqrt(n) relative, far above this.
    """
    n = problem.gemm.k
    return max(16 * math.sqrt(n) * UNIT_ROUNDOFF[accum] + 4 * UNIT_ROUNDOFF[problem.dtype], 1e-4)


def bound_coefficient(problem: Conv2dProblem, accum: str = "fp32", extra_roundings: int = 0) -> float:
    """The element-wise bound's factor: gamma_n + extra_roundings·u_acc + u_out, with
    gamma_n = n·u_acc / (1 − n·u_acc), n = the reduction length (C/groups·R·S for fprop) and
    u_out the output dtype's unit roundoff (Higham, §3.1). An element passes when
    |out − ref| <= factor · |op|(|a|, |b|)."""
    u = UNIT_ROUNDOFF[accum]
    n = problem.gemm.k
    return n * u / (1 - n * u) + extra_roundings * u + UNIT_ROUNDOFF[problem.dtype]


def judge(
    *,
    variant: str,
    problem: Conv2dProblem,
    kind: str,
    accum: str,
    nonfinite: int,
    max_abs_err: float,
    worst_err_over_bound: float,
    rel_l2: float,
    exact: bool | None,
    repeat_bitwise: bool,
) -> CheckResult:
    """The verdict of every check (`check`, `helpers.epilogue.check_epilogue`) from its measures.

    Fails on NaN/Inf outputs, an element over its bound (``worst_err_over_bound > 1``), a relative
    L2 error over `rel_l2_limit` (not for ``kind="cancel"``, whose exact result is 0, so only the
    element-wise bound scaled by |op|(|a|, |b|) means something), integer inputs that are not
    bit-exact (``exact is False``) and a second run that differs bitwise (a race).
    """
    reasons = []
    if nonfinite:
        reasons.append(f"{nonfinite} NaN/Inf outputs (unwritten or overflowed)")
    if worst_err_over_bound > 1:
        reasons.append(f"error {worst_err_over_bound:.3g}x the rounding bound")
    lim = rel_l2_limit(problem, accum)
    if kind != "cancel" and rel_l2 > lim:
        reasons.append(f"relative L2 error {rel_l2:.3g} > {lim:.3g}")
    if exact is False:
        reasons.append("integer inputs but not bit-exact")
    if not repeat_bitwise:
        reasons.append("second run differs bitwise (race?)")
    return CheckResult(
        variant=variant,
        problem=problem.name,
        kind=kind,
        ok=not reasons,
        reason="; ".join(reasons),
        max_abs_err=max_abs_err,
        worst_err_over_bound=worst_err_over_bound,
        rel_l2=rel_l2,
        nonfinite=nonfinite,
        exact=exact,
        repeat_bitwise=repeat_bitwise,
    )


def check(
    variant,
    problem: Conv2dProblem,
    kind: str = "normal",
    seed: int = 0,
    accum: str | None = None,
    device: str = "cuda",
) -> CheckResult:
    """Run ``variant`` twice on seeded inputs and judge it (see the module docstring and `judge`).

    Args:
        variant: a registered name or `helpers.variants.Variant`.
        problem: the problem; the variant must support it.
        kind: "normal", "int" (small integers; bit-exact expected) or "cancel" (exact result 0);
            see `Conv2dProblem.make_inputs`.
        seed: input seed.
        accum: accumulator precision for the bound ("fp32", "fp64"); default ``variant.accum``.

    Raises:
        UnsupportedProblem, TypeError, ValueError: from `helpers.variants.prepare`, before any launch.
    """
    from .variants import get, prepare

    v = get(variant)
    accum = accum or v.accum
    inputs = problem.make_inputs(device=device, kind=kind, seed=seed)
    launch, out1 = prepare(v, problem, *inputs)
    out1.fill_(float("nan"))
    launch()
    out2 = torch.full_like(out1, float("nan"))
    launch2, _ = prepare(v, problem, *inputs, out=out2)
    launch2()
    torch.cuda.synchronize()
    repeat_ok = bitwise_equal(out1, out2)
    del out2
    r = compare(problem, *inputs, out1, accum=accum, exact=(kind == "int"))
    return judge(
        variant=v.name,
        problem=problem,
        kind=kind,
        accum=accum,
        nonfinite=r["nonfinite"],
        max_abs_err=r["max_abs_err"],
        worst_err_over_bound=r["worst_err_over_bound"],
        rel_l2=r["rel_l2"],
        exact=r["exact_equal"],
        repeat_bitwise=repeat_ok,
    )
