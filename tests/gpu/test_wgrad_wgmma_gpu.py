"""Day 19 on a GPU (sm_90a: an H100 or H200; tests/test_wgrad_wgmma.py is the CPU half): wgrad on the
wgmma/TMA main loop with transposed (MN-major) operands and a deterministic split-K.

* against the float64 reference (`helpers.check.check`: dw poisoned with NaN, the fp32 bound, a
  bitwise repeat) on day 14's wgrad edge problems (helpers.suites.BACKWARD_EDGES: stride
  > filter, odd sizes with stride 2, padding >= R/2, dilations (1, 2) and (2, 1), C and K past the
  tiles, the stem, a strided 1x1, an even filter) and on its own (C and K off every tile, N > 1,
  non-square, several splits); fp16 and bf16, normal and integer inputs (bit-exact, where fp32
  holds every partial sum);
* every tile forced, with several splits, and on one block (every work unit in one block's loop:
  the ring's phases run on across units), integer inputs, exact;
* split factors 1 .. 32 on integer inputs give the same bits; NaN-poisoned workspace and dw change
  nothing; runs repeat bitwise (no atomics: the splits are summed in a fixed order);
* the fp32-dw option: the fp32 sum in the workspace is exact on integer inputs, and dw is it
  rounded once;
* a long reduction (ResNet-50's first 3x3 layer at N = 256: 802,816 pixels) within the bound;
* planted faults the checks catch: the last GEMM-K step dropped (one k-slice of 64 pixels never
  multiplied), a split left out of the reduction;
* tensors the copy engine cannot take (misaligned x, dy, dw) are refused before any launch.

Skipped (tests/conftest.py) without a CUDA device or pycuda; the whole file is skipped on GPUs
other than compute capability 9.0. Run on the GPU machine with
``benchmarks/device_session.sh tests tests/gpu/test_wgrad_wgmma_gpu.py``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from days import day19_wgrad_wgmma as d19
from days.day16_igemm_wgmma import HOPPER_CC
from helpers import gpu
from helpers.check import check
from helpers.launch import prepare, run
from helpers.problem import Conv2dProblem
from helpers.reference import bitwise_equal, compare, reference
from helpers.suites import BACKWARD_EDGES
from helpers.variants import get

pytestmark = pytest.mark.gpu

V = get("wgrad_wgmma")
# Day 14's backward edge problems (helpers.suites.BACKWARD_EDGES, as day 14's tests run them).
DAY14_EDGES = BACKWARD_EDGES
# Day 19's own: C and K off every tile (72, 136, 200, 264), N > 1, non-square images and filters,
# enough pixels for several splits (the rule's, and forced ones below), a 1x1 of many tiles.
OWN = {
    "C = 72, K = 264, 3x3, N = 4": dict(N=4, C=72, H=17, W=13, K=264, R=3, S=3, padding=1),
    "C = 200, K = 40, 3x2, dilation (2, 1)": dict(N=3, C=200, H=15, W=12, K=40, R=3, S=2, padding=(1, 0),
                                                 dilation=(2, 1)),
    "1x1, K = 512, C = 136, N = 8": dict(N=8, C=136, H=14, W=14, K=512, R=1, S=1),
    "5x5 stride (2, 3), padding (2, 1)": dict(N=6, C=32, H=23, W=29, K=48, R=5, S=5, stride=(2, 3), padding=(2, 1)),
    "3x3, 56 x 56, N = 8 (many splits)": dict(N=8, C=64, H=56, W=56, K=64, R=3, S=3, padding=1),
}
CASES = {**DAY14_EDGES, **OWN}
MULTI = dict(N=4, C=136, H=20, W=18, K=200, R=3, S=3, padding=1)  # 1440 pixels: 23 steps, 2 x 1 tiles of 128 x 256


@pytest.fixture(scope="module", autouse=True)
def context():
    ctx = gpu.init()
    cc = gpu.device_info().cc
    if cc != HOPPER_CC:
        pytest.skip(f"wgmma and the im2col copies need sm_90a (compute capability 9.0); this GPU is {cc}")
    return ctx


def problem(spec: dict, dtype: str = "fp16") -> Conv2dProblem:
    return Conv2dProblem(**spec, dtype=dtype, layout="NHWC", op="wgrad")


def within_bound(p: Conv2dProblem, x, dy, out) -> bool:
    d = compare(p, x, dy, out)
    return d["nonfinite"] == 0 and d["worst_err_over_bound"] <= 1


def test_every_day_14_edge_is_claimed():
    for name, spec in DAY14_EDGES.items():
        assert V.supports(problem(spec)) is None, (name, V.supports(problem(spec)))


@pytest.mark.parametrize("kind", ["normal", "int"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_wgrad_against_the_reference(name: str, dtype: str, kind: str):
    p = problem(CASES[name], dtype)
    assert V.supports(p) is None, V.supports(p)
    r = check(V, p, kind=kind)
    assert r.ok and r.repeat_bitwise and r.nonfinite == 0, f"{name} ({dtype}, {kind}, {V.plan(p).config}): {r.reason}"
    if kind == "int":
        assert r.exact, f"{name} ({dtype}): integer inputs but not bit-exact"


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("variant", V.configs_fn(), ids=lambda v: v.name)
def test_every_tile_forced_and_on_one_block(variant, dtype: str):
    """Each tile with the rule's splits, and with 3 splits on a grid of one block (that block's loop
    runs every work unit, 2 x 2 x 9 x 3 of them for 128-wide tiles, the ring's phases running on
    across units): integer inputs, exact, the same bits twice."""
    p = problem(MULTI, dtype)
    assert variant.supports(p) is None, variant.supports(p)
    cfg = variant.plan(p).config
    if variant.name.endswith("_grid1"):
        assert cfg.blocks == 1 and d19.tile_count(p, cfg.tile) * cfg.splits > 1
    r = check(variant, p, kind="int")
    assert r.ok and r.exact and r.repeat_bitwise, f"{variant.name} ({cfg}): {r.reason}"


def test_split_factors_give_the_same_bits_on_integer_inputs():
    """Splits 1 (the main kernel writes dw), 2, 3, 7, 23 (one step each) and a grid of 5 blocks: every
    partial sum is an integer fp32 holds, so every split order gives the exact dw."""
    p = problem(MULTI)
    x, dy = p.make_inputs(device="cuda", kind="int", seed=5)
    want = reference(p, x, dy).permute(0, 2, 3, 1).to(p.torch_dtype).contiguous()
    for splits in (1, 2, 3, 7, 23):
        for sms in (132, 5):
            v = d19.make_wgrad_wgmma(f"w_k{splits}_s{sms}", splits=splits, sms=sms)
            out = run(v, p, x, dy)
            assert bitwise_equal(out, want), (splits, sms)


def test_nan_poisoned_workspace_and_dw_change_nothing_and_runs_repeat_bitwise():
    p = problem(OWN["3x3, 56 x 56, N = 8 (many splits)"])
    v = d19.make_wgrad_wgmma("w_k8", splits=8)
    x, dy = p.make_inputs(device="cuda", seed=2)
    clean = run(v, p, x, dy).clone()
    prepared, out = prepare(v, p, x, dy)
    assert prepared.workspace is not None
    for _ in range(3):
        prepared.workspace.fill_(255)  # 0xFFFFFFFF: NaN as fp32 partials
        out.fill_(float("nan"))
        prepared()
        torch.cuda.synchronize()
        assert bitwise_equal(out, clean), "a NaN-poisoned workspace or dw changed the result"
    assert within_bound(p, x, dy, clean)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("splits", [1, 4])
def test_the_fp32_dw_option(splits: int, dtype: str):
    """dw32 (the fp32 sum, in the workspace) is exact on integer inputs and within the fp32 bound on
    normal ones; dw is dw32 rounded once, bit for bit."""
    p = problem(MULTI, dtype)
    v = d19.make_wgrad_wgmma(f"w_dw32_k{splits}", splits=splits, dw32=True)
    cfg = v.plan(p).config
    assert cfg.dw32 and [k.name for k in v.launches(p)] == ["main", "reduce"]
    for kind in ("int", "normal"):
        x, dy = p.make_inputs(device="cuda", kind=kind, seed=3)
        prepared, out = prepare(v, p, x, dy)
        prepared.workspace.fill_(255)
        out.fill_(float("nan"))
        prepared()
        torch.cuda.synchronize()
        dw32 = d19.dw32_view(p, cfg, prepared.workspace)
        ref = reference(p, x, dy).permute(0, 2, 3, 1)
        assert torch.isfinite(dw32).all()
        assert bitwise_equal(out, dw32.to(p.torch_dtype))
        if kind == "int":
            assert torch.equal(dw32.double(), ref)
        else:
            scale = reference(p, x.abs(), dy.abs()).permute(0, 2, 3, 1)
            n = p.reduction_length
            gamma = n * 2**-24 / (1 - n * 2**-24)
            assert ((dw32.double() - ref).abs() <= gamma * scale + 1e-30).all()


def test_a_long_reduction_at_n256_within_the_bound():
    """GEMM-K = 256 * 56 * 56 = 802,816 pixels (ResNet-50's first 3x3 layer at N = 256): the rule's
    split and a forced 1 and 64, inside the fp32 bound."""
    p = problem(dict(N=256, C=64, H=56, W=56, K=64, R=3, S=3, padding=1))
    x, dy = p.make_inputs(device="cuda", seed=1)
    for v in (V, d19.make_wgrad_wgmma("w1", splits=1), d19.make_wgrad_wgmma("w64", splits=64)):
        out = run(v, p, x, dy)
        d = compare(p, x, dy, out)
        assert d["nonfinite"] == 0 and d["worst_err_over_bound"] <= 1, f"{v.name}: {d}"


def with_args(v, launch: str, change):
    """``v`` with launch ``launch``'s arguments changed by ``change(args) -> args`` (a planted fault)."""
    return dataclasses.replace(v, name=f"{v.name}_fault_{launch}", launches_fn=lambda q, ep, cfg: [
        dataclasses.replace(k, args=change(k.args)) if k.name == launch else k for k in v.launches_fn(q, ep, cfg)])


def test_a_dropped_k_slice_is_caught():
    """The planted fault: the main kernel is told one GEMM-K step fewer (steps - 1): the last 64
    pixels (four k16 slices) are never multiplied; the check must fail."""
    p = problem(MULTI)
    v = d19.make_wgrad_wgmma("w1", splits=1)
    steps_at = 4 + 12  # dy map, x map, dw, ws, then K C P Q sh sw ph pw dh dw S taps, steps
    short = with_args(v, "main", lambda a: a[:steps_at] + (np.int32(int(a[steps_at]) - 1),) + a[steps_at + 1:])
    x, dy = p.make_inputs(device="cuda", seed=4)
    assert int(v.launches(p)[0].args[steps_at]) == d19.steps_of(p)
    assert within_bound(p, x, dy, run(v, p, x, dy))
    assert not within_bound(p, x, dy, run(short, p, x, dy))


def test_a_split_left_out_of_the_reduction_is_caught():
    p = problem(MULTI)
    v = d19.make_wgrad_wgmma("w4", splits=4)
    short = with_args(v, "reduce", lambda a: a[:-1] + (np.int32(3),))
    x, dy = p.make_inputs(device="cuda", seed=4)
    assert within_bound(p, x, dy, run(v, p, x, dy))
    assert not within_bound(p, x, dy, run(short, p, x, dy))


def test_tensors_the_copy_engine_cannot_take_are_refused_before_a_launch(misaligned):
    p = problem(OWN["C = 72, K = 264, 3x3, N = 4"])
    x, dy = p.make_inputs(device="cuda")
    with pytest.raises(ValueError, match=r"x\.data_ptr\(\) is not 16-byte aligned"):
        run(V, p, misaligned(x), dy)
    with pytest.raises(ValueError, match=r"dy\.data_ptr\(\) is not 16-byte aligned"):
        run(V, p, x, misaligned(dy))
    with pytest.raises(ValueError, match=r"dw\.data_ptr\(\) is not 16-byte aligned"):
        run(V, p, x, dy, out=misaligned(torch.empty(p.w_shape, dtype=p.torch_dtype, device="cuda")))
    r = check(V, p)
    assert r.ok, r.reason


def test_a_training_step_on_hoppers_kernels_agrees_with_torch():
    """Day 14's model and batch on `HOPPER_KERNELS`: every layer's fprop, dgrad and wgrad ran on
    days 16, 18 and 19 (`train.paths` says which ran, and why a preferred one did not), and four
    SGD steps follow torch's losses and first gradients within day 14's tolerance."""
    from days.day14_backward import train

    torch.manual_seed(0)
    x = torch.randn(8, 16, 28, 28, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (8,), device="cuda")
    ours, ref = train.make_pair(16, 64, 32, 2, kernels=d19.HOPPER_KERNELS)
    a, b = train.train_steps(ours, x, labels, 4), train.train_steps(ref, x, labels, 4)
    ran = {(op, pick.variant.name) for (op, _), pick in train.paths().items()}
    assert {("fprop", "igemm_wgmma"), ("dgrad", "dgrad_wgmma"), ("wgrad", "wgrad_wgmma")} <= ran, ran
    for la, lb in zip(a["loss"], b["loss"]):
        assert abs(la - lb) <= 1e-2 * abs(lb), (a["loss"], b["loss"])
    assert a["loss"][-1] < a["loss"][0]
    for name, g in a["grads"].items():
        rel = float((g.double() - b["grads"][name].double()).norm() / b["grads"][name].double().norm())
        assert rel <= 1e-2, (name, rel)
