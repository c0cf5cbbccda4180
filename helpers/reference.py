"""The float64 reference of each operation and the rounding bound a kernel's output is judged by
(no GPU needed: `helpers.check` runs the kernels and judges them with these).

The reference is the operation on the same (already rounded) inputs in float64 — fprop
``torch.nn.functional.conv2d``, dgrad ``torch.nn.grad.conv2d_input``, wgrad
``torch.nn.grad.conv2d_weight`` (both ``torch.ops.aten.convolution_backward`` with the mask of
one gradient) — and the verdict (`judge`):

* any NaN/Inf in the output fails (outputs are NaN-poisoned before every launch);
* every element must satisfy ``|out - ref| <= (gamma_n + u_out) * |op|(|a|, |b|)``, the standard
  forward error bound of an n-term dot product in any summation order, with
  ``gamma_n = n*u / (1 - n*u)``, n = `Conv2dProblem.reduction_length` (fprop C/groups·R·S,
  dgrad K/groups·R·S, wgrad N·P·Q), u the accumulator's unit roundoff and ``|op|(|a|, |b|)``
  the same operation on the absolute values of its two inputs (Higham, *Accuracy and
  Stability of Numerical Algorithms*, 2nd ed., §3.1); ``u_out`` covers rounding the result to
  the output dtype. A wrong index breaks it by orders of magnitude; an output element that no
  term reaches (a dgrad row no filter tap touches) must be exactly 0;
* the relative L2 error must stay under a norm-wise limit (catches a dropped filter tap, which
  the worst-case element bound can miss on large reductions);
* with integer inputs (``kind="int"``) every product and partial sum is exact in fp32, so the
  output must equal the reference bit for bit;
* a second launch must give bitwise the same output (a race shows up as a difference).

A variant whose arithmetic is not the operation's dot products (day 20's Winograd: transforms
before and after the channel sums, whose constants scale the rounding errors) brings its own
element bound, an `ErrorModel`: its coefficient, its scale per band in place of
``|op|(|a|, |b|)``, its floor, and whether integer inputs are still exact; `compare` and
`helpers.check.check` use it in place of the dot product's (``model=``).

Large problems are compared in bands (`_bands`), so a tensor of more than 2^31 elements needs no
float64 copy of itself: fprop by images and output rows, dgrad by images and dx rows (each band
reads the dy rows that reach it), wgrad by images and dy rows, whose partial dw sums are
accumulated in float64 before the comparison. `reference_epilogue` adds a fused epilogue.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from .epilogue import Epilogue
from .problem import Conv2dProblem

# Unit roundoff u = 2^-(mantissa bits + 1) of each accumulator / output dtype ("double" = "fp64").
UNIT_ROUNDOFF = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8, "fp64": 2.0**-53, "double": 2.0**-53}
# The absolute error of one rounding in the subnormal range: half the smallest subnormal (the
# relative bound u does not hold there; Higham §2.1). fp16 outputs below 6.1e-5 round with up to 2^-25.
# (fp64: the smallest subnormal itself, since half of it is 0 as a float.)
UNDERFLOW = {"fp32": 2.0**-150, "fp16": 2.0**-25, "bf16": 2.0**-134, "fp64": 2.0**-1074, "double": 2.0**-1074}


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


@dataclass(frozen=True)
class ErrorModel:
    """A variant's own element-wise rounding bound, for an algorithm whose rounding errors are not
    those of the operation's dot products (`Variant.error_model`; day 20's Winograd: its transforms'
    constants multiply the errors, and an output's error depends on input pixels the direct sum
    never reads). An element passes when ``|out − ref| <= coefficient · scale + floor``.

    Attributes:
        name: what the bound is, for messages (e.g. "Winograd F(4x4, 3x3)").
        coefficient: (problem, accum) -> the factor (e.g. γ_k of the longest rounding chain).
        scale: (problem, a4, b4, n0, n1, r0, r1) -> the nonnegative float64 tensor that replaces
            ``|op|(|a|, |b|)`` on a band of `_bands` (images n0..n1, output rows r0..r1; the op's
            inputs as logical NCHW/KCRS views, on their device), shaped as `reference_band`'s.
        floor: (problem, accum) -> the absolute term (roundings in the subnormal range).
        exact_on_integers: problem -> whether integer inputs (``kind="int"``) must still give the
            exact result (transforms with non-dyadic constants round even integers).
    """

    name: str
    coefficient: Callable[[Conv2dProblem, str], float]
    scale: Callable[..., torch.Tensor]
    floor: Callable[[Conv2dProblem, str], float]
    exact_on_integers: Callable[[Conv2dProblem], bool]


def _band_rows(problem: Conv2dProblem) -> int:
    """Length of the row axis `_bands` splits: y rows P (fprop), dx rows H (dgrad), dy rows P (wgrad)."""
    return problem.H if problem.op == "dgrad" else problem.P


def _bands(problem: Conv2dProblem, max_elems: int):
    """Yield (n0, n1, r0, r1) blocks whose input+output slices fit ``max_elems`` elements (roughly).

    Images n0..n1 and rows r0..r1 of the banded axis (`_band_rows`): output rows p of y for
    fprop, rows h of dx for dgrad, rows p of dy (part of the reduction) for wgrad. Whole images
    while one fits (x and y/dy together), else one image at a time in bands of rows. The blocks
    tile images × rows exactly once.
    """
    p = problem
    total = _band_rows(p)
    per_image = p.C * p.H * p.W + p.K * p.P * p.Q
    if per_image <= max_elems:
        step = max(1, max_elems // per_image)
        for n0 in range(0, p.N, step):
            yield n0, min(p.N, n0 + step), 0, total
        return
    if p.op == "dgrad":
        per_row = p.C * p.W + p.K * p.Q  # r dx rows read about r/stride_h (+ the filter span) dy rows
    else:
        per_row = p.C * p.stride[0] * p.W + p.K * p.Q  # input rows per output row, roughly
    rows = max(1, max_elems // per_row)
    for n in range(p.N):
        for r0 in range(0, total, rows):
            yield n, n + 1, r0, min(total, r0 + rows)


def _x_rows(problem: Conv2dProblem, x_nchw: torch.Tensor, n0: int, n1: int, p0: int, p1: int, absolute: bool):
    """The input rows that output rows p0..p1 read, images n0..n1, in float64, padded by hand in h.

    Convolving the result with padding (0, pad_w) gives exactly output rows p0..p1.
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
    if absolute:
        xs = xs.abs()
    if top or bottom:
        xs = F.pad(xs, (0, 0, top, bottom))
    return xs


