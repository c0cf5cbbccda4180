"""Day 14's mappings on the CPU: dgrad's filter-phase split and wgrad's split-K (`days.day14_backward`).

* `dgrad_by_phases` equals the harness's float64 reference (`helpers.reference.reference`, which is
  ``torch.ops.aten.convolution_backward``) on random problems with strides (1, 1) to (3, 2), both
  dilations (1, 2) and (2, 1), padding up to the dilated filter, odd and even sizes, N > 1 and
  C in {1, 3, odd}; exactly on integer inputs;
* every tap belongs to exactly one phase per axis, and the phases cover every dx row once;
* dx positions no tap reaches (stride larger than the dilated filter) are exactly 0;
* the phase split does no more multiplications than the useful ones plus dy's borders, and the
  naive walk does stride_h·stride_w times as many as the phases for a stride with no empty phase;
* a planted fault (one tap's offset off by one) is caught;
* the dgrad variant's launches: `simulate` (dx from the launches' arguments, NaN where none
  writes) equals the reference, B read from w in place and from the transposed phase filters;
  one ``zero`` launch, only where a pixel gets no tap, writes exactly the pixels no tap reaches,
  and every dx element is written once across all launches (strides past the filter, odd sizes,
  strides (2, 1) and (1, 2), dilations (1, 2) and (2, 1)); strides past the zero kernel's 32-bit
  phase masks are refused before any launch;
* reading w in place: the optimized path (K, C multiples of 8) has no filter launch and no
  workspace and passes w and each phase's taps (r_first, r_step per axis, as model.py's taps
  say), the other iterators keep the transposed filter; the in-place B addresses read exactly the
  transposed filter's elements; the [BK][BN] stage's swizzle is conflict-free for the cp.async
  stores and the ldmatrix.trans reads, whose fragments are the mma.sync B layout;
* split-K: the slices are whole BK steps, none empty, covering GEMM-K once; dw from fp32 partials
  summed in slice order equals the reference bit for bit on integer inputs and stays inside the
  fp32 bound (`helpers.reference.compare`) for 1 to 64 slices; a dropped slice is caught.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from days import day14_backward as d14
from helpers.launch import prepare
from helpers.problem import Conv2dProblem
from helpers.reference import compare, reference
from helpers.variants import Buffer


def dgrad(**kw) -> Conv2dProblem:
    return Conv2dProblem(op="dgrad", **kw)


CASES = [
    dgrad(N=2, C=3, H=9, W=8, K=4, R=3, S=3, stride=2, padding=1),  # odd H with stride 2
    dgrad(N=1, C=1, H=10, W=11, K=2, R=2, S=4, stride=(2, 3), padding=(1, 2)),  # even filters
    dgrad(N=2, C=5, H=12, W=9, K=3, R=3, S=3, stride=(1, 2), padding=(2, 1), dilation=(2, 1)),
    dgrad(N=1, C=3, H=13, W=10, K=6, R=3, S=2, stride=(3, 2), padding=(1, 0), dilation=(1, 2)),
    dgrad(N=1, C=2, H=11, W=11, K=3, R=1, S=1, stride=3),  # stride > filter: rows no tap reaches
    dgrad(N=3, C=7, H=7, W=6, K=5, R=3, S=3, padding=1),  # unit stride: one phase, all taps
    dgrad(N=1, C=4, H=8, W=8, K=4, R=5, S=5, stride=2, padding=4),  # padding up to R - 1
]


def random_cases(n: int, seed: int = 7) -> list[Conv2dProblem]:
    rng, out = random.Random(seed), []
    while len(out) < n:
        R, S = rng.randint(1, 5), rng.randint(1, 5)
        sh, sw, dh, dw = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 2), rng.randint(1, 2)
        ph, pw = rng.randint(0, dh * (R - 1)), rng.randint(0, dw * (S - 1))
        H, W = rng.randint(1, 14), rng.randint(1, 14)
        if H + 2 * ph < dh * (R - 1) + 1 or W + 2 * pw < dw * (S - 1) + 1:
            continue  # no output: not a convolution
        out.append(dgrad(N=rng.randint(1, 2), C=rng.choice([1, 3, 5, 8]), H=H, W=W, K=rng.randint(1, 6), R=R, S=S,
                         stride=(sh, sw), padding=(ph, pw), dilation=(dh, dw)))
    return out


@pytest.mark.parametrize("p", CASES + random_cases(40), ids=lambda p: p.name)
@pytest.mark.parametrize("kind", ["normal", "int"])
def test_phases_compose_dgrad(p, kind):
    dy, w = p.make_inputs(kind=kind, seed=3)
    ref = reference(p, dy, w)
    got = d14.dgrad_by_phases(p, p.to_logical(dy), p.to_logical(w))
    if kind == "int":
        assert torch.equal(got, ref)
    else:
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("p", CASES + random_cases(40, seed=11), ids=lambda p: p.name)
def test_each_tap_in_one_phase_and_each_row_in_one_phase(p):
    rows_phases, cols_phases = d14.dgrad_phases(p)
    for length, taps, phases in ((p.H, p.R, rows_phases), (p.W, p.S, cols_phases)):
        assert sorted(t for ph in phases for t in ph.taps) == list(range(taps))
        rows = sorted(ph.phase + i * len(phases) for ph in phases for i in range(ph.rows))
        assert rows == list(range(length))


def test_rows_no_tap_reaches_are_exactly_zero():
    p = CASES[4]  # 1 x 1 filter, stride 3: only rows and columns 0, 3, 6, 9 receive a tap
    dy, w = p.make_inputs(seed=1)
    dx = d14.dgrad_by_phases(p, dy, w)
    reached = torch.zeros(p.H, p.W, dtype=torch.bool)
    reached[::3, ::3] = True
    assert bool((dx[:, :, ~reached] == 0).all()) and bool((dx[:, :, reached] != 0).any())
    phases_h = d14.dgrad_phases(p)[0]
    assert [len(a.taps) for a in phases_h] == [1, 0, 0]


def test_mac_counts():
    for p in CASES + random_cases(20, seed=5):
        c = d14.dgrad_mac_counts(p)
        assert c["useful"] <= c["phases"] <= c["naive"]
    p = dgrad(N=1, C=8, H=56, W=56, K=8, R=3, S=3, stride=2, padding=1)
    c = d14.dgrad_mac_counts(p)
    assert c["naive"] == 8 * 8 * 56 * 56 * 9
    assert c["naive"] / c["phases"] == pytest.approx(4.0)  # 9 taps in phases of 4, 2, 2 and 1
    unit = d14.dgrad_mac_counts(CASES[5])
    assert unit["phases"] == unit["naive"]


def test_a_planted_offset_error_is_caught(monkeypatch):
    p = CASES[0]
    dy, w = p.make_inputs(kind="int", seed=2)
    good = d14.axis_phases

    def off_by_one(*args):
        ph = good(*args)
        a = ph[0]
        return [a._replace(offsets=(a.offsets[0] + 1, *a.offsets[1:]))] + ph[1:]

    monkeypatch.setattr(d14.model, "axis_phases", off_by_one)
    assert not torch.equal(d14.dgrad_by_phases(p, p.to_logical(dy), p.to_logical(w)), reference(p, dy, w))


def test_refusals():
    with pytest.raises(ValueError, match="dgrad problem"):
        d14.dgrad_by_phases(Conv2dProblem(N=1, C=1, H=4, W=4, K=1, R=3, S=3), torch.zeros(1), torch.zeros(1))
    with pytest.raises(ValueError, match="groups = 2"):
        d14.dgrad_mac_counts(dgrad(N=1, C=4, H=4, W=4, K=4, R=3, S=3, groups=2))
    p = CASES[0]
    with pytest.raises(ValueError, match="expected"):
        d14.dgrad_by_phases(p, torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1))
    with pytest.raises(ValueError, match="bad axis"):
        d14.axis_phases(4, 2, 3, 0, 1, 1)


# ---- wgrad split-K ------------------------------------------------------------------------------


@pytest.mark.parametrize("length, splits, bk", [(100, 3, 32), (64, 5, 32), (10, 4, 32), (1000, 7, 32), (4096, 16, 64),
                                                (33, 33, 1), (1, 1, 32)])
def test_split_k_slices_are_whole_steps_covering_gemm_k_once(length, splits, bk):
    sl = d14.split_k_slices(length, splits, bk)
    steps = -(-length // bk)
    assert len(sl) == min(splits, steps)
    assert sl[0][0] == 0 and sl[-1][1] == length and all(a[1] == b[0] for a, b in zip(sl, sl[1:]))
    assert all(k1 > k0 for k0, k1 in sl) and all((k1 - k0) % bk == 0 for k0, k1 in sl[:-1])
    per = [-(-(k1 - k0) // bk) for k0, k1 in sl]
    assert max(per) - min(per) <= 1


WGRAD_CASES = [
    Conv2dProblem(N=2, C=3, H=9, W=8, K=4, R=3, S=3, stride=2, padding=1, op="wgrad"),
    Conv2dProblem(N=3, C=5, H=12, W=9, K=6, R=3, S=2, stride=(1, 2), padding=(2, 1), dilation=(2, 1), op="wgrad"),
    Conv2dProblem(N=4, C=8, H=16, W=16, K=8, R=1, S=1, op="wgrad"),
]


@pytest.mark.parametrize("p", WGRAD_CASES, ids=lambda p: p.name)
@pytest.mark.parametrize("splits", [1, 2, 3, 7, 64])
def test_split_k_wgrad_matches_the_reference(p, splits):
    xi, dyi = p.make_inputs(kind="int", seed=4)
    dw = d14.wgrad_split_k(p, p.to_logical(xi), p.to_logical(dyi), splits, bk=8)
    assert torch.equal(dw.double(), reference(p, xi, dyi))  # integers: every partial sum is exact in fp32
    x, dy = p.make_inputs(seed=4)
    r = compare(p, x, dy, d14.wgrad_split_k(p, p.to_logical(x), p.to_logical(dy), splits, bk=8))
    assert r["worst_err_over_bound"] <= 1 and r["nonfinite"] == 0, r


def test_a_dropped_slice_is_caught(monkeypatch):
    p = WGRAD_CASES[2]
    x, dy = p.make_inputs(seed=1)
    good = d14.split_k_slices
    monkeypatch.setattr(d14.model, "split_k_slices", lambda *a: good(*a)[:-1])  # the last slice never runs
    r = compare(p, x, dy, d14.wgrad_split_k(p, p.to_logical(x), p.to_logical(dy), 4, bk=8))
    assert r["worst_err_over_bound"] > 1


def test_split_k_refusals():
    with pytest.raises(ValueError, match="must all be >= 1"):
        d14.split_k_slices(0, 2)
    with pytest.raises(ValueError, match="wgrad problem"):
        d14.wgrad_split_k(replace(WGRAD_CASES[0], op="dgrad"), torch.zeros(1), torch.zeros(1), 2)
    with pytest.raises(ValueError, match="expected"):
        d14.wgrad_split_k(WGRAD_CASES[0], torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1), 2)


# ---- the kernels' arguments, simulated on the CPU -----------------------------------------------

PAST_DILATED = dgrad(N=1, C=3, H=7, W=6, K=2, R=3, S=2, padding=(3, 2))  # padding past the dilated filter
NHWC = dict(dtype="fp16", layout="NHWC")
ALL_PADDING = dict(N=1, C=8, H=1, W=1, K=8, R=1, S=1, stride=3, padding=1)  # the one tap reads padding: dx = 0


@pytest.mark.parametrize("p", CASES + [PAST_DILATED, dgrad(**ALL_PADDING)] + random_cases(40, seed=11),
                         ids=lambda p: p.name)
@pytest.mark.parametrize("from_w", [True, False], ids=["in_place", "transposed"])
def test_dgrad_launch_arguments_compose_dgrad(p, from_w):
    """`days.day14_backward.dgrad.simulate` runs what the launches say (B read from w by the
    in-place addresses, or the phase filters' layout and offsets; each phase's padding, dilation
    and output rows, the zero launch's pixels) and must give dgrad exactly on integer inputs (a
    pixel no launch writes would stay NaN)."""
    dy, w = p.make_inputs(kind="int", seed=5)
    assert torch.equal(d14.dgrad.simulate(p, p.to_logical(dy), p.to_logical(w), from_w), reference(p, dy, w))


def test_phase_filters_hold_every_tap_once():
    p = CASES[3]
    w = torch.arange(p.K * p.C * p.R * p.S, dtype=torch.float64).reshape(p.K, p.C, p.R, p.S) + 1
    wt = d14.dgrad.filter_phases(p, w)
    assert sorted(wt.tolist()) == sorted(w.flatten().tolist())


def test_a_planted_filter_rank_error_is_caught(monkeypatch):
    """Taps in ascending r instead of ascending dy offset (the filter not turned around): caught,
    in the transposed filter and in the in-place addresses (first tap the smallest, step upwards)."""
    p = CASES[5]
    dy, w = p.make_inputs(kind="int", seed=5)
    good = d14.dgrad.filter_phases
    monkeypatch.setattr(d14.dgrad, "filter_phases", lambda q, t: good(q, t.flip(2, 3)))
    assert not torch.equal(d14.dgrad.simulate(p, p.to_logical(dy), p.to_logical(w), False), reference(p, dy, w))
    good_b = d14.dgrad.in_place_b

    def ascending(q, ph):
        first = (min(ph.rows.taps), min(ph.cols.taps))
        return good_b(q, replace(ph, first=first, step=(-ph.step[0], -ph.step[1])))

    monkeypatch.setattr(d14.dgrad, "in_place_b", ascending)
    assert not torch.equal(d14.dgrad.simulate(p, p.to_logical(dy), p.to_logical(w), True), reference(p, dy, w))


@pytest.mark.parametrize("d", [1, 2, 3, 5, 7, 49, 56, 196, 784, 3136, 12544, 100352, 2**20 + 1, 2**30, 2**31 - 1])
def test_fast_div_matches_integer_division(d):
    mul, shift = d14.fast_div(d)
    assert 0 < mul < 2**32 and 0 <= shift <= 31
    rng = torch.Generator().manual_seed(d)
    n = torch.randint(0, 2**31 - 1, (20000,), generator=rng).tolist()
    n += [0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, 2**31 - 2, 2**31 - 1]
    n = [v for v in n if 0 <= v < 2**31]
    got = d14.fast_div_apply(n, mul, shift)
    assert got.tolist() == [v // d for v in n]


def test_fast_div_refuses_what_it_cannot_divide_by():
    for d in (0, -3, 2**31):
        with pytest.raises(ValueError, match="divisor"):
            d14.fast_div(d)


def test_split_rule_keeps_slices_long_and_fills_the_gpu():
    from helpers.suites import suite

    for p in suite("resnet50", dtype="fp16", layout="NHWC", op="wgrad"):
        cfg = d14.choose_wgrad(p)
        steps = -(-p.N * p.P * p.Q // cfg.tile.bk)
        assert 1 <= cfg.splits <= max(1, steps // d14.wgrad.MIN_SLICE_STEPS), (p.name, cfg)
        sl = d14.wgrad.slices(p, cfg)
        assert len(sl) == cfg.splits and sl[0][0] == 0 and sl[-1][1] == p.N * p.P * p.Q
        if cfg.splits > 1:  # split only where the partials cost at most a quarter of the main loop
            traffic = cfg.splits * p.K * p.C * p.R * p.S * 8 / d14.wgrad.PARTIAL_BYTES_PER_S
            assert traffic <= d14.wgrad.PARTIAL_SHARE * p.flops / d14.wgrad.MAIN_LOOP_FLOPS
    big = Conv2dProblem(N=256, C=64, H=56, W=56, K=64, R=1, S=1, op="wgrad", dtype="fp16", layout="NHWC")
    assert d14.choose_wgrad(big).splits > 100  # 64 x 64 outputs over 802,816 pixels: split finely


def test_wgrad_refusals():
    v = d14.WGRAD
    base = dict(N=2, H=8, W=8, R=3, S=3, padding=1, op="wgrad", dtype="fp16", layout="NHWC")
    assert v.supports(Conv2dProblem(C=16, K=16, **base)) is None
    assert "C % 8 == 0" in v.supports(Conv2dProblem(C=3, K=16, **base))
    assert "K % 8 == 0" in v.supports(Conv2dProblem(C=16, K=12, **base))
    huge = Conv2dProblem(N=2**16, C=8, H=182, W=182, K=8, R=1, S=1, op="wgrad", dtype="fp16", layout="NHWC")
    assert "2^31" in v.supports(huge, smem_limit=2**31)
    with pytest.raises(ValueError, match="mode"):
        d14.make_wgrad("w", mode="atomic")
    with pytest.raises(ValueError, match="splits"):
        d14.make_wgrad("w", splits=0)


# ---- the kernels in a model --------------------------------------------------------------------


def test_conv2d_refuses_bad_input_before_any_launch():
    x = torch.zeros(2, 16, 8, 8, dtype=torch.float16).to(memory_format=torch.channels_last)
    w = torch.zeros(16, 16, 3, 3, dtype=torch.float16).to(memory_format=torch.channels_last)
    with pytest.raises(TypeError, match="fp16 or bf16"):
        d14.train.conv2d(x.float(), w.float(), padding=1)
    with pytest.raises(ValueError, match="input channels"):
        d14.train.conv2d(x, w[:, :8], padding=1)
    with pytest.raises(ValueError, match=r"x is on cpu.*x\.cuda\(\)"):
        d14.train.conv2d(x, w, padding=1)


# (problem, whether a dx pixel gets no tap): fp16 NHWC, as the variant runs them
ZERO_CASES = [
    (dgrad(N=2, C=16, H=9, W=7, K=8, R=1, S=1, stride=2, **NHWC), True),  # strided 1x1, odd H and W
    (dgrad(N=2, C=64, H=6, W=40, K=8, R=1, S=1, stride=2, **NHWC), True),  # rows of 320 runs: 2 blocks in y
    (dgrad(N=1, C=3, H=11, W=10, K=4, R=1, S=1, stride=3, **NHWC), True),  # stride 3 > 1x1, element stores
    (dgrad(N=2, C=8, H=11, W=13, K=16, R=2, S=2, stride=3, padding=1, **NHWC), True),  # stride 3 > 2x2
    (dgrad(N=2, C=8, H=9, W=8, K=8, R=1, S=1, stride=(2, 1), **NHWC), True),  # rows without taps only
    (dgrad(N=2, C=5, H=8, W=9, K=8, R=1, S=1, stride=(1, 2), **NHWC), True),  # columns without taps only
    (dgrad(N=2, C=16, H=12, W=15, K=8, R=3, S=2, stride=2, padding=1, dilation=(1, 2), **NHWC), True),
    (dgrad(N=2, C=8, H=15, W=12, K=24, R=3, S=2, stride=(2, 1), padding=1, dilation=(2, 1), **NHWC), True),
    (dgrad(**ALL_PADDING, **NHWC), True),  # no phase GEMM at all: the zero launch writes all of dx
    (dgrad(N=3, C=16, H=13, W=11, K=8, R=3, S=3, stride=2, padding=1, **NHWC), False),  # odd H, W; all phases tapped
    (dgrad(N=2, C=8, H=10, W=11, K=8, R=4, S=2, stride=(1, 2), padding=(1, 0), **NHWC), False),
    (dgrad(N=3, C=7, H=7, W=6, K=5, R=3, S=3, padding=1, **NHWC), False),  # unit stride
]


def no_tap(p: Conv2dProblem) -> np.ndarray:
    """(H, W) bool: the dx pixels no filter tap reaches, from the divisibility test alone (no
    phases): no r with (h + pad_h − r·dil_h) a multiple of stride_h, or none such s on W."""

    def axis(n: int, taps: int, s: int, pad: int, d: int) -> np.ndarray:
        return np.array([all((x + pad - r * d) % s for r in range(taps)) for x in range(n)], dtype=bool)

    rows = axis(p.H, p.R, p.stride[0], p.padding[0], p.dilation[0])
    return rows[:, None] | axis(p.W, p.S, p.stride[1], p.padding[1], p.dilation[1])[None, :]


@pytest.mark.parametrize("p, zeros", ZERO_CASES, ids=[p.name for p, _ in ZERO_CASES])
def test_one_zero_launch_writes_the_pixels_no_tap_reaches(p, zeros):
    """The filter kernel (off the in-place path), one GEMM per phase pair with taps, then one
    ``zero`` launch exactly where some pixel gets no tap; its pixels are those no tap reaches, and
    across all launches every dx element is written exactly once (`Variant.covers`)."""
    v = d14.DGRAD
    assert v.supports(p) is None, v.supports(p)
    ks = v.launches(p)
    assert [k.name for k in ks] == ["filter"] * (not d14.dgrad.in_place(p)) \
        + [f"phase_{a.rows.phase}_{a.cols.phase}" for a in d14.dgrad_plan(p)] + ["zero"] * zeros
    expect = no_tap(p)
    assert bool(expect.any()) == zeros
    assert np.array_equal(d14.dgrad.zero_pixels(p), expect)
    if zeros:
        zh, zw = ks[-1].args[-2:]
        assert (type(zh), type(zw)) == (np.uint32, np.uint32) and (int(zh), int(zw)) == d14.dgrad.zero_masks(p)
    counts = np.asarray(v.covers(p))
    assert counts.shape == (p.N * p.H * p.W * p.C,) and bool((counts == 1).all()), np.bincount(counts)


def test_zero_launch_model_follows_its_grid():
    """With the zero launch's grid capped at one block in y, the model leaves exactly the pixels
    of runs 256 and later of each row unwritten (what tests/gpu/test_correctness.py compares with
    the kernel): here columns 32 .. 39 (8 runs of 8 channels per pixel) of the pixels no tap reaches."""
    p = ZERO_CASES[1][0]
    capped = d14.DGRAD.with_output_launch(lambda cfg: replace(cfg, grid=(cfg.grid[0], 1, 1)), name="dgrad_capped")
    assert [k.name for k in capped.launches(p)][-1] == "zero" and d14.DGRAD.launch(p).grid[1] == 2
    unwritten = np.asarray(capped.covers(p)).reshape(p.N, p.H, p.W, p.C) == 0
    expect = no_tap(p) & (np.arange(p.W) >= 32)[None, :]
    assert np.array_equal(unwritten, np.broadcast_to(expect[None, :, :, None], unwritten.shape))


def test_stride_past_the_zero_masks_is_refused_before_any_launch():
    """The zero kernel takes each axis's phases without taps as a 32-bit mask: stride 33 with
    pixels no tap reaches is refused (by `prepare` too, on CPU tensors: before any GPU call);
    stride 32 (phases 1 .. 31 without taps) and stride 33 with every pixel tapped are not."""
    v = d14.DGRAD
    past = dgrad(N=1, C=8, H=40, W=5, K=8, R=1, S=1, stride=(33, 1), **NHWC)  # rows 1 .. 32 get no tap
    reason = v.supports(past)
    assert reason is not None and "stride <= 32" in reason and "(33, 1)" in reason, reason
    dy, w = past.make_inputs(seed=1)
    with pytest.raises(ValueError, match=r"stride <= 32 .*got stride \(33, 1\)"):
        prepare(v, past, dy, w)
    inside = replace(past, stride=(32, 1), name="")
    assert v.supports(inside) is None and d14.dgrad.zero_masks(inside) == (2**32 - 2, 0)
    assert v.launches(inside)[-1].args[-2] == np.uint32(2**32 - 2)
    one_row = replace(past, H=1, name="")  # phases 1 .. 32 have no rows: every pixel gets the tap
    assert v.supports(one_row) is None and "zero" not in [k.name for k in v.launches(one_row)]


# ---- dgrad reading w in place ------------------------------------------------------------------

# (problem, whether the phase GEMMs read w in place): fp16 NHWC
PATH_CASES = [
    (dgrad(N=2, C=16, H=13, W=11, K=8, R=3, S=3, stride=2, padding=1, **NHWC), True),
    (dgrad(N=2, C=64, H=14, W=14, K=64, R=1, S=1, stride=2, **NHWC), True),  # strided 1x1, zero launch
    (dgrad(N=2, C=16, H=9, W=10, K=16, R=3, S=3, padding=1, **NHWC), True),  # unit stride: dgrad_unit_*
    (dgrad(N=2, C=8, H=15, W=12, K=24, R=3, S=2, stride=(2, 1), padding=1, dilation=(2, 1), **NHWC), True),
    (dgrad(N=2, C=8, H=11, W=13, K=16, R=2, S=2, stride=3, padding=1, **NHWC), True),  # stride 3 > filter
    (dgrad(N=2, C=16, H=11, W=9, K=12, R=3, S=3, stride=2, padding=1, **NHWC), False),  # K % 8 != 0: analytic
    (dgrad(N=2, C=16, H=11, W=9, K=5, R=3, S=3, stride=2, padding=1, **NHWC), False),  # K <= 8: few_channels
    (dgrad(N=2, C=7, H=11, W=9, K=24, R=3, S=3, stride=2, padding=1, **NHWC), False),  # C % 8 != 0: analytic
]

# positions of a phase launch's arguments: dy, B, dx, then the ints (N, K, P, Q, C, Jh, Jw, I, J, pad_h,
# pad_w, dil_h, dil_w, H, W, sh, sw, fh, fw, R, S, r_first, r_step, s_first, s_step, swz_log)
TAP_ARGS = slice(3 + 19, 3 + 25)


@pytest.mark.parametrize("p, from_w", PATH_CASES, ids=[p.name for p, _ in PATH_CASES])
def test_in_place_path_has_no_filter_launch_and_no_workspace(p, from_w):
    """The optimized iterator (K % 8 == 0 and C % 8 == 0) reads w in place: no ``filter`` launch,
    no workspace, ``Buffer("w")`` as every phase's B; the analytic and few-channels iterators keep
    ``dgrad_filter_phases`` first, a workspace of the K·R·S·C phase filters and each phase's filter
    at its offset. Both pass the phase's taps in w, and every dx element is written once."""
    v, dg = d14.DGRAD, d14.dgrad
    assert v.supports(p) is None, v.supports(p)
    assert dg.in_place(p) == from_w == (dg.dgrad_iterator(p) == "optimized")
    ks = v.launches(p)
    phases = [k for k in ks if k.name.startswith("phase_")]
    assert len(phases) == len(dg.dgrad_plan(p)) > 0
    unit = "unit_" if p.stride == (1, 1) else ""
    assert all(k.entry.startswith(f"dgrad_{unit}") and k.entry.endswith(f"_{dg.dgrad_iterator(p)}_fp16")
               for k in phases)
    if from_w:
        assert "filter" not in [k.name for k in ks] and v.workspace_bytes(p) == 0
        assert all(k.args[1] == Buffer("w") for k in phases)
    else:
        assert ks[0].name == "filter" and ks[0].entry == "dgrad_filter_phases_fp16"
        assert v.workspace_bytes(p) == 2 * p.K * p.R * p.S * p.C
        assert [k.args[1] for k in phases] == [Buffer("workspace", 2 * ph.filter_offset) for ph in dg.dgrad_plan(p)]
    for k, ph in zip(phases, dg.dgrad_plan(p)):
        taps = tuple(int(a) for a in k.args[TAP_ARGS])
        assert taps == (p.R, p.S, ph.first[0], ph.step[0], ph.first[1], ph.step[1]), (k.name, taps)
        assert all(type(a) is np.int32 for a in k.args[3:])
    assert bool((np.asarray(v.covers(p)) == 1).all())


