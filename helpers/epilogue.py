"""Fused epilogues: D = act(alpha · op(a, b) + beta · Cin + bias), their operands and their check.

The operands of a fused epilogue (CUTLASS's ``LinearCombination`` / ``LinearCombinationRelu``):
``cin`` has the output's shape, layout and dtype (a residual, or the output itself for an
in-place update); ``bias`` has K elements (one per output channel). A variant that fuses them
lists them in `helpers.variants.Variant.operands`; `helpers.variants.prepare` takes them by name
(``prepare(v, p, x, w, cin=..., bias=..., epilogue=Epilogue(...))``) and checks them with
`check_operands` before any launch.

`check_epilogue` judges a fused launch against `reference_epilogue` with the same verdict as
`helpers.check.check` (`helpers.check.judge`), its bound widened by one fp32 rounding per
epilogue operation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .check import CheckResult, bitwise_equal, bound_coefficient, bound_floor, err_over_bound, judge, reference
from .problem import Conv2dProblem


@dataclass(frozen=True)
class Epilogue:
    """D = act(alpha · conv(x, w) + beta · Cin + bias), act = ReLU if ``relu`` else identity.

    The defaults (alpha = 1, beta = 0, no ReLU) give the plain operation; `is_plain` says so.
    """

    alpha: float = 1.0
    beta: float = 0.0
    relu: bool = False

    def __post_init__(self) -> None:
        for nm in ("alpha", "beta"):
            v = getattr(self, nm)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise TypeError(f"Epilogue {nm} must be a real number; got {v!r}")
        if not isinstance(self.relu, (bool, np.bool_)):
            raise TypeError(f"Epilogue relu must be True or False; got {self.relu!r}")

    @property
    def is_plain(self) -> bool:
        return self.alpha == 1.0 and self.beta == 0.0 and not self.relu


PLAIN = Epilogue()
OPERANDS = ("cin", "bias")  # the epilogue operands, in the order kernels take them


def operand_shape(problem: Conv2dProblem, name: str) -> tuple[int, ...]:
    """``cin``: the output's shape (`Conv2dProblem.output_shape`); ``bias``: one value per output
    channel, (K,) for fprop and (C,) for dgrad (wgrad's output, a filter gradient, takes none).

    Raises:
        ValueError: a name that is not an epilogue operand.
    """
    if name == "cin":
        return problem.output_shape
    if name == "bias":
        if problem.op == "wgrad":
            raise ValueError("a wgrad output (the filter gradient dw) takes no bias")
        return (problem.K,) if problem.op == "fprop" else (problem.C,)
    raise ValueError(f"{name!r} is not an epilogue operand; known: {', '.join(OPERANDS)}")


def check_operands(problem: Conv2dProblem, epilogue: Epilogue, operands: dict, ref: torch.Tensor) -> None:
    """Raise before any launch if the epilogue or its operands cannot be passed.

    Each given operand must be a contiguous tensor of `operand_shape`, ``ref``'s dtype and device;
    ``beta != 0`` needs ``cin``; alpha and beta go to the kernel as float32, so they must be
    finite there and a nonzero beta must not round to 0 (the kernel would skip Cin).

    Raises:
        TypeError: an operand that is not a tensor (`helpers.variants.prepare` has checked that
            ``epilogue`` is an `Epilogue`).
        ValueError: wrong shape, dtype, layout or device; beta without cin; alpha/beta float32
            cannot carry.
    """
    for nm, t in operands.items():
        if t is None:
            continue
        shape = operand_shape(problem, nm)
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{nm} must be a torch.Tensor or None; got {type(t).__name__}")
        if t.dtype != ref.dtype or tuple(t.shape) != shape or not t.is_contiguous() or t.device != ref.device:
            raise ValueError(
                f"{nm} must be a contiguous {ref.dtype} tensor of shape {shape} on {ref.device}; "
                f"got {t.dtype} {tuple(t.shape)} on {t.device}{'' if t.is_contiguous() else ', not contiguous'}"
            )
    if epilogue.beta != 0 and operands.get("cin") is None:
        raise ValueError(f"epilogue beta = {epilogue.beta} needs cin (the tensor it scales)")
    for nm, v in (("alpha", epilogue.alpha), ("beta", epilogue.beta)):
        with np.errstate(over="ignore"):  # an overflow is what this checks
            f = float(np.float32(v))
        if not np.isfinite(f) or (v != 0 and f == 0):
            raise ValueError(f"epilogue {nm} = {v!r} is {f} in float32: pass a finite value the kernel can represent")


def scalars(epilogue: Epilogue) -> dict:
    """The epilogue as kernel scalars by name: alpha, beta (np.float32), relu (np.int32)."""
    return {"alpha": np.float32(epilogue.alpha), "beta": np.float32(epilogue.beta), "relu": np.int32(epilogue.relu)}


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


def _integral(epilogue: Epilogue) -> bool:
    return float(epilogue.alpha).is_integer() and float(epilogue.beta).is_integer()


EPILOGUE_ROUNDINGS = 4  # alpha·acc, + beta·Cin, + bias, and the product beta·Cin, each one fp32 rounding


def check_epilogue(
    variant,
    problem: Conv2dProblem,
    epilogue: Epilogue,
    with_cin: bool = True,
    with_bias: bool = True,
    in_place: bool = False,
    kind: str = "normal",
    seed: int = 0,
    accum: str | None = None,
) -> CheckResult:
    """Judge a fused conv + epilogue launch of ``variant`` against `reference_epilogue`.

    Cin and bias are seeded like x (``kind``); with ``in_place`` the output starts as a copy of
    Cin and is passed as Cin too (y += ...), otherwise it is NaN-poisoned before each launch.
    The verdict is `helpers.check.judge`'s, with the element bound
    (gamma_n + 4·u_acc + u_out) · (|alpha|·conv(|x|,|w|) + |beta·Cin| + |bias|): the conv's bound
    plus one fp32 rounding per epilogue operation (ReLU cannot increase an error).

    Raises:
        ValueError: ``in_place`` without ``with_cin``; whatever `helpers.variants.prepare` raises.
    """
    from .variants import get, prepare

    if in_place and not with_cin:
        raise ValueError("in_place=True passes y as Cin: it needs with_cin=True")
    v = get(variant)
    accum = accum or v.accum
    x, w = problem.make_inputs(device="cuda", kind=kind, seed=seed)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    dt = problem.torch_dtype

    def operand(shape):
        if kind == "int":
            return torch.randint(-4, 5, shape, generator=g, device="cuda").to(dt)
        return torch.randn(shape, generator=g, device="cuda").to(dt)

    cin = operand(operand_shape(problem, "cin")) if with_cin else None
    bias = operand(operand_shape(problem, "bias")) if with_bias else None
    ref = reference_epilogue(problem, x, w, epilogue, cin, bias)
    outs = []
    for _ in range(2):
        y = cin.clone() if in_place else torch.full(problem.y_shape, float("nan"), dtype=dt, device="cuda")
        launch, y = prepare(v, problem, x, w, out=y, cin=y if in_place else cin, bias=bias, epilogue=epilogue)
        launch()
        torch.cuda.synchronize()
        outs.append(y)
    y4 = problem.to_nchw(outs[0])
    fin = torch.isfinite(y4)
    yd = y4.to(torch.float64)
    err = torch.where(fin, (yd - ref).abs(), torch.full_like(ref, math.inf))
    scale = reference_epilogue(problem, x, w, epilogue, cin, bias, absolute=True)
    ratio = err_over_bound(err, scale, bound_coefficient(problem, accum, extra_roundings=EPILOGUE_ROUNDINGS),
                           bound_floor(problem, accum, extra_roundings=EPILOGUE_ROUNDINGS))
    diff = torch.where(fin, yd - ref, torch.zeros_like(ref))
    ref_norm = float(ref.norm())
    return judge(
        variant=v.name,
        problem=problem,
        kind=kind,
        accum=accum,
        nonfinite=int((~fin).sum()),
        max_abs_err=float(err.max()),
        worst_err_over_bound=float(ratio.max()),
        rel_l2=float(diff.norm()) / ref_norm if ref_norm > 0 else float(diff.norm()),
        # exact only where every operation is: integer inputs and integer alpha and beta
        exact=bool(torch.equal(y4, ref.to(dt))) if kind == "int" and _integral(epilogue) else None,
        repeat_bitwise=bitwise_equal(outs[0], outs[1]),
    )