def reference_band(
    problem: Conv2dProblem,
    a: torch.Tensor,
    b: torch.Tensor,
    n0: int,
    n1: int,
    r0: int,
    r1: int,
    absolute: bool = False,
) -> torch.Tensor:
    """The operation on images n0..n1 and rows r0..r1 (a block of `_bands`), in float64.

    ``a`` and ``b`` are the op's inputs (`Conv2dProblem.inputs` order) as logical NCHW/KCRS
    views (any dtype, any device; e.g. ``problem.to_logical(x)``). Only the slices the block
    needs are upcast. With ``absolute`` it computes |op|(|a|, |b|), the scale of the rounding
    bound. Returns, on a's device:

    * fprop, (a, b) = (x, w): y[n0:n1, :, r0:r1], shape (n1−n0, K, r1−r0, Q); the input rows
      the band needs are sliced out and zero-padded by hand;
    * dgrad, (a, b) = (dy, w): dx[n0:n1, :, r0:r1], shape (n1−n0, C, r1−r0, W), from the dy rows
      p with p·stride_h − pad_h + r·dil_h in [r0, r1) for some filter row r
      (``torch.nn.grad.conv2d_input``); rows no tap reaches are exactly 0;
    * wgrad, (a, b) = (x, dy): the part of dw, shape (K, C/groups, R, S), summed over images
      n0..n1 and dy rows r0..r1 only (``torch.nn.grad.conv2d_weight``); the whole dw is the
      sum over all blocks.
    """
    p = problem
    if p.op == "fprop":
        xs = _x_rows(p, a, n0, n1, r0, r1, absolute)
        ws = b.to(torch.float64)
        if absolute:
            ws = ws.abs()
        return F.conv2d(xs, ws, stride=p.stride, padding=(0, p.padding[1]), dilation=p.dilation, groups=p.groups)
    if p.op == "wgrad":
        xs = _x_rows(p, a, n0, n1, r0, r1, absolute)
        dys = b[n0:n1, :, r0:r1].to(torch.float64)
        if absolute:
            dys = dys.abs()
        return torch.nn.grad.conv2d_weight(
            xs, (p.K, p.C_per_group, p.R, p.S), dys,
            stride=p.stride, padding=(0, p.padding[1]), dilation=p.dilation, groups=p.groups,
        )
    # dgrad: dx row h = p·sh − ph + r·dh takes dy rows p in [ceil((h − span + ph)/sh), floor((h + ph)/sh)]
    sh, dh, ph = p.stride[0], p.dilation[0], p.padding[0]
    span = dh * (p.R - 1)
    out = torch.zeros((n1 - n0, p.C, r1 - r0, p.W), dtype=torch.float64, device=a.device)
    p_lo = max(0, -((span - ph - r0) // sh))  # ceil((r0 + ph - span) / sh), at least 0
    p_hi = min(p.P - 1, (r1 - 1 + ph) // sh)
    if p_lo > p_hi:
        return out  # no dy row reaches these dx rows
    dys = a[n0:n1, :, p_lo : p_hi + 1].to(torch.float64)
    ws = b.to(torch.float64)
    if absolute:
        dys, ws = dys.abs(), ws.abs()
    rows = (p_hi - p_lo) * sh + span + 1  # the input rows dy rows p_lo..p_hi read, unpadded in h
    t = torch.nn.grad.conv2d_input(
        (n1 - n0, p.C, rows, p.W), ws, dys,
        stride=p.stride, padding=(0, p.padding[1]), dilation=p.dilation, groups=p.groups,
    )
    t0 = p_lo * sh - ph  # the dx row of t's first row (may lie in the padding)
    lo, hi = max(r0, t0), min(r1, t0 + rows)
    if lo < hi:
        out[:, :, lo - r0 : hi - r0] = t[:, :, lo - t0 : hi - t0]
    return out


def _check_inputs(problem: Conv2dProblem, a: torch.Tensor, b: torch.Tensor) -> None:
    for name, t, shape in zip(problem.inputs, (a, b), problem.input_shapes):
        if tuple(t.shape) != shape:
            raise ValueError(
                f"{problem.op} takes {name} of shape {shape} ({problem.layout}) as input "
                f"{problem.inputs.index(name) + 1} of {problem.inputs}; got {tuple(t.shape)}"
            )


def reference(problem: Conv2dProblem, a: torch.Tensor, b: torch.Tensor, max_elems: int | None = None) -> torch.Tensor:
    """The whole float64 output of the operation, on a's device.

    Args:
        problem: the problem; its ``op`` picks the operation.
        a, b: the op's inputs in `Conv2dProblem.inputs` order — fprop (x, w), dgrad (dy, w),
            wgrad (x, dy) — in the problem's layout (any dtype).
        max_elems: ``None`` computes it in one call (float64 copies of the whole inputs);
            an int assembles it from `_bands` of about that many elements (wgrad: sums them).

    Returns:
        float64, logical layout: y (N, K, P, Q) or dx (N, C, H, W) as NCHW, dw (K, C/groups,
        R, S) as KCRS, whatever the problem's layout.

    Raises:
        ValueError: an input whose shape is not the problem's.
    """
    p = problem
    _check_inputs(p, a, b)
    a4, b4 = p.to_logical(a), p.to_logical(b)
    if max_elems is None:
        return reference_band(p, a4, b4, 0, p.N, 0, _band_rows(p))
    if p.op == "wgrad":
        out = torch.zeros((p.K, p.C_per_group, p.R, p.S), dtype=torch.float64, device=a.device)
        for n0, n1, r0, r1 in _bands(p, max_elems):
            out += reference_band(p, a4, b4, n0, n1, r0, r1)
        return out
    ch = p.K if p.op == "fprop" else p.C
    cols = p.Q if p.op == "fprop" else p.W
    out = torch.empty((p.N, ch, _band_rows(p), cols), dtype=torch.float64, device=a.device)
    for n0, n1, r0, r1 in _bands(p, max_elems):
        out[n0:n1, :, r0:r1] = reference_band(p, a4, b4, n0, n1, r0, r1)
    return out


class _Tally:
    """Running error measures of `compare` over blocks of the output."""

    def __init__(self, coefficient: float, floor: float, exact: bool) -> None:
        self.coefficient, self.floor, self.exact = coefficient, floor, exact
        self.max_abs = self.worst = self.err2 = self.ref2 = 0.0
        self.nonfinite = 0
        self.exact_equal = True

    def add(self, ob: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor) -> None:
        """One block: ``ob`` the output (its dtype), ``ref`` and ``scale`` = |op|(|a|, |b|) in float64."""
        fin = torch.isfinite(ob)
        self.nonfinite += int((~fin).sum())
        od = ob.to(torch.float64)
        err = (od - ref).abs()
        err = torch.where(fin, err, torch.full_like(err, math.inf))
        self.max_abs = max(self.max_abs, float(err.max()))
        self.worst = max(self.worst, float(err_over_bound(err, scale, self.coefficient, self.floor).max()))
        self.err2 += float((torch.where(fin, od - ref, torch.zeros_like(ref)) ** 2).sum())
        self.ref2 += float((ref**2).sum())
        if self.exact:
            self.exact_equal &= bool(torch.equal(ob, ref.to(ob.dtype)))


def expected(
    problem: Conv2dProblem, a: torch.Tensor, b: torch.Tensor, max_elems: int = 2**26
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The float64 reference of the whole output and its scale |op|(|a|, |b|) (both logical
    layout, on a's device), made once to `compare` many outputs of one problem (the tuner's
    candidates); None when the inputs and output together have more than ``max_elems`` elements
    (the float64 copies one call makes: then `compare` works band by band on each call).

    Args:
        problem, a, b: as for `reference`.
    """
    if a.numel() + b.numel() + math.prod(problem.output_shape) > max_elems:
        return None
    p = problem
    _check_inputs(p, a, b)
    a4, b4 = p.to_logical(a), p.to_logical(b)
    rows = _band_rows(p)
    return reference_band(p, a4, b4, 0, p.N, 0, rows), reference_band(p, a4, b4, 0, p.N, 0, rows, absolute=True)


def compare(
    problem: Conv2dProblem,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    accum: str = "fp32",
    exact: bool = False,
    max_elems: int = 2**26,
    expected: tuple[torch.Tensor, torch.Tensor] | None = None,
    model: ErrorModel | None = None,
) -> dict:
    """Compare the op's output ``out`` with its float64 reference, band by band (`_bands`).

    Args:
        problem: the problem; its ``op`` picks the operation.
        a, b: the op's inputs in `Conv2dProblem.inputs` order (fprop x, w; dgrad dy, w;
            wgrad x, dy) and ``out`` its output (y, dx or dw), all in the problem's layout.
        accum: the accumulator's precision for the bound ("fp32", "fp16", "bf16", "fp64").
        exact: also report whether ``out`` equals the reference rounded to its dtype bitwise.
        max_elems: about how many elements of the inputs and output one band may upcast.
        expected: the whole reference and its scale from `expected` (same problem and inputs),
            instead of computing them band by band.
        model: the variant's own bound (`ErrorModel`; fprop only), in place of the dot product's:
            its coefficient and floor, and its scale computed band by band.

    The element bound is ``(gamma_n + u_out) · |op|(|a|, |b|)`` with n =
    `Conv2dProblem.reduction_length` (vacuous, i.e. infinite, once n·u ≥ 1: then only NaN/Inf
    and the relative L2 error can fail). wgrad sums the reference and its scale over all bands
    in float64 before comparing.

    Returns:
        A dict with ``max_abs_err``, ``worst_err_over_bound`` (inf for a NaN/Inf element),
        ``rel_l2`` (‖out − ref‖₂ / ‖ref‖₂, or ‖out − ref‖₂ where ref is 0), ``nonfinite`` and
        ``exact_equal`` (None unless ``exact``).

    Raises:
        ValueError: ``out`` (or an input) does not have the problem's shape (it would broadcast);
            a ``model`` with ``expected`` or for another operation than fprop.
    """
    p = problem
    if tuple(out.shape) != p.output_shape:
        raise ValueError(f"{p.output} must have shape {p.output_shape} ({p.layout}); got {tuple(out.shape)}")
    _check_inputs(p, a, b)
    if model is not None and (expected is not None or p.op != "fprop"):
        raise ValueError(f"an error model ({model.name}) scales fprop bands itself: no `expected`, no {p.op}")
    if model is None:
        tally = _Tally(bound_coefficient(p, accum), bound_floor(p, accum), exact)
    else:
        tally = _Tally(model.coefficient(p, accum), model.floor(p, accum), exact)
    a4, b4, o4 = p.to_logical(a), p.to_logical(b), p.to_logical(out)
    if model is not None:
        for n0, n1, r0, r1 in _bands(p, max_elems):
            ref = reference_band(p, a4, b4, n0, n1, r0, r1)
            tally.add(o4[n0:n1, :, r0:r1], ref, model.scale(p, a4, b4, n0, n1, r0, r1))
    elif expected is not None:
        tally.add(o4, *expected)
    elif p.op == "wgrad":
        ref = torch.zeros(o4.shape, dtype=torch.float64, device=a.device)
        scale = torch.zeros_like(ref)
        for n0, n1, r0, r1 in _bands(p, max_elems):
            ref += reference_band(p, a4, b4, n0, n1, r0, r1)
            scale += reference_band(p, a4, b4, n0, n1, r0, r1, absolute=True)
        tally.add(o4, ref, scale)
    else:
        for n0, n1, r0, r1 in _bands(p, max_elems):
            ref = reference_band(p, a4, b4, n0, n1, r0, r1)
            scale = reference_band(p, a4, b4, n0, n1, r0, r1, absolute=True)
            tally.add(o4[n0:n1, :, r0:r1], ref, scale)
    t = tally
    rel_l2 = math.sqrt(t.err2 / t.ref2) if t.ref2 > 0 else math.sqrt(t.err2)
    return {
        "max_abs_err": t.max_abs,
        "worst_err_over_bound": t.worst,
        "rel_l2": rel_l2,
        "nonfinite": t.nonfinite,
        "exact_equal": t.exact_equal if exact else None,
    }


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when two tensors hold the same bits (NaN == NaN, -0.0 != +0.0)."""
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a.view(ints), b.view(ints)))


def rel_l2_limit(problem: Conv2dProblem, accum: str = "fp32") -> float:
    """Norm-wise limit: 16·sqrt(n)·u_acc + 4·u_out, at least 1e-4, n = `Conv2dProblem.reduction_length`.

    Rounding errors of an n-term sum grow like sqrt(n)·u on random data. A dropped or doubled
    filter tap moves the result by about 1/sqrt(n) relative: above this limit for fp32 up to
    n ≈ 1,000,000, but not for bf16 once n ≳ 4,100 nor fp16 once n ≳ 262,000, so `check`'s
    default verdict adds an exact integer-input run (up to 2^24 terms), which sees any wrong term.
    """
    n = problem.reduction_length
    return max(16 * math.sqrt(n) * UNIT_ROUNDOFF[accum] + 4 * UNIT_ROUNDOFF[problem.dtype], 1e-4)


def bound_coefficient(problem: Conv2dProblem, accum: str = "fp32", extra_roundings: int = 0) -> float:
    """The element-wise bound's factor: gamma_n + extra_roundings·u_acc + u_out, with
    gamma_n = n·u_acc / (1 − n·u_acc), n = `Conv2dProblem.reduction_length` and u_out the output
    dtype's unit roundoff (Higham, §3.1); infinite (no element bound) once n·u_acc ≥ 1. An element
    passes when |out − ref| <= factor · |op|(|a|, |b|)."""
    u = UNIT_ROUNDOFF[accum]
    n = problem.reduction_length
    if n * u >= 1:
        return math.inf
    return n * u / (1 - n * u) + extra_roundings * u + UNIT_ROUNDOFF[problem.dtype]


def err_over_bound(err: torch.Tensor, scale: torch.Tensor, coefficient: float, floor: float) -> torch.Tensor:
    """|out − ref| / (coefficient · scale + floor), elementwise, never NaN: an element with no
    scale (no term reaches it) is bounded by the floor alone, also when the coefficient is
    infinite; an infinite error (NaN/Inf output, given as inf) is an infinite ratio."""
    bound = torch.where(scale > 0, coefficient * scale, torch.zeros_like(scale)) + floor
    ratio = err / bound
    return torch.where(torch.isnan(ratio), torch.full_like(ratio, math.inf), ratio)


def bound_floor(problem: Conv2dProblem, accum: str = "fp32", extra_roundings: int = 0) -> float:
    """The element-wise bound's absolute term, for roundings in the subnormal range where the
    relative bound fails: one underflow of the accumulator per term and per extra rounding
    ((n + extra)·eta_acc) plus one of the output (eta_out), `UNDERFLOW`. An element passes when
    |out − ref| <= `bound_coefficient` · |op|(|a|, |b|) + this."""
    n = problem.reduction_length + extra_roundings
    return n * UNDERFLOW[accum] + UNDERFLOW[problem.dtype]


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
    """The verdict of every check (`check`, `helpers.check.check_epilogue`) from its measures.

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
    activation), the scale of the rounding bound in `helpers.check.check_epilogue`. Small problems only (one
    float64 copy of the whole output).
    """
    if absolute:
        conv = reference(problem, x.abs(), w.abs())
    else:
        conv = reference(problem, x, w)
    f = abs if absolute else (lambda v: v)
    out = f(epilogue.alpha) * conv
    if cin is not None and epilogue.beta != 0:
        out = out + f(epilogue.beta * problem.to_nchw(cin).to(torch.float64))
    if bias is not None:
        out = out + f(bias.to(torch.float64)).view(1, -1, 1, 1)
    if epilogue.relu and not absolute:
        out = out.clamp_min(0.0)
    return out
