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


def check(
    variant,
    problem: Conv2dProblem,
    kind: str = "normal",
    seed: int = 0,
    accum: str | None = None,
    device: str = "cuda",
) -> CheckResult:
    """Run ``variant`` twice on seeded inputs and judge it (see the module docstring).

    Args:
        variant: a registered name or `Variant`.
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
    x, w = problem.make_inputs(device=device, kind=kind, seed=seed)
    launch, y1 = prepare(v, problem, x, w)
    y1.fill_(float("nan"))
    launch()
    y2 = torch.full_like(y1, float("nan"))
    launch2, _ = prepare(v, problem, x, w, y2)
    launch2()
    torch.cuda.synchronize()
    repeat_ok = bitwise_equal(y1, y2)
    del y2
    r = compare(problem, x, w, y1, accum=accum, exact=(kind == "int"))
    reasons = []
    if r["nonfinite"]:
        reasons.append(f"{r['nonfinite']} NaN/Inf outputs (unwritten or overflowed)")
    if r["worst_err_over_bound"] > 1:
        reasons.append(f"error {r['worst_err_over_bound']:.3g}x the rounding bound")
    lim = rel_l2_limit(problem, accum)
    # With kind="cancel" the exact result is 0, so a relative error means nothing there; the
    # element-wise bound (scaled by conv(|x|, |w|)) is the test.
    if kind != "cancel" and r["rel_l2"] > lim:
        reasons.append(f"relative L2 error {r['rel_l2']:.3g} > {lim:.3g}")
    if r["exact_equal"] is False:
        reasons.append("integer inputs but not bit-exact")
    if not repeat_ok:
        reasons.append("second run differs bitwise (race?)")
    return CheckResult(
        variant=v.name,
        problem=problem.name,
        kind=kind,
        ok=not reasons,
        reason="; ".join(reasons),
        max_abs_err=r["max_abs_err"],
        worst_err_over_bound=r["worst_err_over_bound"],
        rel_l2=r["rel_l2"],
        nonfinite=r["nonfinite"],
        exact=r["exact_equal"],
        repeat_bitwise=repeat_ok,
    )


# ---- fused epilogues (day 12) -----------------------------------------------------------------


@dataclass(frozen=True)
class Epilogue:
    """D = act(alpha · conv(x, w) + beta · Cin + bias), act = ReLU if ``relu`` else identity.

    The operands of a fused epilogue (CUTLASS's ``LinearCombination`` / ``LinearCombinationRelu``):
    ``Cin`` has y's shape, layout and dtype (a residual, or y itself for an in-place update);
    ``bias`` has K elements. The defaults give the plain convolution.
    """

    alpha: float = 1.0
    beta: float = 0.0
    relu: bool = False


def reference_epilogue(
    problem: Conv2dProblem,
    x: torch.Tensor,
    w: torch.Tensor,
    epilogue: Epilogue,
    cin: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    absolute: bool = False,
) -> torch.Tensor:
    """The float64 result of ``epilogue`` applied to conv(x, w), logical NCHW, on x's device.

    With ``absolute`` it returns |alpha|·conv(|x|, |w|) + |beta·Cin| + |bias| instead (no
    activation), the scale of the rounding bound in `check_epilogue`. Small problems only (one
    float64 copy of the whole output).
    """
    x4, w4 = problem.to_nchw(x), problem.w_to_kcrs(w)
    conv = reference_band(problem, x4, w4, 0, problem.N, 0, problem.P, absolute=absolute)
    f = abs if absolute else (lambda v: v)
    out = f(epilogue.alpha) * conv
    if cin is not None and epilogue.beta != 0:
        out = out + f(epilogue.beta * problem.to_nchw(cin).to(torch.float64))
    if bias is not None:
        out = out + f(bias.to(torch.float64)).view(1, -1, 1, 1)
    if epilogue.relu and not absolute:
        out = out.clamp_min(0.0)
    return out


def check_epilogue(
    prepare_fn,
    problem: Conv2dProblem,
    epilogue: Epilogue,
    with_cin: bool = True,
    with_bias: bool = True,
    in_place: bool = False,
    kind: str = "normal",
    seed: int = 0,
    accum: str = "fp32",
) -> CheckResult:
    """Judge a fused conv + epilogue kernel against `reference_epilogue` (small problems).

    ``prepare_fn(problem, x, w, cin, bias, epilogue, y) -> (launch, y)`` compiles and validates
    (e.g. `helpers.pipelined.prepare_fused`). Cin and bias are seeded like x (``kind``); with
    ``in_place`` y starts as a copy of Cin and is passed as Cin too (y += ...), otherwise y is
    NaN-poisoned before each launch. Fails on NaN/Inf, on an element over the bound
    (gamma_n + 4·u_acc + u_out) · (|alpha|·conv(|x|,|w|) + |beta·Cin| + |bias|) (the conv's bound
    plus one fp32 rounding per epilogue operation and the final rounding; ReLU cannot increase
    an error), on a relative L2 error over `rel_l2_limit`, on a non-bitwise repeat, and with
    ``kind="int"`` (and integer alpha, beta) on any difference from the reference.

    Raises:
        ValueError: ``in_place`` without ``with_cin``; whatever ``prepare_fn`` raises.
    """
    if in_place and not with_cin:
        raise ValueError("in_place=True passes y as Cin: it needs with_cin=True")
    x, w = problem.make_inputs(device="cuda", kind=kind, seed=seed)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    dt = problem.torch_dtype

    def operand(shape):
        if kind == "int":
            return torch.randint(-4, 5, shape, generator=g, device="cuda").to(dt)
        return torch.randn(shape, generator=g, device="cuda").to(dt)

    cin = operand(problem.y_shape) if with_cin else None
    bias = operand((problem.K,)) if with_bias else None
    ref = reference_epilogue(problem, x, w, epilogue, cin, bias)
    outs = []
    for _ in range(2):
        if in_place:
            y = cin.clone()
            launch, y = prepare_fn(problem, x, w, y, bias, epilogue, y)
        else:
            y = torch.full(problem.y_shape, float("nan"), dtype=dt, device="cuda")
            launch, y = prepare_fn(problem, x, w, cin, bias, epilogue, y)
        launch()
        torch.cuda.synchronize()
        outs.append(y)
    repeat_ok = bitwise_equal(outs[0], outs[1])
    y4 = problem.to_nchw(outs[0])
    fin = torch.isfinite(y4)
    nonfinite = int((~fin).sum())
    yd = y4.to(torch.float64)
    err = torch.where(fin, (yd - ref).abs(), torch.full_like(ref, math.inf))
    u = UNIT_ROUNDOFF[accum]
    n = problem.gemm.k
    gamma = n * u / (1 - n * u)
    scale = reference_epilogue(problem, x, w, epilogue, cin, bias, absolute=True)
    bound = (gamma + 4 * u + UNIT_ROUNDOFF[problem.dtype]) * scale + 1e-300
    worst = float((err / bound).max())
    diff = torch.where(fin, yd - ref, torch.zeros_like(ref))
    ref_norm = float(ref.norm())
    rel_l2 = float(diff.norm()) / ref_norm if ref_norm > 0 else float(diff.norm())
    exact = bool(torch.equal(y4, ref.to(dt))) if kind == "int" else None
    reasons = []
    if nonfinite:
        reasons.append(f"{nonfinite} NaN/Inf outputs (unwritten or overflowed)")
    if worst > 1:
        reasons.append(f"error {worst:.3g}x the rounding bound")
    lim = rel_l2_limit(problem, accum)
    if rel_l2 > lim:
        reasons.append(f"relative L2 error {rel_l2:.3g} > {lim:.3g}")
    if exact is False:
        reasons.append("integer inputs but not bit-exact")
    if not repeat_ok:
        reasons.append("second run differs bitwise (race?)")
    return CheckResult(
        variant=getattr(prepare_fn, "__name__", "fused"),
        problem=problem.name,
        kind=kind,
        ok=not reasons,
        reason="; ".join(reasons),
        max_abs_err=float(err.max()),
        worst_err_over_bound=worst,
        rel_l2=rel_l2,
        nonfinite=nonfinite,
        exact=exact,
        repeat_bitwise=repeat_ok,
    )
