"""The three operations (fprop, dgrad, wgrad) of `Conv2dProblem`, on the CPU, against torch autograd.

Shapes, GEMM views and reduction lengths per op; seeded inputs (fprop bit for bit as before the
operations existed); the float64 reference against ``torch.autograd.grad`` of ``F.conv2d`` over
strided, dilated, padded, grouped and uneven problems; banded against one-shot comparison; the
rounding bound failing on planted faults and passing correctly rounded outputs; the cuDNN
launcher (ATen's CPU path here) against the reference.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from helpers.bench import cudnn_launcher
from helpers.problem import INT_MAX, OPS, Conv2dProblem
from helpers.reference import UNIT_ROUNDOFF, _band_rows, _bands, compare, reference, reference_band, rel_l2_limit

BACKWARD = ("dgrad", "wgrad")


# ---- problems --------------------------------------------------------------------------------


def _p(**kw) -> Conv2dProblem:
    return Conv2dProblem(**kw)


# Hand-picked shapes: every case of the edge suite's categories (helpers.suites), for the backward ops.
CASES = [
    _p(N=2, C=1, H=7, W=9, K=3, R=3, S=3, padding=1),  # C = 1, K odd, H != W
    _p(N=3, C=3, H=10, W=8, K=5, R=3, S=3, padding=1, stride=(1, 2)),  # C = 3, stride (1, 2)
    _p(N=2, C=5, H=13, W=11, K=7, R=2, S=4, stride=(2, 1), padding=(1, 2)),  # even filters, R != S, (2, 1)
    _p(N=2, C=4, H=10, W=11, K=4, R=3, S=3, padding=1, stride=3, groups=4),  # depthwise, stride (3, 3)
    _p(N=2, C=6, H=9, W=7, K=9, R=3, S=1, padding=(2, 0), dilation=(2, 1), groups=3),  # K/g = 3, dilation (2, 1)
    _p(N=2, C=3, H=6, W=7, K=5, R=3, S=3, padding=3, dilation=(1, 2)),  # pad >= R/2, dilation (1, 2)
    _p(N=1, C=5, H=8, W=9, K=3, R=1, S=5, padding=(0, 3)),  # asymmetric padding, 1xS filter
    _p(N=2, C=3, H=17, W=13, K=5, R=2, S=2, stride=3),  # stride > R: dx rows/cols no tap reaches
    _p(N=2, C=2, H=10, W=10, K=3, R=3, S=3, stride=2),  # (H - R) % stride != 0: last row untouched
    _p(N=3, C=2, H=1, W=1, K=4, R=3, S=3, padding=1),  # single pixel, filter larger than the image
    _p(N=2, C=4, H=12, W=9, K=6, R=3, S=2, stride=2, padding=(2, 1), dilation=2, groups=2),  # all at once
    _p(N=4, C=7, H=5, W=6, K=5, R=4, S=3, stride=(2, 3), padding=(3, 2), dilation=(2, 1)),  # odd C, pad > R/2
]


def random_problems(seed: int, count: int) -> list[Conv2dProblem]:
    rng = random.Random(seed)
    out: list[Conv2dProblem] = []
    while len(out) < count:
        g = rng.choice([1, 1, 2, 3])
        try:
            out.append(
                Conv2dProblem(
                    N=rng.randint(1, 3),
                    C=g * rng.choice([1, 2, 3, 5]),
                    H=rng.randint(1, 13),
                    W=rng.randint(1, 13),
                    K=g * rng.choice([1, 2, 3, 5]),
                    R=rng.randint(1, 5),
                    S=rng.randint(1, 5),
                    stride=rng.choice([1, 2, (1, 2), (2, 1), (3, 3)]),
                    padding=rng.choice([0, 1, 2, (0, 2), (3, 1), (1, 0)]),
                    dilation=rng.choice([1, 1, (1, 2), (2, 1), 2]),
                    groups=g,
                )
            )
        except ValueError:  # filter larger than the padded image: draw again
            continue
    return out


PROBLEMS = CASES + random_problems(0, 30)


def touched(p: Conv2dProblem) -> tuple[set[int], set[int]]:
    """dx rows and columns some filter tap of some output pixel reaches (brute force)."""
    rows = {q * p.stride[0] - p.padding[0] + r * p.dilation[0] for q in range(p.P) for r in range(p.R)}
    cols = {q * p.stride[1] - p.padding[1] + s * p.dilation[1] for q in range(p.Q) for s in range(p.S)}
    return {h for h in rows if 0 <= h < p.H}, {w for w in cols if 0 <= w < p.W}


def test_cases_cover_the_categories():
    """The hand-picked list really has each shape it claims (a list that lost one would pass silently)."""
    untouched = [p for p in CASES if touched(p)[0] != set(range(p.H))]
    interior = [p for p in CASES if any(0 < h < max(touched(p)[0]) for h in set(range(p.H)) - touched(p)[0])]
    cats = {
        "N > 1": any(p.N > 1 for p in CASES),
        "C = 1": any(p.C == 1 for p in CASES),
        "C = 3": any(p.C == 3 for p in CASES),
        "odd C > 3": any(p.C % 2 and p.C > 3 for p in CASES),
        "K odd": any(p.K % 2 for p in CASES),
        "groups": any(1 < p.groups < p.C for p in CASES),
        "depthwise": any(p.groups == p.C == p.K > 1 for p in CASES),
        "odd K/groups with groups": any(p.groups > 1 and (p.K // p.groups) % 2 for p in CASES),
        "stride (1, 2)": any(p.stride == (1, 2) for p in CASES),
        "stride (2, 1)": any(p.stride == (2, 1) for p in CASES),
        "stride (3, 3)": any(p.stride == (3, 3) for p in CASES),
        "asymmetric padding": any(p.padding[0] != p.padding[1] for p in CASES),
        "pad >= R/2": any(p.padding[0] >= p.R / 2 and p.padding[0] > (p.R - 1) // 2 for p in CASES),
        "dilation (1, 2)": any(p.dilation == (1, 2) for p in CASES),
        "dilation (2, 1)": any(p.dilation == (2, 1) for p in CASES),
        "R != S": any(p.R != p.S for p in CASES),
        "even filter": any(p.R % 2 == 0 or p.S % 2 == 0 for p in CASES),
        "H != W": any(p.H != p.W for p in CASES),
        "(H + 2p - span - 1) % stride != 0": any(
            (p.H + 2 * p.padding[0] - p.dilation[0] * (p.R - 1) - 1) % p.stride[0] for p in CASES
        ),
        "dx rows no tap reaches": bool(untouched),
        "such rows between touched ones": bool(interior),
    }
    assert all(cats.values()), [k for k, v in cats.items() if not v]


# ---- autograd, the independent reference ------------------------------------------------------


def autograd_op(p: Conv2dProblem, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The op's output in float64 by ``torch.autograd.grad`` of ``F.conv2d``, logical NCHW/KCRS."""
    a4, b4 = p.to_logical(a).double(), p.to_logical(b).double()
    kw = p.torch_kwargs()
    if p.op == "fprop":
        return F.conv2d(a4, b4, **kw)
    g = torch.Generator().manual_seed(99)
    if p.op == "dgrad":  # dx does not depend on x: any x will do
        x = torch.randn((p.N, p.C, p.H, p.W), generator=g, dtype=torch.float64, requires_grad=True)
        (dx,) = torch.autograd.grad(F.conv2d(x, b4, **kw), x, a4)
        return dx
    w = torch.randn((p.K, p.C_per_group, p.R, p.S), generator=g, dtype=torch.float64, requires_grad=True)
    (dw,) = torch.autograd.grad(F.conv2d(a4, w, **kw), w, b4)
    return dw