@pytest.mark.parametrize("p", CASES + [PAST_DILATED] + random_cases(40, seed=13), ids=lambda p: p.name)
def test_phase_taps_are_the_model_taps(p):
    """Tap j of a phase (by ascending dy offset, model.py's `axis_phases`) is filter position
    first − j·step on each axis, step = stride / gcd(stride, dilation)."""
    for ph in d14.dgrad_plan(p):
        for axis, (a, first, step) in enumerate(((ph.rows, ph.first[0], ph.step[0]),
                                                 (ph.cols, ph.first[1], ph.step[1]))):
            by_offset = [t for _, t in sorted(zip(a.offsets, a.taps))]
            assert [first - j * step for j in range(len(a.taps))] == by_offset, (axis, a)
            assert step == p.stride[axis] // np.gcd(p.stride[axis], p.dilation[axis])


def test_phase_tap_arguments_of_a_few_phases():
    """The taps the launches pass, written out by hand for a few phases."""

    def taps(p):
        return {k.name: tuple(int(a) for a in k.args[TAP_ARGS]) for k in d14.DGRAD.launches(p) if k.name != "zero"}

    # 3x3, stride 2, padding 1: phase 0 of an axis has tap 1; phase 1 taps 2, 0 (offsets 0, 1)
    p = dgrad(N=1, C=8, H=8, W=8, K=8, R=3, S=3, stride=2, padding=1, **NHWC)
    assert taps(p) == {"phase_0_0": (3, 3, 1, 2, 1, 2), "phase_0_1": (3, 3, 1, 2, 2, 2),
                       "phase_1_0": (3, 3, 2, 2, 1, 2), "phase_1_1": (3, 3, 2, 2, 2, 2)}
    # unit stride: the filter turned around, step 1
    assert taps(dgrad(N=1, C=8, H=8, W=8, K=8, R=3, S=2, padding=1, **NHWC)) == {"phase_0_0": (3, 2, 2, 1, 1, 1)}
    # stride 2, dilation (1, 2), padding (1, 2): on W every tap is in phase 0, one apart (step 2 / gcd(2, 2))
    p = dgrad(N=1, C=8, H=8, W=10, K=8, R=3, S=3, stride=2, padding=(1, 2), dilation=(1, 2), **NHWC)
    assert taps(p) == {"phase_0_0": (3, 3, 1, 2, 2, 1), "phase_1_0": (3, 3, 2, 2, 2, 1)}
    # stride 3 > a 2x2 filter, padding 1: phase 0 has tap 1, phase 2 tap 0, phase 1 none (the zero launch)
    p = dgrad(N=1, C=8, H=9, W=9, K=8, R=2, S=2, stride=3, padding=1, **NHWC)
    assert taps(p) == {"phase_0_0": (2, 2, 1, 3, 1, 3), "phase_0_2": (2, 2, 1, 3, 0, 3),
                       "phase_2_0": (2, 2, 0, 3, 1, 3), "phase_2_2": (2, 2, 0, 3, 0, 3)}


