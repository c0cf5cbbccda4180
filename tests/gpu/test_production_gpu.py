"""Day 13's production kernel on a GPU (sm_80+; tests/test_production.py is the CPU half).

* every instantiated (tile description, iterator) pair, forced, on NHWC problems that divide no
  tile, in fp16 and bf16 (normal inputs, and integer inputs that must be bit-exact);
* the automatic ``igemm_production`` on the NHWC edge suite (normal, int, cancel);
* every swizzle 0..3 on K = 300 with a 64-wide tile (some blocks have no filter tile): correct,
  and bitwise the same output whatever the swizzle;
* the fused epilogue through `helpers.launch.prepare` and `helpers.check.check_epilogue`;
* refusals before any launch, and bit-for-bit agreement with torch on integer inputs.

Masked-off cp.async copies whose sources lie far outside x (day 12's iterator, kept here) are
tested for both kernels in tests/gpu/test_pipelined_gpu.py.

Every `check` poisons the output with NaN, compares with the float64 reference within the
fp32-accumulation bound and repeats the launch to compare bitwise. Skipped (tests/conftest.py)
without a CUDA device or pycuda; the whole file is skipped on GPUs older than sm_80.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_check_ok

from days.day13_igemm_production import INSTANTIATED, choose, make_production
from days.kit import TENSOR_CORE_CC as MIN_CC
from helpers import gpu
from helpers.check import check, check_epilogue
from helpers.epilogue import Epilogue
from helpers.launch import prepare, run
from helpers.problem import Conv2dProblem
from helpers.reference import bitwise_equal
from helpers.suites import is_big, suite
from helpers.variants import UnsupportedProblem, get

pytestmark = pytest.mark.gpu

V = get("igemm_production")
DTYPES = ("fp16", "bf16")


def nhwc(dtype: str = "fp16", **kw) -> Conv2dProblem:
    return Conv2dProblem(layout="NHWC", dtype=dtype, **kw)


def smem_limit() -> int:
    return gpu.device_info().smem_per_block_optin


@pytest.fixture(scope="module", autouse=True)
def context():
    ctx = gpu.init()
    cc = gpu.device_info().cc
    if cc < MIN_CC:
        pytest.skip(f"cp.async, ldmatrix and bf16 mma.sync need sm_80+; this GPU is sm_{cc[0]}{cc[1]}")
    return ctx


def kinds_for(p: Conv2dProblem, cancel: bool = True) -> list[str]:
    """normal and int always; cancel (exact result 0) when C is even."""
    return ["normal", "int"] + (["cancel"] if cancel and p.C % 2 == 0 else [])


# ---- every (tile, iterator) pair ------------------------------------------------------------

PROBLEMS = [
    nhwc(N=2, C=64, H=15, W=13, K=70, R=3, S=3, padding=1),  # M = 390, K = 70
    nhwc(N=3, C=40, H=9, W=11, K=34, R=2, S=3, padding=(1, 0), stride=2, dilation=(1, 2)),  # C % 32 != 0
    nhwc(N=2, C=256, H=14, W=14, K=256, R=1, S=1),  # 1x1, 16-byte stores, many steps
    nhwc(N=2, C=3, H=32, W=28, K=64, R=7, S=7, padding=3, stride=2),  # a stem: few_channels / analytic
    nhwc(N=2, C=1, H=17, W=19, K=24, R=3, S=3, padding=1),
    nhwc(N=1, C=5, H=12, W=10, K=40, R=5, S=5, padding=2, stride=(1, 2)),
    nhwc(N=1, C=45, H=11, W=13, K=33, R=3, S=3, padding=1),  # analytic only
    nhwc(N=2, C=8, H=9, W=7, K=24, R=1, S=1),  # one GEMM-K step: the ring never fills, no step to prefetch
    nhwc(N=2, C=16, H=13, W=12, K=40, R=3, S=3, stride=2),  # no padding: every tap mask full
    nhwc(N=1, C=24, H=10, W=9, K=16, R=4, S=5, padding=(6, 7), dilation=(3, 1)),  # rows with no tap inside
    nhwc(N=1, C=16, H=18, W=9, K=24, R=16, S=2, padding=(0, 1)),  # R = 16: the masks' last row bit; ph = 0, pw = 1
]
PAIRS = [(t, it) for t, its in INSTANTIATED.items() for it in its]
FORCED = {(t, it): make_production(name=f"igemm_production[{t},{it}]", tile=t, iterator=it) for t, it in PAIRS}


def _pair_cases():
    for (t, it), v in FORCED.items():
        for p in PROBLEMS:
            for dt in DTYPES:
                q = replace(p, dtype=dt, name="")
                if v.supports(q, smem_limit=2**31) is not None:  # the iterator does not take this C
                    continue
                for kind in kinds_for(q, cancel=False):
                    yield pytest.param(t, it, q, kind, id=f"{t}-{it}-{dt}-{q.name}-{kind}")


PAIR_CASES = list(_pair_cases())


def test_every_pair_has_cases():
    covered = {(c.values[0], c.values[1]) for c in PAIR_CASES}
    assert covered == set(PAIRS)


@pytest.mark.parametrize("tile, iterator, p, kind", PAIR_CASES)
def test_every_tile_and_iterator(tile, iterator, p, kind):
    v = FORCED[(tile, iterator)]
    reason = v.supports(p, smem_limit=smem_limit())
    if reason:
        pytest.skip(reason)
    assert v.entry_for(p) == f"igemm_production_{tile}_{iterator}_{p.dtype}"
    assert_check_ok(check(v, p, kind=kind), p, kind)


# ---- the automatic variant on the edge suite ------------------------------------------------


def _edge_cases():
    for dt in DTYPES:
        for p in suite("edge", dtype=dt, layout="NHWC"):
            if is_big(p) or V.supports(p, smem_limit=2**31) is not None:
                continue
            for kind in kinds_for(p):
                yield pytest.param(p, kind, id=f"{dt}-{p.name}-{kind}")


@pytest.mark.parametrize("p, kind", list(_edge_cases()))
def test_edge_suite(p, kind):
    reason = V.supports(p, smem_limit=smem_limit())
    if reason:
        pytest.skip(reason)
    assert_check_ok(check(V, p, kind=kind), p, kind)


# ---- swizzle --------------------------------------------------------------------------------

SWIZZLE_PROBLEMS = [
    nhwc(N=2, C=64, H=10, W=9, K=300, R=3, S=3, padding=1),  # optimized; 5 filter tiles of 64
    nhwc(N=1, C=12, H=13, W=7, K=300, R=3, S=3, padding=1),  # analytic
]


@pytest.mark.parametrize("swizzle", [0, 1, 2, 3])
@pytest.mark.parametrize("p", SWIZZLE_PROBLEMS, ids=lambda p: p.name)
@pytest.mark.parametrize("kind", ["normal", "int"])
def test_swizzle(p, swizzle, kind):
    v = make_production(name=f"igemm_production[swizzle={swizzle}]", tile="64x64x32_w2x2_s4", swizzle=swizzle)
    assert v.launch(p).grid[1] == -(-5 // 2**swizzle)
    assert_check_ok(check(v, p, kind=kind), p, kind)


@pytest.mark.parametrize("p", SWIZZLE_PROBLEMS, ids=lambda p: p.name)
def test_swizzle_changes_only_the_block_order(p):
    x, w = p.make_inputs(device="cuda", seed=4)
    outs = [run(make_production(name=f"sw{s}", tile="64x64x32_w2x2_s4", swizzle=s), p, x, w).clone() for s in range(4)]
    for s in range(1, 4):
        assert bitwise_equal(outs[0], outs[s]), f"swizzle {s} differs from swizzle 0"


# ---- fused epilogue -------------------------------------------------------------------------


P_OPT = nhwc(N=2, C=64, H=15, W=13, K=72, R=3, S=3, padding=1)  # optimized, K % 8 == 0: 16-byte stores
P_ODD = nhwc(N=2, C=32, H=9, W=11, K=33, R=3, S=3, padding=1)  # K odd: element stores, partial pairs
P_ANA = nhwc(N=1, C=45, H=11, W=13, K=40, R=3, S=3, padding=1)  # analytic
P_FEW = nhwc(N=2, C=3, H=32, W=28, K=64, R=7, S=7, padding=3, stride=2)  # few_channels

EPILOGUE_CASES = [
    ("bias-only", P_OPT, Epilogue(), {"with_cin": False}),
    ("scale-relu", P_OPT, Epilogue(alpha=0.5, beta=2.0, relu=True), {}),
    ("cin-no-bias", P_OPT, Epilogue(alpha=1.0, beta=-0.75), {"with_bias": False}),
    ("in-place-residual", P_OPT, Epilogue(alpha=1.0, beta=1.0), {"in_place": True}),
    ("in-place-residual-relu", P_OPT, Epilogue(alpha=1.0, beta=1.0, relu=True), {"in_place": True}),
    ("int-relu", P_OPT, Epilogue(alpha=2.0, beta=-1.0, relu=True), {"kind": "int"}),
    ("bf16", replace(P_OPT, dtype="bf16", name=""), Epilogue(alpha=1.0, beta=1.0, relu=True), {}),
    ("bf16-int-in-place", replace(P_ODD, dtype="bf16", name=""), Epilogue(alpha=1.0, beta=1.0),
     {"kind": "int", "in_place": True}),
    ("odd-K", P_ODD, Epilogue(alpha=0.5, beta=2.0, relu=True), {}),
    ("odd-K-int-in-place", P_ODD, Epilogue(alpha=2.0, beta=-1.0, relu=True), {"kind": "int", "in_place": True}),
    ("analytic", P_ANA, Epilogue(alpha=1.5, beta=-0.5, relu=True), {}),
    ("analytic-int", P_ANA, Epilogue(alpha=2.0, beta=-1.0), {"kind": "int"}),
    ("few-channels", P_FEW, Epilogue(alpha=1.0, beta=1.0, relu=True), {}),
    ("alpha-0", P_OPT, Epilogue(alpha=0.0, beta=1.0), {"kind": "int"}),
]


@pytest.mark.parametrize("p, ep, kw", [pytest.param(p, ep, kw, id=n) for n, p, ep, kw in EPILOGUE_CASES])
def test_epilogue(p, ep, kw):
    r = check_epilogue(V, p, ep, **kw)
    assert r.variant == V.name
    assert_check_ok(r, p, kw.get("kind", "normal"))


def test_int_inputs_with_non_integer_alpha_beta_are_judged_by_the_bound():
    """kind="int" with alpha 0.3, beta 0.7: the products are not exact, so no bit-exactness is
    asked (a correct kernel used to fail on 43 of 32,768 outputs)."""
    r = check_epilogue(V, P_OPT, Epilogue(alpha=0.3, beta=0.7), kind="int")
    assert r.ok and r.exact is None, r


@pytest.mark.parametrize("tile, iterator", PAIRS, ids=[f"{t}-{it}" for t, it in PAIRS])
def test_epilogue_every_tile(tile, iterator):
    """Bias and Cin columns follow every warp layout: integer inputs, alpha 2, beta -1, ReLU, exact."""
    v = FORCED[(tile, iterator)]
    p = {"optimized": P_OPT, "analytic": P_ANA, "few_channels": P_FEW}[iterator]
    reason = v.supports(p, smem_limit=smem_limit())
    if reason:
        pytest.skip(reason)

    r = check_epilogue(v, p, Epilogue(alpha=2.0, beta=-1.0, relu=True), kind="int")
    assert_check_ok(r, p, "int")


@pytest.mark.parametrize("p", [P_OPT, P_ODD, P_ANA, P_FEW], ids=lambda p: p.name)
def test_default_epilogue_is_the_plain_convolution(p):
    """prepare with an explicit Epilogue() and None operands writes the same bits as `run`."""
    x, w = p.make_inputs(device="cuda", seed=6)
    y_plain = run(V, p, x, w).clone()
    launch, y = prepare(V, p, x, w, cin=None, bias=None, epilogue=Epilogue())
    y.fill_(float("nan"))
    launch()
    torch.cuda.synchronize()
    assert bitwise_equal(y, y_plain)


# ---- refusals before launch -----------------------------------------------------------------


def test_misaligned_x_refused_for_the_optimized_iterator(misaligned):
    p = nhwc(N=1, C=64, H=8, W=8, K=64, R=1, S=1)
    x, w = p.make_inputs(device="cuda")
    y = torch.full(p.y_shape, 7.0, dtype=p.torch_dtype, device="cuda")
    with pytest.raises(ValueError, match=r"x\.data_ptr"):
        run(V, p, misaligned(x), w, out=y)
    with pytest.raises(ValueError, match=r"x\.data_ptr"):
        prepare(V, p, misaligned(x), w, out=y, epilogue=Epilogue(relu=True))
    torch.cuda.synchronize()
    assert bool((y == 7.0).all()), "y was touched before the refusal"


def test_bad_epilogue_operands_refused(misaligned):
    p = nhwc(N=2, C=16, H=8, W=8, K=24, R=3, S=3, padding=1)
    x, w = p.make_inputs(device="cuda")
    y = torch.full(p.y_shape, 7.0, dtype=p.torch_dtype, device="cuda")
    cin = torch.zeros(p.y_shape, dtype=p.torch_dtype, device="cuda")
    bias = torch.zeros(p.K, dtype=p.torch_dtype, device="cuda")
    wrong_shape = torch.zeros(p.N, p.K, p.P, p.Q, dtype=p.torch_dtype, device="cuda")  # NCHW
    with pytest.raises(ValueError, match="cin must be a contiguous"):
        prepare(V, p, x, w, cin=wrong_shape, bias=bias, epilogue=Epilogue(beta=1.0), out=y)
    with pytest.raises(ValueError, match="cin must be a contiguous"):
        prepare(V, p, x, w, cin=cin.cpu(), bias=bias, epilogue=Epilogue(beta=1.0), out=y)
    with pytest.raises(ValueError, match="bias must be a contiguous"):
        prepare(V, p, x, w, cin=cin, bias=bias[:-1], epilogue=Epilogue(beta=1.0), out=y)
    with pytest.raises(ValueError, match="needs cin"):
        prepare(V, p, x, w, cin=None, bias=bias, epilogue=Epilogue(beta=1.0), out=y)
    with pytest.raises(ValueError, match=r"cin\.data_ptr"):  # K % 8 == 0: Cin is read 16 bytes at a time
        prepare(V, p, x, w, cin=misaligned(cin), bias=bias, epilogue=Epilogue(beta=1.0), out=y)
    torch.cuda.synchronize()
    assert bool((y == 7.0).all()), "y was touched before the refusal"


@pytest.mark.parametrize("dt", DTYPES)
def test_filters_past_16_taps_run_on_the_analytic_iterator(dt):
    """The optimized iterator's tap masks hold 16 filter rows and columns; R = 17 goes to analytic."""
    p = nhwc(N=2, C=16, H=21, W=11, K=24, R=17, S=3, padding=(8, 1), dtype=dt)
    assert choose(p).iterator == "analytic"
    for kind in kinds_for(p):
        assert_check_ok(check(V, p, kind=kind), p, kind)