def logical_out_shape(p: Conv2dProblem) -> tuple[int, ...]:
    return {"fprop": (p.N, p.K, p.P, p.Q), "dgrad": (p.N, p.C, p.H, p.W), "wgrad": (p.K, p.C_per_group, p.R, p.S)}[p.op]


@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("op", OPS)
def test_reference_matches_autograd(op: str, layout: str, dtype: str):
    for i, base in enumerate(PROBLEMS):
        p = replace(base, op=op, layout=layout, dtype=dtype, name="")
        a, b = p.make_inputs(seed=i)
        want = autograd_op(p, a, b)
        ref = reference(p, a, b)
        assert ref.dtype == torch.float64 and ref.device == a.device
        assert tuple(ref.shape) == logical_out_shape(p) == tuple(want.shape), p.name
        assert tuple(p.from_logical(ref).shape) == p.output_shape
        torch.testing.assert_close(ref, want, rtol=1e-12, atol=1e-12, msg=p.name)
        assert float(want.abs().max()) > 0.1, p.name  # not vacuous
        # assembled from bands of at most one row: the same values
        torch.testing.assert_close(reference(p, a, b, max_elems=1), want, rtol=1e-12, atol=1e-12, msg=p.name)


@pytest.mark.parametrize("op", OPS)
def test_reference_is_exact_on_integers(op: str):
    for i, base in enumerate(PROBLEMS):
        p = replace(base, op=op, name="")
        a, b = p.make_inputs(kind="int", seed=i)
        want = autograd_op(p, a, b)
        assert torch.equal(want, want.round())
        assert torch.equal(reference(p, a, b), want), p.name
        assert torch.equal(reference(p, a, b, max_elems=7), want), p.name


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_dgrad_rows_and_columns_no_tap_reaches_are_zero(layout: str):
    n_rows = n_cols = 0
    for i, base in enumerate(PROBLEMS):
        p = replace(base, op="dgrad", layout=layout, name="")
        rows, cols = touched(p)
        a, b = p.make_inputs(seed=i)
        for ref in (reference(p, a, b), reference(p, a, b, max_elems=1), autograd_op(p, a, b)):
            dead_r = sorted(set(range(p.H)) - rows)
            dead_c = sorted(set(range(p.W)) - cols)
            assert float(ref[:, :, dead_r].abs().sum()) == 0 and float(ref[..., dead_c].abs().sum()) == 0, p.name
            live = ref[:, :, sorted(rows)][..., sorted(cols)]
            assert bool((live.abs().amax(dim=(0, 1)) > 0).all()), p.name  # every reached pixel is nonzero
        n_rows += bool(dead_r)
        n_cols += bool(dead_c)
    assert n_rows >= 3 and n_cols >= 3, (n_rows, n_cols)


# ---- bands ------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("max_elems", [1, 60, 300, 2**26])
def test_bands_tile_images_and_rows_once(op: str, max_elems: int):
    for base in PROBLEMS:
        p = replace(base, op=op, name="")
        total = _band_rows(p)
        assert total == (p.H if op == "dgrad" else p.P)
        hits = torch.zeros(p.N, total, dtype=torch.int64)
        for n0, n1, r0, r1 in _bands(p, max_elems):
            assert 0 <= n0 < n1 <= p.N and 0 <= r0 < r1 <= total
            hits[n0:n1, r0:r1] += 1
        assert bool((hits == 1).all()), p.name