@pytest.mark.parametrize("p", CASES + [PAST_DILATED] + random_cases(40, seed=17), ids=lambda p: p.name)
def test_in_place_b_reads_the_transposed_filter(p):
    """For every phase, the element of w that GEMM-K index gk and GEMM-N index gn read in place
    (`in_place_b`) holds what the old path's transposed filter holds there (`filter_phases`:
    [C][Jh][Jw][K] at the phase's offset): strided, dilated (1, 2) and (2, 1), padded, stride 3 >
    filter, unit stride."""
    w = torch.arange(p.K * p.C * p.R * p.S, dtype=torch.float64).reshape(p.K, p.C, p.R, p.S)
    wt = d14.dgrad.filter_phases(p, w).numpy()
    w_krsc = w.permute(0, 2, 3, 1).reshape(-1).numpy()
    for ph in d14.dgrad_plan(p):
        gk_n = ph.taps[0] * ph.taps[1] * p.K
        offs = d14.dgrad.in_place_b(p, ph)
        assert offs.shape == (gk_n, p.C) and offs.min() >= 0 and offs.max() < w_krsc.size
        gk, gn = np.meshgrid(np.arange(gk_n), np.arange(p.C), indexing="ij")
        assert np.array_equal(w_krsc[offs], wt[ph.filter_offset + gn * gk_n + gk])