def test_forced_few_channels_refuses_c64():
    p = nhwc(N=1, C=64, H=8, W=8, K=64, R=3, S=3, padding=1)
    x, w = p.make_inputs(device="cuda")
    v = make_production(name="few_channels_64x64", tile="64x64x32_w2x2_s4", iterator="few_channels")
    with pytest.raises(UnsupportedProblem, match="few_channels iterator is for C <= 8"):
        run(v, p, x, w)


# ---- bit for bit with torch -----------------------------------------------------------------


@pytest.mark.parametrize(
    "p",
    [
        nhwc(N=2, C=64, H=20, W=20, K=96, R=3, S=3, padding=1),
        nhwc(N=2, C=256, H=14, W=14, K=128, R=1, S=1, stride=2),
    ],
    ids=lambda p: p.name,
)
def test_int_inputs_match_torch_bit_for_bit(p):
    """Small-integer fp16 inputs: fp32 accumulation is exact, so ours equals cuDNN's output."""
    x, w = p.make_inputs(device="cuda", kind="int")
    y = run("igemm_production", p, x, w)
    ref = F.conv2d(p.to_nchw(x), p.w_to_kcrs(w), **p.torch_kwargs())
    assert torch.equal(p.to_nchw(y), ref)


def test_beta_zero_never_reads_cin():
    """beta = 0: the kernel must not read Cin (a NaN there would otherwise reach y)."""
    p = nhwc(N=2, C=64, H=15, W=13, K=72, R=3, S=3, padding=1)
    x, w = p.make_inputs(device="cuda", kind="int")
    cin = torch.full(p.y_shape, float("nan"), dtype=p.torch_dtype, device="cuda")
    launch, y = prepare(V, p, x, w, cin=cin, bias=None, epilogue=Epilogue(alpha=1.0, beta=0.0))
    y.fill_(float("nan"))
    launch()
    torch.cuda.synchronize()
    assert bitwise_equal(y, run(V, p, x, w))