def _several_bands(p: Conv2dProblem, max_elems: int) -> None:
    """``max_elems`` splits p into bands of rows (so the banded compare is really banded)."""
    bands = list(_bands(p, max_elems))
    assert len(bands) > p.N and any(r1 - r0 < _band_rows(p) for _, _, r0, r1 in bands), bands


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("op", OPS)
def test_banded_compare_equals_one_shot(op: str, layout: str):
    for i, base in enumerate(CASES):
        p = replace(base, op=op, layout=layout, name="")
        if p.H * p.W == 1:
            continue  # a single row: nothing to split
        small = 30
        _several_bands(p, small)
        # normal inputs, an fp32 output from another summation order (ATen's)
        a, b = p.make_inputs(seed=i)
        out = p.from_logical(cudnn_launcher(p, a, b)())
        one, many = compare(p, a, b, out), compare(p, a, b, out, max_elems=small)
        assert one["nonfinite"] == many["nonfinite"] == 0
        for key in ("max_abs_err", "worst_err_over_bound", "rel_l2"):
            assert many[key] == pytest.approx(one[key], rel=1e-6, abs=1e-300), (p.name, key)
        assert 0 < one["worst_err_over_bound"] <= 1 and one["rel_l2"] <= rel_l2_limit(p)
        # a planted fault shows the same way banded and not
        bad = p.to_logical(out).clone(memory_format=torch.contiguous_format)
        bad.view(-1)[bad.numel() // 2] += 0.25
        bad = p.from_logical(bad)
        one, many = compare(p, a, b, bad), compare(p, a, b, bad, max_elems=small)
        assert one["worst_err_over_bound"] > 1 and many["worst_err_over_bound"] == pytest.approx(
            one["worst_err_over_bound"], rel=1e-6
        )
        assert many["max_abs_err"] == pytest.approx(one["max_abs_err"], rel=1e-6)
        # integers: everything exact, banded or not
        a, b = p.make_inputs(kind="int", seed=i)
        out = p.from_logical(reference(p, a, b).float())
        one, many = compare(p, a, b, out, exact=True), compare(p, a, b, out, exact=True, max_elems=small)
        assert one == many == {"max_abs_err": 0.0, "worst_err_over_bound": 0.0, "rel_l2": 0.0, "nonfinite": 0,
                               "exact_equal": True}


def test_wgrad_band_is_a_partial_sum():
    """A wgrad band is dw over its images and dy rows only; the bands add up to dw."""
    p = Conv2dProblem(N=3, C=4, H=9, W=7, K=2, R=3, S=2, stride=(2, 1), padding=1, groups=2, op="wgrad")
    x, dy = p.make_inputs(seed=3)
    x4, dy4 = p.to_logical(x), p.to_logical(dy)
    part = reference_band(p, x4, dy4, 1, 2, 2, 4)
    # the same from autograd on a dy that is zero outside image 1, rows 2..3
    mask = torch.zeros_like(dy4)
    mask[1:2, :, 2:4] = 1
    want = autograd_op(p, x, p.from_logical(dy4 * mask))
    torch.testing.assert_close(part, want, rtol=1e-12, atol=1e-12)
    assert float(part.abs().max()) > 0.1
    total = sum(reference_band(p, x4, dy4, *blk) for blk in _bands(p, 40))
    torch.testing.assert_close(total, reference(p, x, dy), rtol=1e-12, atol=1e-12)


def test_dgrad_band_of_rows_no_tap_reaches_is_zero():
    p = Conv2dProblem(N=1, C=2, H=17, W=5, K=3, R=2, S=2, stride=3, op="dgrad")  # rows 2, 5, ... untouched
    dy, w = p.make_inputs(seed=1)
    band = reference_band(p, p.to_logical(dy), p.to_logical(w), 0, 1, 2, 3)
    assert band.shape == (1, 2, 1, 5) and float(band.abs().max()) == 0
    assert float(reference_band(p, p.to_logical(dy), p.to_logical(w), 0, 1, 3, 5).abs().max()) > 0


# ---- the bound: correct outputs pass, faults fail ----------------------------------------------


def _flagged(p: Conv2dProblem, r: dict) -> bool:
    return r["worst_err_over_bound"] > 1 or r["rel_l2"] > rel_l2_limit(p) or r["nonfinite"] > 0


FAULT_PROBLEMS = [
    Conv2dProblem(N=3, C=6, H=11, W=10, K=8, R=3, S=3, padding=1, stride=(1, 2)),
    Conv2dProblem(N=2, C=8, H=13, W=9, K=6, R=3, S=2, padding=(2, 1), stride=2, dilation=(1, 2), groups=2),
    Conv2dProblem(N=2, C=3, H=17, W=13, K=5, R=2, S=2, stride=3),  # dgrad has rows no tap reaches
]


def _dropped(p: Conv2dProblem, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """What a kernel that forgets part of the reduction computes, logical layout, float64."""
    a4, b4 = p.to_logical(a).double(), p.to_logical(b).double()
    if p.op == "wgrad":  # forgets the last image's contribution
        b4 = b4.clone()
        b4[-1] = 0
    else:  # forgets the filter tap (r, s) = (R-1, 0)
        b4 = b4.clone()
        b4[:, :, p.R - 1, 0] = 0
    return reference(p, p.from_logical(a4), p.from_logical(b4))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("which", range(len(FAULT_PROBLEMS)))
def test_faults_are_flagged_and_rounding_passes(op: str, layout: str, which: int):
    p = replace(FAULT_PROBLEMS[which], op=op, layout=layout, name="")
    a, b = p.make_inputs(seed=which)
    ref = reference(p, a, b).contiguous()  # logical, float64
    lim = rel_l2_limit(p)

    def judge(out4: torch.Tensor, max_elems: int = 2**26) -> dict:
        return compare(p, a, b, p.from_logical(out4.to(p.torch_dtype)), max_elems=max_elems)

    # correct outputs pass: the reference rounded to fp32, and ATen's fp32 result (another order)
    for good in (ref, p.to_logical(p.from_logical(cudnn_launcher(p, a, b)()))):
        r = judge(good)
        assert r["worst_err_over_bound"] <= 1 and r["rel_l2"] <= lim and r["nonfinite"] == 0
    # a dropped tap (dgrad, fprop) or image (wgrad)
    r = judge(_dropped(p, a, b))
    assert r["rel_l2"] > lim and r["worst_err_over_bound"] > 1, r
    # a zeroed row: y/dx row h of image 0 reached by some tap; dw filter row 0
    z = ref.clone()
    if op == "wgrad":
        z[:, :, 0, :] = 0
    else:
        row = max(touched(p)[0]) if op == "dgrad" else p.P // 2
        z[0, :, row, :] = 0
    assert judge(z)["worst_err_over_bound"] > 1
    # two swapped channels 0 and 1 of dimension 1 (y: k, dx: c, dw: c within the group)
    s = ref.clone()
    s[:, [0, 1]] = s[:, [1, 0]]
    r = judge(s)
    assert r["worst_err_over_bound"] > 1 and r["rel_l2"] > lim
    # one NaN
    n = ref.clone()
    n.view(-1)[n.numel() // 3] = math.nan
    r = judge(n)
    assert r["nonfinite"] == 1 and r["worst_err_over_bound"] == math.inf and _flagged(p, r)
    # dgrad: anything in a row no tap reaches is an error, however small
    if op == "dgrad" and set(range(p.H)) - touched(p)[0]:
        d = ref.clone()
        d[-1, -1, min(set(range(p.H)) - touched(p)[0]), 0] = 1e-30
        # the bound there is only the underflow floor (n·2^-150 + 2^-150 in fp32): 1e-30 is far over it
        assert judge(d)["worst_err_over_bound"] > 1e10
        assert judge(d, max_elems=20)["worst_err_over_bound"] > 1e10


@pytest.mark.parametrize("op", OPS)
def test_one_element_a_few_ulps_over_the_bound_fails(op: str):
    """Walk one fp32 element away from the reference ulp by ulp: it passes up to the bound, fails past it."""
    p = replace(FAULT_PROBLEMS[1], op=op, name="")
    a, b = p.make_inputs(seed=5)
    ref = reference(p, a, b)
    scale = reference(p, a.abs(), b.abs())
    n = p.reduction_length
    u = UNIT_ROUNDOFF["fp32"]
    bound = (n * u / (1 - n * u) + u) * scale
    i = int(ref.abs().argmax())  # the largest element: most ulps inside its bound
    r_i, b_i = float(ref.view(-1)[i]), float(bound.view(-1)[i])
    v = torch.tensor(r_i, dtype=torch.float32)
    inf = torch.tensor(math.inf)
    steps = 0
    while float(torch.nextafter(v, inf)) - r_i <= b_i:
        v = torch.nextafter(v, inf)
        steps += 1
    assert steps >= 4, steps  # the bound is several ulps wide here
    out = ref.float()
    out.view(-1)[i] = v
    inside = compare(p, a, b, p.from_logical(out))
    assert 0.5 < inside["worst_err_over_bound"] <= 1
    for k in (1, 3):  # one and three ulps past the bound
        over = v
        for _ in range(k):
            over = torch.nextafter(over, inf)
        out.view(-1)[i] = over
        r = compare(p, a, b, p.from_logical(out))
        assert 1 < r["worst_err_over_bound"] < 1.5, r
        assert r["max_abs_err"] == pytest.approx(float(over) - r_i)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("op", OPS)
def test_fp16_rounded_outputs_pass_and_faults_fail(op: str, layout: str):
    p = replace(FAULT_PROBLEMS[0], op=op, layout=layout, dtype="fp16", name="")
    a, b = p.make_inputs(seed=2)
    ref = reference(p, a, b).contiguous()
    lim = rel_l2_limit(p)
    for good in (ref.half(), ref.float().half()):  # one rounding, or fp32 then fp16
        r = compare(p, a, b, p.from_logical(good))
        assert 0 < r["worst_err_over_bound"] <= 1 and r["rel_l2"] <= lim
    r = compare(p, a, b, p.from_logical(_dropped(p, a, b).half()))
    assert r["rel_l2"] > lim
    bad = ref.half()
    bad.view(-1)[7] = -bad.view(-1)[7] + 0.5
    assert compare(p, a, b, p.from_logical(bad))["worst_err_over_bound"] > 1


@pytest.mark.parametrize("op", OPS)
def test_exact_mode_flags_one_ulp_on_integer_inputs(op: str):
    """With integer inputs one ulp off passes the rounding bound but not the bit-exact test."""
    p = replace(FAULT_PROBLEMS[1], op=op, name="")
    a, b = p.make_inputs(kind="int", seed=3)
    out = reference(p, a, b).float().contiguous()
    i = int(out.abs().argmax())
    out.view(-1)[i] = torch.nextafter(out.view(-1)[i], torch.tensor(math.inf))
    for max_elems in (2**26, 30):
        r = compare(p, a, b, p.from_logical(out), exact=True, max_elems=max_elems)
        assert r["exact_equal"] is False and 0 < r["worst_err_over_bound"] <= 1, r
        assert compare(p, a, b, p.from_logical(out), max_elems=max_elems)["exact_equal"] is None


def test_cancel_outputs_pass_only_near_zero():
    """With kind="cancel" the exact output is 0: rounding-size values pass, a real value fails."""
    for op in OPS:
        p = Conv2dProblem(N=2, C=4, H=9, W=8, K=6, R=3, S=3, padding=1, op=op)
        a, b = p.make_inputs(kind="cancel", seed=1)
        ref = reference(p, a, b)
        assert float(ref.abs().max()) <= 1e-12
        out = torch.zeros(ref.shape)
        assert compare(p, a, b, p.from_logical(out))["worst_err_over_bound"] <= 1e-3
        out.view(-1)[5] = 1e-3
        assert compare(p, a, b, p.from_logical(out))["worst_err_over_bound"] > 1


def test_wgrad_bound_uses_n_p_q_and_is_vacuous_past_one():
    """wgrad's n is N·P·Q; once n·u ≥ 1 the element bound says nothing (inf), NaN/Inf still fail."""
    p = Conv2dProblem(N=2, C=2, H=32, W=32, K=2, R=3, S=3, padding=1, op="wgrad")
    assert p.reduction_length == 2048 and 2048 * UNIT_ROUNDOFF["fp16"] == 1
    x, dy = p.make_inputs(seed=0)
    ref = reference(p, x, dy)
    wrong = p.from_logical((ref + 1).float())
    assert compare(p, x, dy, wrong, accum="fp16")["worst_err_over_bound"] == 0
    assert compare(p, x, dy, wrong, accum="fp32")["worst_err_over_bound"] > 1
    assert rel_l2_limit(p, "fp32") == pytest.approx(max(16 * math.sqrt(2048) * 2**-24 + 4 * 2**-24, 1e-4))
    nan = ref.float()
    nan[0, 0, 0, 0] = math.nan
    r = compare(p, x, dy, p.from_logical(nan), accum="fp16")
    assert r["nonfinite"] == 1 and r["worst_err_over_bound"] == math.inf


def test_compare_refuses_wrong_shapes_per_op():
    p = Conv2dProblem(N=2, C=4, H=6, W=5, K=2, R=3, S=3, padding=1, op="dgrad")
    dy, w = p.make_inputs()
    with pytest.raises(ValueError, match=r"dx must have shape \(2, 4, 6, 5\)"):
        compare(p, dy, w, torch.zeros(p.y_shape))
    x = torch.zeros(p.x_shape)
    with pytest.raises(ValueError, match=r"dgrad takes dy of shape \(2, 2, 6, 5\)"):
        compare(p, x, w, torch.zeros(p.x_shape))  # fprop's inputs handed to dgrad
    q = replace(p, op="wgrad", name="")
    with pytest.raises(ValueError, match=r"dw must have shape \(2, 4, 3, 3\)"):
        compare(q, x, dy, torch.zeros(q.y_shape))
    with pytest.raises(ValueError, match=r"wgrad takes x of shape"):
        reference(q, dy, x)  # swapped


# ---- the cuDNN launcher (ATen's CPU path here) --------------------------------------------------


@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("op", OPS)
def test_cudnn_launcher_matches_reference(op: str, layout: str, dtype: str):
    for i, base in enumerate(CASES):
        p = replace(base, op=op, layout=layout, dtype=dtype, name="")
        a, b = p.make_inputs(seed=i)
        launch = cudnn_launcher(p, a, b)
        out = launch()
        assert tuple(out.shape) == logical_out_shape(p) and out.dtype == p.torch_dtype
        ref = reference(p, a, b)
        if dtype == "fp64":
            torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12, msg=p.name)
        else:
            r = compare(p, a, b, p.from_logical(out))
            assert r["worst_err_over_bound"] <= 1 and r["rel_l2"] <= rel_l2_limit(p), (p.name, r)
        assert torch.equal(launch(), out)  # runs again, same result


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("op", BACKWARD)
def test_cudnn_launcher_calls_convolution_backward_once_with_one_gradient(
    op: str, layout: str, monkeypatch: pytest.MonkeyPatch
):
    """One aten.convolution_backward per launch, with the mask of the wanted gradient, tensors in the
    kernel's layout (channels_last views for NHWC), and the shape-only tensor allocated once."""
    p = Conv2dProblem(N=2, C=6, H=9, W=8, K=4, R=3, S=2, stride=(2, 1), padding=1, groups=2, layout=layout, op=op)
    a, b = p.make_inputs(seed=4)
    real = torch.ops.aten.convolution_backward
    calls = []

    def spy(*args):
        calls.append(args)
        return real(*args)

    launch = cudnn_launcher(p, a, b)
    monkeypatch.setattr(torch.ops.aten, "convolution_backward", spy)
    launch()
    launch()
    monkeypatch.undo()
    assert len(calls) == 2
    for args in calls:
        dy, x, w, bias, stride, padding, dilation, transposed, out_pad, groups, mask = args
        assert bias is None and transposed is False and list(out_pad) == [0, 0] and groups == 2
        assert (list(stride), list(padding), list(dilation)) == ([2, 1], [1, 1], [1, 1])
        assert list(mask) == ([True, False, False] if op == "dgrad" else [False, True, False])
        assert tuple(dy.shape) == (p.N, p.K, p.P, p.Q) and tuple(x.shape) == (p.N, p.C, p.H, p.W)
        assert tuple(w.shape) == (p.K, p.C_per_group, p.R, p.S)
        fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
        assert all(t.is_contiguous(memory_format=fmt) for t in (dy, x, w))
        # the op's real inputs are the caller's tensors (views, no copies)
        real_inputs = (dy, w) if op == "dgrad" else (x, dy)
        assert [t.data_ptr() for t in real_inputs] == [a.data_ptr(), b.data_ptr()]
    shape_only = 1 if op == "dgrad" else 2  # x for dgrad, w for wgrad
    assert calls[0][shape_only] is calls[1][shape_only]  # allocated once, outside the closure


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_cudnn_launcher_fprop_is_conv2d_on_channels_last_views(layout: str, monkeypatch: pytest.MonkeyPatch):
    p = Conv2dProblem(N=2, C=4, H=7, W=6, K=3, R=3, S=3, padding=1, layout=layout)
    x, w = p.make_inputs(seed=1)
    real = F.conv2d
    seen = []

    def spy(xx, ww, **kw):
        seen.append((xx, ww, kw))
        return real(xx, ww, **kw)

    launch = cudnn_launcher(p, x, w)
    monkeypatch.setattr(F, "conv2d", spy)
    y = launch()
    monkeypatch.undo()
    ((xx, ww, kw),) = seen
    assert kw == p.torch_kwargs() and xx.data_ptr() == x.data_ptr() and ww.data_ptr() == w.data_ptr()
    if layout == "NHWC":
        assert xx.is_contiguous(memory_format=torch.channels_last) and ww.is_contiguous(
            memory_format=torch.channels_last
        )
    torch.testing.assert_close(y.double(), reference(p, x, w), rtol=1e-5, atol=1e-5)


# ---- inputs -------------------------------------------------------------------------------------


def old_make_inputs(p: Conv2dProblem, kind: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fprop inputs exactly as `Conv2dProblem.make_inputs` made them before the operations existed."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    kw = {"generator": g, "device": "cpu"}
    nchw_x = (p.N, p.C, p.H, p.W)
    kcrs_w = (p.K, p.C // p.groups, p.R, p.S)
    if kind in ("normal", "cancel"):
        x = torch.randn(nchw_x, **kw)
        w = torch.randn(kcrs_w, **kw) / math.sqrt(p.C // p.groups * p.R * p.S)
    else:
        x = torch.randint(-3, 4, nchw_x, **kw).float()
        w = torch.randint(-2, 3, kcrs_w, **kw).float()
    if kind == "cancel":
        cg = p.C // p.groups
        xg = x.view(p.N, p.groups, cg, p.H, p.W)
        xg[:, :, cg // 2 :] = xg[:, :, : cg // 2]
        w[:, cg // 2 :] = -w[:, : cg // 2]
    if p.layout == "NHWC":
        x, w = x.permute(0, 2, 3, 1).contiguous(), w.permute(0, 2, 3, 1).contiguous()
    return x.to(p.torch_dtype).contiguous(), w.to(p.torch_dtype).contiguous()


def test_fprop_inputs_are_bit_for_bit_the_old_ones():
    rng = random.Random(7)
    n = 0
    for i, base in enumerate(PROBLEMS):
        for kind in ("normal", "int", "cancel"):
            p = replace(base, dtype=rng.choice(["fp32", "fp16", "bf16", "fp64"]), layout=rng.choice(["NCHW", "NHWC"]))
            if kind == "cancel" and p.C_per_group % 2:
                continue
            new = p.make_inputs(kind=kind, seed=i)
            old = old_make_inputs(p, kind, i)
            for t_new, t_old in zip(new, old):
                assert t_new.dtype == t_old.dtype and t_new.shape == t_old.shape and t_new.stride() == t_old.stride()
                assert torch.equal(t_new, t_old), (p.name, kind)
            n += 1
    assert n >= 80


def test_backward_inputs_follow_the_documented_draws():
    """dgrad: dy ~ N(0,1) then w ~ N(0,1)/sqrt(K/g·R·S); wgrad: x ~ N(0,1) then dy ~ N(0,1)/sqrt(N·P·Q).

    Pinned so that committed backward results stay reproducible from their seeds."""
    p = Conv2dProblem(N=2, C=6, H=7, W=5, K=4, R=3, S=2, stride=(2, 1), padding=1, groups=2)
    g = torch.Generator().manual_seed(11)
    dy = torch.randn((2, 4, p.P, p.Q), generator=g)
    w = torch.randn((4, 3, 3, 2), generator=g) / math.sqrt(2 * 3 * 2)
    got = replace(p, op="dgrad").make_inputs(seed=11)
    assert torch.equal(got[0], dy) and torch.equal(got[1], w)
    g = torch.Generator().manual_seed(11)
    x = torch.randn((2, 6, 7, 5), generator=g)
    dy = torch.randn((2, 4, p.P, p.Q), generator=g) / math.sqrt(2 * p.P * p.Q)
    got = replace(p, op="wgrad").make_inputs(seed=11)
    assert torch.equal(got[0], x) and torch.equal(got[1], dy)
    g = torch.Generator().manual_seed(11)
    x = torch.randint(-3, 4, (2, 6, 7, 5), generator=g).float()
    dy = torch.randint(-1, 2, (2, 4, p.P, p.Q), generator=g).float()
    got = replace(p, op="wgrad", layout="NHWC").make_inputs(kind="int", seed=11)
    assert torch.equal(got[0], x.permute(0, 2, 3, 1)) and torch.equal(got[1], dy.permute(0, 2, 3, 1))


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16", "fp64"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("op", OPS)
def test_make_inputs_shape_dtype_layout_seed(op: str, layout: str, dtype: str):
    base = Conv2dProblem(N=2, C=8, H=9, W=7, K=4, R=3, S=2, stride=(2, 1), padding=1, groups=2, op=op)
    p = replace(base, layout=layout, dtype=dtype)
    for kind in ("normal", "int", "cancel"):
        a, b = p.make_inputs(kind=kind, seed=3)
        assert (tuple(a.shape), tuple(b.shape)) == p.input_shapes
        assert a.dtype == b.dtype == p.torch_dtype and a.is_contiguous() and b.is_contiguous()
        a2, b2 = p.make_inputs(kind=kind, seed=3)
        assert torch.equal(a, a2) and torch.equal(b, b2)  # same seed, same values
        a3, b3 = p.make_inputs(kind=kind, seed=4)
        assert not torch.equal(a, a3) and not torch.equal(b, b3)
        # the NHWC inputs are the NCHW ones permuted
        a0, b0 = replace(base, dtype=dtype).make_inputs(kind=kind, seed=3)
        assert torch.equal(p.to_logical(a), a0) and torch.equal(p.to_logical(b), b0)


def test_make_inputs_normal_keeps_outputs_order_one():
    base = Conv2dProblem(N=4, C=16, H=16, W=16, K=24, R=3, S=3, padding=1)
    for op in OPS:
        p = replace(base, op=op)
        a, b = p.make_inputs(seed=1)
        std = float(reference(p, a, b).std())
        assert 0.75 < std < 1.1, (op, std)  # ~1, a little less from the zero padding at the borders
    dy, w = replace(base, op="dgrad").make_inputs()
    assert abs(float(w.std()) * math.sqrt(24 * 9) - 1) < 0.1 and abs(float(dy.std()) - 1) < 0.05
    x, dy = replace(base, op="wgrad").make_inputs()
    assert abs(float(dy.std()) * math.sqrt(4 * 16 * 16) - 1) < 0.05 and abs(float(x.std()) - 1) < 0.05


@pytest.mark.parametrize("op", OPS)
def test_make_inputs_int_ranges_and_exactness(op: str):
    p = Conv2dProblem(N=3, C=6, H=12, W=11, K=6, R=3, S=3, padding=1, stride=(1, 2), groups=3, op=op)
    a, b = p.make_inputs(kind="int", seed=2)
    for t, m in zip((a, b), INT_MAX[op]):
        assert torch.equal(t, t.round()) and int(t.min()) == -m and int(t.max()) == m  # every value shows up
    assert p.int_partial_sum_bound == p.reduction_length * INT_MAX[op][0] * INT_MAX[op][1] <= 2**24
    # fp32 accumulation (ATen's order) is exact: equal to the float64 reference bit for bit
    out = cudnn_launcher(p, a, b)()
    assert torch.equal(out.double(), reference(p, a, b))
    assert compare(p, a, b, p.from_logical(out), exact=True)["exact_equal"] is True
    # and fp16 outputs are the exact value rounded once
    h = replace(p, dtype="fp16")
    ah, bh = h.make_inputs(kind="int", seed=2)
    assert torch.equal(ah.float(), a) and torch.equal(bh.float(), b)
    assert compare(h, ah, bh, h.from_logical(reference(h, ah, bh).half()), exact=True)["exact_equal"] is True


def test_make_inputs_int_ranges_shrink_then_refuse_past_the_exactness_limit():
    """kind="int" draws from INT_MAX while reduction length × max|a| × max|b| <= 2^24, from
    {-1, 0, 1} for longer reductions up to 2^24 terms, and is refused past that (before any draw)."""
    lim = {"fprop": 2**24 // 6, "dgrad": 2**24 // 6, "wgrad": 2**24 // 3}
    assert lim == {op: 2**24 // (INT_MAX[op][0] * INT_MAX[op][1]) for op in OPS} == {
        "fprop": 2796202, "dgrad": 2796202, "wgrad": 5592405
    }
    at = {
        "fprop": Conv2dProblem(N=1, C=lim["fprop"], H=1, W=1, K=1, R=1, S=1),
        "dgrad": Conv2dProblem(N=1, C=1, H=1, W=1, K=lim["dgrad"], R=1, S=1, op="dgrad"),
        "wgrad": Conv2dProblem(N=1, C=1, H=1, W=lim["wgrad"], K=1, R=1, S=1, op="wgrad"),
    }
    for op, p in at.items():
        assert p.reduction_length == lim[op] and p.int_ranges == INT_MAX[op] and p.int_partial_sum_bound <= 2**24
        assert p.supports_kind("int") is None
        over = replace(p, C=p.C + 1) if op == "fprop" else replace(p, K=p.K + 1) if op == "dgrad" else replace(p, N=2)
        assert over.int_ranges == (1, 1) and over.int_partial_sum_bound <= 2**24 and over.supports_kind("int") is None
        a, b = over.make_inputs(kind="int")
        assert set(a.unique().tolist()) <= {-1.0, 0.0, 1.0} and set(b.unique().tolist()) <= {-1.0, 0.0, 1.0}
    far = Conv2dProblem(N=1, C=2**24 + 1, H=1, W=1, K=1, R=1, S=1)
    assert far.supports_kind("int")
    with pytest.raises(ValueError, match=r"kind='int' is exact in fp32 only while reduction length"):
        far.make_inputs(kind="int")
    # the edge suite's 2^31-element problem as wgrad reduces over 2.15e9 terms: refused
    big = Conv2dProblem(N=2, C=1, H=32800, W=32800, K=1, R=3, S=3, padding=1, op="wgrad")
    assert "reduces over 2151680000 terms" in big.supports_kind("int")


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("op", OPS)
def test_make_inputs_cancel_gives_exact_zero(op: str, layout: str, dtype: str):
    for groups in (1, 2):
        p = Conv2dProblem(N=4, C=8, H=9, W=7, K=4, R=3, S=3, padding=1, stride=(2, 1), groups=groups, op=op,
                          layout=layout, dtype=dtype)
        a, b = p.make_inputs(kind="cancel", seed=groups)
        assert float(a.abs().max()) > 0.5 and float(b.abs().max()) > 0.01  # real values, not zeros
        assert float(reference(p, a, b).abs().max()) <= 1e-12
        assert float(reference(p, a.abs(), b.abs()).min()) > 0.01  # no output is 0 by construction
        assert float(reference(p, a.abs(), b.abs()).max()) > 1
        # and ATen's own summation order on it gives (near) 0 too: within the bound
        r = compare(p, a, b, p.from_logical(cudnn_launcher(p, a, b)()))
        assert r["worst_err_over_bound"] <= 1


def test_make_inputs_cancel_refusals_name_what_must_be_even():
    base = dict(N=2, C=4, H=5, W=5, K=4, R=3, S=3, padding=1)
    with pytest.raises(ValueError, match=r"fprop needs an even C/groups .*got 3"):
        Conv2dProblem(**{**base, "C": 3}).make_inputs(kind="cancel")
    with pytest.raises(ValueError, match=r"dgrad needs an even K/groups .*got 3"):
        Conv2dProblem(**{**base, "K": 6, "groups": 2, "op": "dgrad"}).make_inputs(kind="cancel")
    with pytest.raises(ValueError, match=r"wgrad needs an even N .*got 3"):
        Conv2dProblem(**{**base, "N": 3, "op": "wgrad"}).make_inputs(kind="cancel")
    # each op needs only its own pairs: odd C is fine for dgrad and wgrad, odd N for fprop and dgrad
    Conv2dProblem(**{**base, "C": 3, "N": 3, "op": "dgrad"}).make_inputs(kind="cancel")
    Conv2dProblem(**{**base, "C": 3, "K": 3, "op": "wgrad"}).make_inputs(kind="cancel")
    with pytest.raises(ValueError, match="kind must be 'normal', 'int' or 'cancel'"):
        Conv2dProblem(**base, op="wgrad").make_inputs(kind="uniform")


# ---- shapes, GEMM views, costs ----------------------------------------------------------------


def test_inputs_outputs_and_tensor_shapes():
    p = Conv2dProblem(N=2, C=6, H=10, W=8, K=4, R=3, S=5, stride=(2, 1), padding=(1, 2), groups=2, layout="NHWC")
    x, w, y = (2, 10, 8, 6), (4, 3, 5, 3), (2, 5, 8, 4)
    assert (p.x_shape, p.w_shape, p.y_shape) == (x, w, y)
    want = {"fprop": (("x", "w"), "y", (x, w), y), "dgrad": (("dy", "w"), "dx", (y, w), x),
            "wgrad": (("x", "dy"), "dw", (x, y), w)}
    for op, (inputs, output, in_shapes, out_shape) in want.items():
        q = replace(p, op=op)
        assert (q.inputs, q.output, q.input_shapes, q.output_shape) == (inputs, output, in_shapes, out_shape)
    assert [p.tensor_shape(t) for t in ("x", "dx", "w", "dw", "y", "dy")] == [x, x, w, w, y, y]
    with pytest.raises(ValueError, match="no tensor 'dz'.*known: x, dx, w, dw, y, dy"):
        p.tensor_shape("dz")


def test_gemm_views_and_reduction_lengths_by_hand():
    # N=2, C=6, H=10, W=8, K=4, R=3, S=5, stride (2, 1), padding (1, 2), groups 2: P=5, Q=8, C/g=3, K/g=2
    p = Conv2dProblem(N=2, C=6, H=10, W=8, K=4, R=3, S=5, stride=(2, 1), padding=(1, 2), groups=2)
    assert (p.P, p.Q) == (5, 8)
    f, d, w = (replace(p, op=op) for op in OPS)
    assert f.gemm == (2 * 5 * 8, 4, 3 * 3 * 5) == (80, 4, 45)
    assert d.gemm == (2 * 10 * 8, 6, 2 * 3 * 5) == (160, 6, 30)
    assert w.gemm == (4, 3 * 3 * 5, 2 * 5 * 8) == (4, 45, 80)
    assert (f.reduction_length, d.reduction_length, w.reduction_length) == (45, 30, 80)
    # depthwise 3x3, N=32 at 112x112 stride 2: dgrad reduces over K/g·R·S = 9, wgrad over N·P·Q
    q = Conv2dProblem(N=32, C=96, H=112, W=112, K=96, R=3, S=3, padding=1, stride=2, groups=96)
    assert (q.P, q.Q) == (56, 56)
    assert replace(q, op="dgrad").gemm == (32 * 112 * 112, 96, 9)
    assert replace(q, op="wgrad").gemm == (96, 9, 32 * 56 * 56)
    assert [replace(q, op=op).reduction_length for op in OPS] == [9, 9, 32 * 56 * 56]
    # a ResNet-50 layer
    r = Conv2dProblem(N=256, C=64, H=56, W=56, K=64, R=3, S=3, padding=1, dtype="fp16", layout="NHWC")
    assert replace(r, op="dgrad").gemm == (256 * 56 * 56, 64, 64 * 9)
    assert replace(r, op="wgrad").gemm == (64, 64 * 9, 256 * 56 * 56)
    for prob in (p, q, r):
        for op in OPS:
            s = replace(prob, op=op)
            assert s.gemm.k == s.reduction_length


def test_gemm_multiply_adds_against_the_direct_count():
    """fprop's and wgrad's GEMMs do exactly the direct convolution's multiply-adds (GEMM-N spans all
    groups, GEMM-K one group); dgrad's does H·W/(P·Q) times as many (it counts, per input pixel, the
    taps that land on no dy), so exactly as many for a "same" convolution."""
    n_same = 0
    for p in PROBLEMS + CASES:
        for op in OPS:
            s = replace(p, op=op)
            m, n, k = s.gemm
            if op == "dgrad":
                assert 2 * m * n * k * s.P * s.Q == s.flops * s.H * s.W, s.name
                assert (m, n, k) == (p.N * p.H * p.W, p.C, p.K // p.groups * p.R * p.S)
                n_same += (s.P, s.Q) == (s.H, s.W)
            else:
                assert 2 * m * n * k == s.flops, s.name
    assert n_same >= 2


def test_flops_and_bytes_are_the_same_for_every_op():
    for p in PROBLEMS:
        for dtype in ("fp32", "fp16"):
            ps = [replace(p, op=op, dtype=dtype) for op in OPS]
            assert (
                len({q.flops for q in ps}) == 1 and ps[0].flops == 2 * p.N * p.K * p.P * p.Q * p.C_per_group * p.R * p.S
            )
            item = 4 if dtype == "fp32" else 2
            for q in ps:
                a, b = q.input_shapes
                assert q.min_bytes == item * (math.prod(a) + math.prod(b) + math.prod(q.output_shape))
                assert q.min_bytes == item * (q.x_numel + q.w_numel + q.y_numel)


def test_op_field_label_as_dict_and_validation():
    p = Conv2dProblem(N=2, C=6, H=10, W=8, K=4, R=3, S=5, stride=(2, 1), padding=(1, 2), dilation=2, groups=2)
    assert p.op == "fprop" and p.name == "N2 C6 10x8 K4 3x5 s2,1 p1,2 d2 g2"  # fprop labels unchanged
    d = Conv2dProblem(N=2, C=6, H=10, W=8, K=4, R=3, S=5, stride=(2, 1), padding=(1, 2), dilation=2, groups=2,
                      op="dgrad")
    assert d.name == "dgrad N2 C6 10x8 K4 3x5 s2,1 p1,2 d2 g2"
    assert replace(p, op="wgrad", name="").name == "wgrad N2 C6 10x8 K4 3x5 s2,1 p1,2 d2 g2"
    assert d != p and d == replace(p, op="dgrad") and hash(d) == hash(replace(p, op="dgrad"))
    keys = list(d.as_dict())
    assert d.as_dict()["op"] == "dgrad" and p.as_dict()["op"] == "fprop"
    assert keys.index("op") == keys.index("layout") + 1
    with pytest.raises(ValueError, match=r"op must be one of \('fprop', 'dgrad', 'wgrad'\); got 'bprop'"):
        Conv2dProblem(N=1, C=1, H=3, W=3, K=1, R=1, S=1, op="bprop")
    # the field sits after layout and before name
    from dataclasses import fields

    names = [f.name for f in fields(Conv2dProblem)]
    assert names[names.index("layout") + 1 : names.index("layout") + 3] == ["op", "name"]
