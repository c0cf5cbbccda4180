"""The float64 reference and the comparison of `helpers.check`, on the CPU.

`check()` itself launches kernels (tests/gpu); everything it relies on to judge an output —
banding, the reference, the rounding bound, the norm-wise limit, bitwise equality — runs here.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from helpers.problem import Conv2dProblem
from helpers.reference import _bands, bitwise_equal, compare, reference, reference_band, rel_l2_limit


def random_problem(rng: random.Random, layout: str = "NCHW") -> Conv2dProblem:
    """A small random valid problem with strides, padding, dilation and groups."""
    while True:
        g = rng.choice([1, 1, 2, 3])
        try:
            return Conv2dProblem(
                N=rng.randint(1, 3),
                C=g * rng.randint(1, 3),
                H=rng.randint(1, 14),
                W=rng.randint(1, 14),
                K=g * rng.randint(1, 3),
                R=rng.randint(1, 5),
                S=rng.randint(1, 5),
                stride=rng.choice([1, 2, (1, 3), (2, 1)]),
                padding=rng.choice([0, 1, 2, (0, 2), (3, 1)]),
                dilation=rng.choice([1, 1, 2, (1, 2)]),
                groups=g,
                layout=layout,
            )
        except ValueError:  # filter larger than the padded image: draw again
            continue


def torch_reference(p: Conv2dProblem, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The whole conv in float64 by torch, logical NCHW."""
    return F.conv2d(p.to_nchw(x).double(), p.w_to_kcrs(w).double(), **p.torch_kwargs())