# the transposed path with C and K multiples of 8 (R > 16, past the optimized iterator's tap masks):
# dgrad_filter_phases reads w in 16-byte loads there
VECTOR_FILTER_CASE = dgrad(N=1, C=16, H=24, W=8, K=16, R=17, S=1, padding=(8, 0), **NHWC)


@pytest.mark.parametrize("p, vector_w", [(p, from_w) for p, from_w in PATH_CASES[:1] + PATH_CASES[-3:-2]]
                         + [(VECTOR_FILTER_CASE, True)], ids=["in_place", "analytic", "transposed_vec"])
def test_w_alignment_where_it_is_read_in_16_bytes(p, vector_w):
    """w is read in 16-byte accesses by the in-place loads (cp.async) and, with C and K multiples
    of 8, by the filter kernel of the transposed path: a misaligned w is refused there, naming
    it, before any launch (it faulted and poisoned the context); element by element (C or K not
    a multiple of 8) the filter kernel takes it."""
    v = d14.DGRAD
    assert v.supports(p) is None, v.supports(p)
    if p is VECTOR_FILTER_CASE:
        assert not d14.dgrad.in_place(p) and any(k.name == "filter" for k in v.launches(p))
    dy, w = p.make_inputs()
    w_off = torch.zeros(w.numel() + 1, dtype=w.dtype)[1:].view(w.shape)  # 2 bytes off
    reason = v.plan(p).tensor_reason({"dy": dy, "w": w_off, "dx": None})
    assert (reason is not None and "w.data_ptr() is not 16-byte aligned" in reason) == vector_w, reason
    assert v.plan(p).tensor_reason({"dy": dy, "w": w, "dx": None}) is None


