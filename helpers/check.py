"""Correctness checks that can fail: run a variant on seeded inputs, poisoned outputs, and judge
it against the float64 reference with the rounding bound (`helpers.reference`).

`check` runs the plain operation twice (the second run must match the first bit for bit);
`check_epilogue` runs a fused epilogue, its bound widened by one fp32 rounding per epilogue
operation. Both return the verdict of `helpers.reference.judge`.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .epilogue import Epilogue, operand_shape
from .launch import prepare
from .problem import Conv2dProblem
from .reference import (
    CheckResult,
    bitwise_equal,
    bound_coefficient,
    bound_floor,
    compare,
    err_over_bound,
    judge,
    reference_epilogue,
)
from .variants import Plan, as_plan


def check(
    target,
    problem: Conv2dProblem | None = None,
    kind: str | None = None,
    seed: int = 0,
    accum: str | None = None,
    device: str = "cuda",
) -> CheckResult:
    """Run a variant twice on seeded inputs and judge it (see `helpers.reference`'s docstring and
    `helpers.reference.judge`): ``check(plan)`` or ``check(variant, problem)``.

    Args:
        target: a `helpers.variants.Plan` (of the plain operation), or a registered name or
            `helpers.variants.Variant` (its plan for ``problem`` is made once here).
        problem: the problem, with a variant; the variant must support it.
        kind: "normal", "int" (small integers; bit-exact expected, unless the variant's
            `helpers.reference.ErrorModel` says its arithmetic rounds them) or "cancel" (exact result 0),
            see `Conv2dProblem.make_inputs`; by default (None) the series' verdict: "normal" and,
            wherever integer inputs are exact (`Conv2dProblem.supports_kind`), "int" too, which
            must pass both. The rounding bound alone cannot see a dropped or doubled filter tap
            on a long low-precision reduction (a tap moves the output by about 1/sqrt(n)
            relative, under bf16's rel-L2 limit once n ≳ 4,100 and fp16's once n ≳ 262,000);
            the exact run sees any wrong term.
        seed: input seed.
        accum: accumulator precision for the bound ("fp32", "fp64"); default the variant's ``accum``.
            A variant with an ``error_model`` is judged by that bound (`helpers.reference.compare`'s
            ``model``) instead of the dot product's.

    Returns:
        One `CheckResult`; for the default verdict its ``kind`` is "normal+int" ("normal" past
        2^24 terms, where no integer run is exact), ``ok`` is true when every run passed,
        ``reason`` names the runs that failed, ``max_abs_err``, ``worst_err_over_bound`` and
        ``nonfinite`` are the worst over the runs, ``rel_l2`` the normal run's and ``exact``
        the integer run's.

    Raises:
        UnsupportedProblem, TypeError, ValueError: from `helpers.launch.prepare`, before any launch.
    """
    plan = as_plan(target, problem)
    if kind is not None:
        return _check_kind(plan, kind, seed, accum, device)
    kinds = ["normal"] + (["int"] if plan.problem.supports_kind("int") is None else [])
    results = [_check_kind(plan, k, seed, accum, device) for k in kinds]
    normal = results[0]
    failed = [r for r in results if not r.ok]
    return dataclasses.replace(
        normal,
        kind="+".join(kinds),
        ok=not failed,
        reason="; ".join(f"{r.kind}: {r.reason}" for r in failed),
        max_abs_err=max(r.max_abs_err for r in results),
        worst_err_over_bound=max(r.worst_err_over_bound for r in results),
        nonfinite=sum(r.nonfinite for r in results),
        exact=results[-1].exact if len(results) > 1 else None,
        repeat_bitwise=all(r.repeat_bitwise for r in results),
    )


def _check_kind(plan: Plan, kind: str, seed: int, accum: str | None, device: str) -> CheckResult:
    """`check` with one input kind."""
    v, problem = plan.variant, plan.problem
    accum = accum or v.accum
    inputs = problem.make_inputs(device=device, kind=kind, seed=seed)
    first, out1 = prepare(plan, *inputs)
    out1.fill_(float("nan"))
    first()
    out2 = torch.full_like(out1, float("nan"))
    second, _ = prepare(plan, *inputs, out=out2)
    second()
    torch.cuda.synchronize()
    repeat_ok = bitwise_equal(out1, out2)
    del out2
    model = v.error_model  # a variant's own bound (day 20's Winograd), else the dot product's
    exact = kind == "int" and (model is None or model.exact_on_integers(problem))
    r = compare(problem, *inputs, out1, accum=accum, exact=exact, model=model)
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


def _integral(epilogue: Epilogue) -> bool:
    return float(epilogue.alpha).is_integer() and float(epilogue.beta).is_integer()


EPILOGUE_ROUNDINGS = 4  # alpha·acc, + beta·Cin, + bias, and the product beta·Cin, each one fp32 rounding


def check_epilogue(
    target,
    problem: Conv2dProblem | None,
    epilogue: Epilogue,
    with_cin: bool = True,
    with_bias: bool = True,
    in_place: bool = False,
    kind: str = "normal",
    seed: int = 0,
    accum: str | None = None,
) -> CheckResult:
    """Judge a fused conv + epilogue launch against `helpers.reference.reference_epilogue`:
    ``check_epilogue(plan, None, epilogue)`` (a plan made for ``epilogue``) or
    ``check_epilogue(variant, problem, epilogue)``.

    Cin and bias are seeded like x (``kind``); with ``in_place`` the output starts as a copy of
    Cin and is passed as Cin too (y += ...), otherwise it is NaN-poisoned before each launch.
    The verdict is `helpers.reference.judge`'s, with the element bound
    (gamma_n + 4·u_acc + u_out) · (|alpha|·conv(|x|,|w|) + |beta·Cin| + |bias|): the conv's bound
    plus one fp32 rounding per epilogue operation (ReLU cannot increase an error).

    Raises:
        ValueError: ``in_place`` without ``with_cin``; whatever `helpers.launch.prepare` raises.
    """
    if in_place and not with_cin:
        raise ValueError("in_place=True passes y as Cin: it needs with_cin=True")
    plan = as_plan(target, problem, epilogue)
    v, problem = plan.variant, plan.problem
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
        once, y = prepare(plan, x, w, out=y, cin=y if in_place else cin, bias=bias)
        once()
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