def banded(p: Conv2dProblem, x: torch.Tensor, w: torch.Tensor, max_elems: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Assemble the output from `reference_band` over `_bands`; also return how often each element was written."""
    out = torch.full((p.N, p.K, p.P, p.Q), float("nan"), dtype=torch.float64)
    hits = torch.zeros(p.N, p.K, p.P, p.Q, dtype=torch.int64)
    x4, w4 = p.to_nchw(x), p.w_to_kcrs(w)
    for n0, n1, p0, p1 in _bands(p, max_elems):
        band = reference_band(p, x4, w4, n0, n1, p0, p1)
        assert band.shape == (n1 - n0, p.K, p1 - p0, p.Q), (n0, n1, p0, p1, band.shape)
        assert band.dtype == torch.float64
        out[n0:n1, :, p0:p1] = band
        hits[n0:n1, :, p0:p1] += 1
    return out, hits


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("max_elems", [1, 50, 400, 2**26])
def test_banded_reference_equals_torch(layout: str, max_elems: int):
    rng = random.Random(1000 + max_elems)
    for i in range(40):
        p = random_problem(rng, layout)
        x, w = p.make_inputs(seed=i)
        out, hits = banded(p, x, w, max_elems)
        assert bool((hits == 1).all()), f"{p.name}: bands do not tile the output exactly once"
        torch.testing.assert_close(out, torch_reference(p, x, w), rtol=1e-12, atol=1e-12, msg=p.name)


def test_bands_split_rows_and_images():
    p = Conv2dProblem(N=3, C=2, H=20, W=10, K=2, R=3, S=3, padding=1)
    per_image = p.C * p.H * p.W + p.K * p.P * p.Q
    whole = list(_bands(p, 10 * per_image))
    assert whole == [(0, 3, 0, 20)]
    by_image = list(_bands(p, per_image))
    assert by_image == [(0, 1, 0, 20), (1, 2, 0, 20), (2, 3, 0, 20)]
    by_rows = list(_bands(p, per_image // 4))
    assert len(by_rows) > 3 and all(n1 == n0 + 1 and p1 - p0 < p.P for n0, n1, p0, p1 in by_rows)


def test_reference_matches_torch_nhwc():
    p = Conv2dProblem(N=2, C=4, H=9, W=7, K=6, R=3, S=2, stride=(2, 1), padding=(1, 0), groups=2, layout="NHWC")
    x, w = p.make_inputs(seed=5)
    ref = reference(p, x, w)
    assert ref.shape == (p.N, p.K, p.P, p.Q) and ref.dtype == torch.float64
    torch.testing.assert_close(ref, torch_reference(p, x, w), rtol=1e-12, atol=1e-12)


def _to_layout(p: Conv2dProblem, y_nchw: torch.Tensor) -> torch.Tensor:
    return y_nchw.permute(0, 2, 3, 1).contiguous() if p.layout == "NHWC" else y_nchw.contiguous()


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("max_elems", [64, 2**26])
def test_compare_exact_reference_has_zero_error(layout: str, max_elems: int):
    # fp64 output equal to the reference: no error at all
    p = Conv2dProblem(N=2, C=6, H=11, W=9, K=4, R=3, S=3, padding=1, dilation=(1, 2), groups=2, dtype="fp64",
                      layout=layout)
    x, w = p.make_inputs(seed=2)
    y = _to_layout(p, reference(p, x, w))
    r = compare(p, x, w, y, accum="fp64", max_elems=2**26)
    assert (r["max_abs_err"], r["worst_err_over_bound"], r["rel_l2"], r["nonfinite"]) == (0, 0, 0, 0)
    assert r["exact_equal"] is None  # not asked for
    # fp32 integer inputs: the reference rounded to fp32 is exact, so bit-exact
    p = Conv2dProblem(N=2, C=6, H=11, W=9, K=4, R=3, S=3, stride=(1, 2), padding=2, groups=2, layout=layout)
    x, w = p.make_inputs(kind="int", seed=2)
    y = _to_layout(p, reference(p, x, w).float())
    r = compare(p, x, w, y, exact=True, max_elems=max_elems)
    assert r["exact_equal"] is True
    assert (r["max_abs_err"], r["worst_err_over_bound"], r["rel_l2"], r["nonfinite"]) == (0, 0, 0, 0)


def test_compare_fp32_rounding_is_within_bound():
    p = Conv2dProblem(N=2, C=16, H=12, W=12, K=8, R=3, S=3, padding=1)
    x, w = p.make_inputs(seed=3)
    y = F.conv2d(x, w, **p.torch_kwargs())  # fp32 torch on the CPU: another summation order
    r = compare(p, x, w, y, exact=True)
    assert 0 < r["worst_err_over_bound"] <= 1
    assert 0 < r["rel_l2"] <= rel_l2_limit(p)
    assert r["exact_equal"] in (True, False)


@pytest.mark.parametrize("max_elems", [100, 2**26])
def test_compare_flags_one_wrong_element(max_elems: int):
    p = Conv2dProblem(N=2, C=8, H=10, W=12, K=4, R=3, S=3, padding=1)
    x, w = p.make_inputs(seed=4)
    y = reference(p, x, w).float()
    assert compare(p, x, w, y, max_elems=max_elems)["worst_err_over_bound"] <= 1
    y[1, 3, 9, 11] += 1e-2
    r = compare(p, x, w, y, max_elems=max_elems)
    assert r["worst_err_over_bound"] > 1
    assert r["max_abs_err"] == pytest.approx(1e-2, rel=1e-3)
    assert r["nonfinite"] == 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_compare_counts_nonfinite(bad: float):
    p = Conv2dProblem(N=1, C=3, H=8, W=8, K=2, R=3, S=3, padding=1)
    x, w = p.make_inputs(seed=6)
    y = reference(p, x, w).float()
    y[0, 1, 4, 4] = bad
    r = compare(p, x, w, y)
    assert r["nonfinite"] == 1
    assert r["worst_err_over_bound"] == float("inf")


def test_rel_l2_limit_catches_a_dropped_filter_tap():
    p = Conv2dProblem(N=2, C=64, H=16, W=16, K=16, R=3, S=3, padding=1)
    x, w = p.make_inputs(seed=7)
    w_dropped = w.clone()
    w_dropped[:, :, 2, 1] = 0  # a kernel that forgets the tap (r, s) = (2, 1)
    y = F.conv2d(x.double(), w_dropped.double(), **p.torch_kwargs()).float()
    r = compare(p, x, w, y)
    assert r["rel_l2"] > rel_l2_limit(p)
    good = compare(p, x, w, F.conv2d(x, w, **p.torch_kwargs()))
    assert good["rel_l2"] < rel_l2_limit(p)


def test_rel_l2_limit_values():
    p = Conv2dProblem(N=1, C=1, H=4, W=4, K=1, R=1, S=1)  # n = 1: the 1e-4 floor
    assert rel_l2_limit(p) == 1e-4
    big = Conv2dProblem(N=1, C=2**20, H=1, W=1, K=1, R=3, S=3, padding=1)
    assert rel_l2_limit(big) == pytest.approx(16 * (9 * 2**20) ** 0.5 * 2**-24 + 4 * 2**-24)
    assert rel_l2_limit(big, accum="fp64") == 1e-4


def test_bitwise_equal():
    a = torch.tensor([1.0, float("nan"), -0.0, 3.5])
    assert bitwise_equal(a, a.clone())  # NaN == NaN bitwise
    assert not bitwise_equal(a, torch.tensor([1.0, float("nan"), 0.0, 3.5]))  # -0.0 != +0.0
    assert not bitwise_equal(a, torch.tensor([1.0, float("nan"), -0.0, 3.5000002]))  # one ulp
    assert not bitwise_equal(a, a.double())  # dtype differs
    assert not bitwise_equal(a, a.reshape(2, 2))  # shape differs
    h = torch.tensor([1.0, 2.0], dtype=torch.float16)
    assert bitwise_equal(h, h.clone())
    assert not bitwise_equal(h, torch.tensor([1.0, 2.0], dtype=torch.bfloat16))
    d = torch.randn(3, 4, dtype=torch.float64)
    assert bitwise_equal(d, d.clone())


def test_band_inside_the_padding():
    # Output rows 0-1 read only top padding rows, the last rows only bottom padding rows
    # (a band whose input window lies wholly outside the image must still be all zeros).
    p = Conv2dProblem(N=1, C=2, H=10, W=5, K=3, R=1, S=3, padding=(3, 1))
    x, w = p.make_inputs(seed=8)
    x4, w4 = p.to_nchw(x), p.w_to_kcrs(w)
    for p0, p1 in [(0, 1), (1, 3), (0, 3), (13, 16), (14, 16), (2, 14)]:
        band = reference_band(p, x4, w4, 0, 1, p0, p1)
        torch.testing.assert_close(band, torch_reference(p, x, w)[:, :, p0:p1], rtol=1e-12, atol=1e-12)
    assert float(reference_band(p, x4, w4, 0, 1, 0, 3).abs().max()) == 0


def test_compare_refuses_a_y_of_the_wrong_shape():
    """A y with one channel used to broadcast against all K channels of the reference and pass."""
    p = Conv2dProblem(N=1, C=2, H=6, W=5, K=2, R=3, S=3, padding=1)
    x, w = p.make_inputs(kind="int")
    w[1] = w[0]  # both output channels equal, so a single-channel y matches every channel
    y1 = F.conv2d(x.double(), w.double(), **p.torch_kwargs())[:, :1].float()
    with pytest.raises(ValueError, match="y must have shape"):
        compare(p, x, w, y1, exact=True)


def test_compare_and_reference_refuse_inputs_of_the_wrong_shape():
    """Inputs are checked against the op's input shapes too (swapped x, w used to fail deep in torch, or not)."""
    p = Conv2dProblem(N=1, C=2, H=6, W=5, K=2, R=3, S=3, padding=1)
    x, w = p.make_inputs()
    y = reference(p, x, w).float()
    with pytest.raises(ValueError, match=r"fprop takes x of shape \(1, 2, 6, 5\) \(NCHW\) as input 1"):
        compare(p, w, x, y)
    with pytest.raises(ValueError, match=r"fprop takes w of shape \(2, 2, 3, 3\) \(NCHW\) as input 2"):
        reference(p, x, x)