# ---- the [BK][BN] stage of the in-place B, modelled ---------------------------------------------


def swz_trans(row: int, ch: int, cols: int) -> int:
    """``swz_trans<COLS>`` of tensor_core.cuh: halves offset of chunk ch of row r."""
    return row * cols + ((ch ^ (row & 7)) << 3)


def bank_group(halves: int) -> int:
    """The 16-byte bank group (4 banks of 4 bytes) of a halves offset in shared memory."""
    return (2 * halves // 16) % 8


def in_place_tiles():
    from days.day13_igemm_production import TileDescription

    return [TileDescription.parse(t) for t, its in d14.dgrad.instantiated().items() if "optimized" in its]


@pytest.mark.parametrize("tile", in_place_tiles(), ids=lambda t: t.name)
def test_in_place_stage_swizzle_is_conflict_free(tile):
    """The loader's chunks (thread tid, chunk u: row tid / (BN/8) + (THREADS / (BN/8))·u, column
    tid % (BN/8)) fill the [BK][BN] stage once; each 8 threads of a warp that one 16-byte store
    phase serves write 8 different bank groups; and each 8x8 matrix of an ldmatrix.trans (8 rows of
    one chunk column) reads 8 different bank groups."""
    bn, bk, threads = tile.bn, tile.bk, tile.threads
    cprw = bn // 8
    rowstep = threads // cprw
    per = bk // rowstep
    assert per * threads * 8 == bn * bk and rowstep % 8 == 0
    dst = {(tid, u): swz_trans(tid // cprw + rowstep * u, tid % cprw, bn) for tid in range(threads) for u in range(per)}
    assert sorted(dst.values()) == list(range(0, bn * bk, 8))  # every chunk of the stage once
    for u in range(per):
        for t0 in range(0, threads, 8):
            assert len({bank_group(dst[(t, u)]) for t in range(t0, t0 + 8)}) == 8
    warp_n = bn // tile.warps_n
    for wn in range(tile.warps_n):
        for kk in range(bk // 16):
            for j2 in range(warp_n // 16):
                for mat in range(4):
                    rows = [16 * kk + lrow + 8 * (mat % 2) for lrow in range(8)]
                    ch = warp_n * wn // 8 + 2 * j2 + mat // 2
                    assert len({bank_group(swz_trans(r, ch, bn)) for r in rows}) == 8


@pytest.mark.parametrize("tile", in_place_tiles(), ids=lambda t: t.name)
def test_in_place_ldmatrix_trans_gives_the_mma_b_fragments(tile):
    """The fragment addresses of igemm_mainloop.cuh's B_KN path (lane l: row l % 8 + 8·((l >> 3)
    & 1) of slice kk, chunk WTN·wn/8 + 2·j2 + l/16), read with ldmatrix.x4.trans (matrix i from the
    rows lanes 8i .. 8i + 7 address; lane l gets elements (2(l%4), l/4) and (2(l%4) + 1, l/4) of
    each, rows first), give each lane the mma.sync m16n8k16 B fragment: b0 = B[k = 2(l%4) + {0, 1}]
    [n = l/4], b1 the same 8 rows of GEMM-K on, for the two 8-column fragments 2·j2 and 2·j2 + 1."""
    bn, bk = tile.bn, tile.bk
    warp_n = bn // tile.warps_n
    stage = {}  # halves offset -> (gemm-k row, gemm-n column) as the loader stores them
    for row in range(bk):
        for ch in range(bn // 8):
            for e in range(8):
                stage[swz_trans(row, ch, bn) + e] = (row, 8 * ch + e)
    for wn in range(tile.warps_n):
        for j2 in range(warp_n // 16):
            base = [swz_trans(lane % 8 + 8 * ((lane >> 3) & 1), warp_n * wn // 8 + 2 * j2 + lane // 16, bn)
                    for lane in range(32)]
            for kk in range(bk // 16):
                addr = [b + 16 * bn * kk for b in base]
                for lane in range(32):
                    got = []  # q[0..3]: two halves each
                    for mat in range(4):
                        rows = addr[8 * mat : 8 * mat + 8]
                        got.append([stage[rows[2 * (lane % 4) + h] + lane // 4] for h in range(2)])
                    for f in range(2):  # fragment 2·j2 + f: b0 = q[2f], b1 = q[2f + 1]
                        n = warp_n * wn + 16 * j2 + 8 * f + lane // 4
                        for half in range(2):
                            k = 16 * kk + 2 * (lane % 4) + 8 * half
                            assert got[2 * f + half] == [(k, n), (k + 1, n)], (wn, j2, kk, lane, f, half)


def test_in_place_offsets_past_32_bits_are_refused():
    """The in-place B offsets are 32-bit ints (R·S·C, r_step·S·C): a w with R·S·C past 2^31 is
    refused before any launch, naming them; one just inside is not refused for that."""
    big = dgrad(N=1, C=2**28, H=2, W=2, K=8, R=3, S=3, padding=1, **NHWC)  # R·S·C = 9·2^28
    reason = d14.DGRAD.supports(big, smem_limit=2**31)
    assert reason is not None and "in-place B offsets" in reason, reason
    inside = replace(big, C=2**27, R=1, S=1, padding=0, name="")  # R·S·C = 2^27
    assert "in-place B offsets" not in (d14.DGRAD.supports(inside, smem_limit=2**31) or "")


def _launch_on_the_cpu(variant, p, a, b):
    """`days.day14_backward.train._launch` as the kernels do it: the op's result in a fresh tensor
    with no graph (torch's float64 convolutions on the CPU, rounded to a's dtype)."""
    conv = {"stride": p.stride, "padding": p.padding, "dilation": p.dilation}
    with torch.no_grad():
        a64, b64 = a.double(), b.double()
        if p.op == "fprop":
            out = torch.nn.functional.conv2d(a64, b64, **conv)
        elif p.op == "dgrad":  # a = dy, b = w
            out = torch.nn.grad.conv2d_input((p.N, p.C, p.H, p.W), b64, a64, **conv)
        else:  # a = x, b = dy
            out = torch.nn.grad.conv2d_weight(a64, (p.K, p.C, p.R, p.S), b64, **conv)
    return out.to(a.dtype)


def test_double_backward_is_refused_not_silently_wrong(monkeypatch):
    """A gradient penalty needs a second derivative through the kernels' backward, whose outputs
    carry no graph: torch's once_differentiable error, not a dL/dx without requires_grad and a
    w.grad missing the penalty's share (0.92 relative difference before the fix). A first
    derivative (plain backward) still works and matches torch's."""
    monkeypatch.setattr(d14.train, "_launch", _launch_on_the_cpu)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 6, 5, generator=gen).to(torch.float16).requires_grad_()
    w = torch.randn(8, 8, 3, 3, generator=gen).to(torch.float16).requires_grad_()
    loss = d14.train.conv2d(x, w, padding=1).float().square().sum()
    (dx,) = torch.autograd.grad(loss, x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        (loss + dx.float().square().sum()).backward()

    x.grad = w.grad = None
    d14.train.conv2d(x, w, padding=1).float().square().sum().backward()
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    torch.nn.functional.conv2d(x64, w64, padding=1).square().sum().backward()
    for got, want in ((x.grad, x64.grad), (w.grad, w64.grad)):
        assert float((got.double() - want).norm() / want.norm()) < 1e-2


def test_kernels_in_order_of_preference_pick_the_first_that_runs():
    """`Kernels.pick`: the first variant that builds for the GPU and supports the layer; the ones
    before it give their reasons; none that runs raises with every reason."""
    from days.day19_wgrad_wgmma import HOPPER_KERNELS

    p = Conv2dProblem(N=2, C=64, H=14, W=14, K=64, R=3, S=3, padding=1, dtype="fp16", layout="NHWC", op="dgrad")
    h100 = 227 * 1024  # an H100's opt-in shared memory per block
    hopper = HOPPER_KERNELS.pick(p, (9, 0), h100)
    assert hopper.variant.name == "dgrad_wgmma" and hopper.refused == ()
    small = HOPPER_KERNELS.pick(p, (9, 0), 48 * 1024)  # 48 KB: day 16's ring does not fit
    assert small.variant.name == "dgrad" and "shared memory" in small.refused[0][1]
    ampere = HOPPER_KERNELS.pick(p, (8, 0), h100)
    assert ampere.variant.name == "dgrad" and [n for n, _ in ampere.refused] == ["dgrad_wgmma"]
    assert "compute capability 9.0" in ampere.refused[0][1] and str(ampere).startswith("dgrad; not dgrad_wgmma: ")
    odd_k = replace(p, K=60, name="")  # dgrad_wgmma reads dy's pixels in 16-byte strides: K % 8 == 0
    fallback = HOPPER_KERNELS.pick(odd_k, (9, 0), h100)
    assert fallback.variant.name == "dgrad" and "K = 60" in fallback.refused[0][1]
    for op, first in (("fprop", "igemm_wgmma"), ("wgrad", "wgrad_wgmma")):
        assert HOPPER_KERNELS.pick(replace(p, op=op, name=""), (9, 0), h100).variant.name == first
    assert d14.train.Kernels().pick(p, (9, 0), h100).variant.name == "dgrad"  # day 14's own by default
    with pytest.raises(ValueError, match="no kernel runs .*dgrad_wgmma: .*compute capability"):
        d14.train.Kernels(dgrad=("dgrad_wgmma",)).pick(p, (8, 6), h100)


def test_kernels_fields_are_checked_and_picks_cached_by_identity():
    """A list becomes a tuple; an empty or non-variant field is a TypeError at construction; a
    variant of another operation is named, not skipped; a Variant object (not hashable: it holds
    dicts) in a field is picked and cached by identity; on CPU tensors the device error comes
    first, whatever the first choice would refuse."""
    from days.day19_wgrad_wgmma import HOPPER_KERNELS
    from helpers.variants import get

    h100 = 227 * 1024
    assert d14.train.Kernels(dgrad=["dgrad_wgmma", "dgrad"]).dgrad == ("dgrad_wgmma", "dgrad")
    for bad in ((), [], None, 3, ("dgrad", 3)):
        with pytest.raises(TypeError, match="Kernels.dgrad"):
            d14.train.Kernels(dgrad=bad)
    p = Conv2dProblem(N=2, C=64, H=14, W=14, K=64, R=3, S=3, padding=1, dtype="fp16", layout="NHWC", op="dgrad")
    with pytest.raises(ValueError, match="Kernels.dgrad names wgrad, which compute"):
        d14.train.Kernels(dgrad=("wgrad", "dgrad")).pick(p, (9, 0), h100)
    with pytest.raises(ValueError, match="Kernels has variants for"):
        d14.train.Kernels().choices("pick")
    k = d14.train.Kernels(dgrad=(get("dgrad_wgmma"), get("dgrad")))
    first = d14.train._pick(k, p, (9, 0), h100)
    assert first.variant.name == "dgrad_wgmma" and d14.train._pick(k, p, (9, 0), h100) is first
    many = [d14.train.Kernels(dgrad="dgrad") for _ in range(d14.train.PICKS_KEPT + 5)]
    for other in many:  # a Kernels per call (a model that makes them on the fly): the picks stay bounded
        d14.train._pick(other, p, (9, 0), h100)
    assert len(d14.train._PICKS) == d14.train.PICKS_KEPT
    assert d14.train._pick(many[-1], p, (9, 0), h100).variant.name == "dgrad"
    x = torch.zeros(2, 12, 14, 14, dtype=torch.float16).to(memory_format=torch.channels_last)  # C = 12: day 16 refuses
    w = torch.zeros(16, 12, 3, 3, dtype=torch.float16).to(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match=r"x is on cpu.*x\.cuda\(\)"):
        d14.train.conv2d(x, w, padding=1, kernels=HOPPER_KERNELS)
