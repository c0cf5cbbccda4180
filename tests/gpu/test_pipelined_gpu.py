"""Day 12's lean cp.async-pipelined kernel on a GPU (sm_80+; tests/test_pipelined.py is the CPU half).

Like day 11's tests/gpu/test_mma_gpu.py: the NHWC edge suite in fp16 and bf16, as it is where
C % 8 == 0 and with C rounded up to 8 (`edge_c8`), plus ResNet-50-shaped layers at N = 2, each
with normal, integer (bit-exact) and cancelling inputs; bit-for-bit agreement with torch on
integer inputs; the misaligned-pointer refusal. Then what is new on day 12: rings of 2, 4 and 5
stages (4 and 5 opt into more than 48 KB of dynamic shared memory), problems with fewer GEMM-K
steps than the prologue loads, masked-off copies whose unclamped sources lie far outside x, and
two planted faults (``-DPLANT_FAULT=1``: no ``cp.async.wait_group``; ``=2``: no barrier per step)
that the check must catch. The
far-outside copies are tested for day 13's ``igemm_production`` here too (it keeps day 12's iterator).

Every `check` poisons the output with NaN, compares with the float64 reference within the
fp32-accumulation bound and repeats the launch to compare bitwise. Skipped (tests/conftest.py)
without a CUDA device or pycuda; the whole file is skipped on GPUs older than sm_80.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from days.day12_igemm_pipelined import edge_c8, make_pipelined
from days.day13_igemm_production import choose
from helpers import gpu
from helpers.check import check
from helpers.launch import prepare, run
from helpers.problem import Conv2dProblem
from helpers.suites import is_big, suite
from helpers.variants import get

pytestmark = pytest.mark.gpu

V = get("igemm_pipelined")
DTYPES = ("fp16", "bf16")
RESNET_LIKE = [
    Conv2dProblem(N=2, C=64, H=56, W=56, K=64, R=3, S=3, padding=1),
    Conv2dProblem(N=2, C=256, H=28, W=28, K=128, R=1, S=1, stride=2),
    Conv2dProblem(N=2, C=40, H=14, W=14, K=72, R=3, S=3, padding=1),  # C % 32 != 0, K not a tile multiple
]


def nhwc(dtype: str = "fp16", **kw) -> Conv2dProblem:
    return Conv2dProblem(layout="NHWC", dtype=dtype, **kw)


@pytest.fixture(scope="module", autouse=True)
def context():
    ctx = gpu.init()
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("cp.async, mma.sync m16n8k16 with bf16 and ldmatrix need sm_80+")
    return ctx


def _assert_ok(r, p: Conv2dProblem, kind: str) -> None:
    """`check`'s verdict covers NaN/Inf outputs, a second run that differs and inexact integer runs."""
    assert r.ok and (r.exact is not None or kind != "int"), f"{r.variant} on {p.dtype} {p.name} ({kind}): {r}"


def _cases():
    for dt in DTYPES:
        as_is = [q for q in suite("edge", dtype=dt, layout="NHWC") if q.C % 8 == 0]
        extra = [replace(q, layout="NHWC", dtype=dt, name="") for q in RESNET_LIKE]
        for p in as_is + edge_c8(dt) + extra:
            if is_big(p) or V.supports(p) is not None:
                continue
            for kind in ("normal", "int", "cancel"):  # C % 8 == 0: C is even, cancel applies
                yield pytest.param(p, kind, id=f"{dt}-{p.name}-{kind}")


@pytest.mark.parametrize("p, kind", list(_cases()))
def test_check_passes(p, kind):
    _assert_ok(check(V, p, kind=kind), p, kind)


@pytest.mark.big
def test_past_2_31_elements():
    """64-bit offsets: x of 16400 x 16400 x 8 = 2.15e9 elements (the edge suite's own 2^31-element
    problem has C = 1, and with C rounded up to 8 it would need ~140 GB to check)."""
    p = nhwc(N=1, C=8, H=16400, W=16400, K=1, R=3, S=3, padding=1)
    assert is_big(p) and V.supports(p) is None
    _assert_ok(check(V, p, kind="normal"), p, "normal")


def test_int_inputs_match_torch_bit_for_bit():
    """Small-integer fp16 inputs: fp32 accumulation is exact, so ours equals cuDNN's output."""
    p = nhwc(N=2, C=64, H=20, W=20, K=96, R=3, S=3, padding=1)
    x, w = p.make_inputs(device="cuda", kind="int")
    y = run(V, p, x, w)
    ref = torch.nn.functional.conv2d(p.to_nchw(x), p.w_to_kcrs(w), **p.torch_kwargs())
    assert torch.equal(p.to_nchw(y), ref)


def test_misaligned_x_refused():
    p = nhwc(N=1, C=64, H=8, W=8, K=64, R=1, S=1)
    x, w = p.make_inputs(device="cuda")
    xs = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")[1:].view(x.shape)
    xs.copy_(x)
    y = torch.full(p.y_shape, 7.0, dtype=p.torch_dtype, device="cuda")
    with pytest.raises(ValueError, match=r"x\.data_ptr"):
        run(V, p, xs, w, out=y)
    torch.cuda.synchronize()
    assert bool((y == 7.0).all()), "y was touched before the refusal"


# ---- the ring -------------------------------------------------------------------------------------

RING_PROBLEMS = [
    nhwc(N=2, C=64, H=15, W=13, K=70, R=3, S=3, padding=1),  # 18 steps
    nhwc(N=2, C=8, H=9, W=7, K=24, R=1, S=1),  # 1 step: fewer than the prologue loads (empty groups)
    nhwc(N=1, C=16, H=6, W=6, K=8, R=1, S=2),  # 2 steps
    nhwc(N=3, C=40, H=9, W=11, K=34, R=2, S=3, padding=(1, 0), stride=2, dilation=(1, 2)),  # partial channel steps
    nhwc(N=1, C=24, H=10, W=9, K=16, R=4, S=5, padding=(6, 7), dilation=(3, 1)),  # rows with no tap inside
    nhwc(N=1, C=16, H=18, W=9, K=24, R=16, S=2, padding=(0, 1)),  # R = 16: the masks' last row bit
]


@pytest.mark.parametrize("stages", [2, 3, 4, 5])
@pytest.mark.parametrize("p", RING_PROBLEMS, ids=lambda p: p.name)
@pytest.mark.parametrize("dt", DTYPES)
def test_ring_depths(stages, p, dt):
    v = V if stages == 3 else make_pipelined(stages)
    q = replace(p, dtype=dt, name="")
    for kind in ("normal", "int"):
        _assert_ok(check(v, q, kind=kind), q, kind)


@pytest.mark.parametrize("sh, ph", [(2**20, 2**29), (2**18, 2**29 + 2**27)])
@pytest.mark.parametrize("name", ["igemm_pipelined", "igemm_production"])  # day 13 keeps day 12's copies
def test_masked_off_copies_far_outside_x_read_nothing(name, sh, ph):
    """With padding 2^29 the masked-off rows' cp.async sources lie about 2^50 bytes before x, outside
    any allocation; the kernels pass them unclamped with src-size 0, which must read nothing. Only
    output row ph / sh sees the image (H = 1): a 1 x 1 conv; every other row is 0."""
    p = nhwc(N=1, C=64, H=1, W=16384, K=8, R=1, S=1, stride=(sh, 1), padding=(ph, 0))
    assert name != "igemm_production" or choose(p).iterator == "optimized"
    x, w = p.make_inputs(device="cuda")
    plan, y = prepare(name, p, x, w)
    y.fill_(float("nan"))
    plan()
    torch.cuda.synchronize()
    ref = (x.float().reshape(-1, p.C) @ w.float().reshape(p.K, p.C).T).reshape(p.W, p.K)
    got, row = y.float()[0], ph // sh
    assert (got[row] - ref).abs().max().item() < 1e-2
    others = torch.ones(p.P, dtype=torch.bool, device=y.device)
    others[row] = False
    assert bool((got[others] == 0).all())


# Planted faults on problems big enough to keep copies in flight from DRAM. Without the wait the
# race hides while the inputs sit in L2: on the H200 (2026-12-02) a check of N2 C64 15x13 K70 with
# PLANT_FAULT=1 passed bit-exactly, while the same launch after an L2 flush got 180-613 of 27,300
# outputs wrong. These two problems (12.8 and 25.7 MB of x) failed every check there, both plants.
PLANT_PROBLEMS = [
    nhwc(N=32, C=64, H=56, W=56, K=64, R=1, S=1),
    nhwc(N=8, C=256, H=56, W=56, K=256, R=3, S=3, padding=1),
]


@pytest.mark.parametrize("p", PLANT_PROBLEMS, ids=lambda p: p.name)
@pytest.mark.parametrize("plant, what", [(1, "no wait_group"), (2, "no __syncthreads")])
def test_planted_fault_is_caught(plant, what, p):
    """Without cp.async.wait_group (1) or without the step's barrier (2) a step reads its stage
    before every copy has landed: the check must fail (a harness that passed these would not be
    testing the pipeline)."""
    faulty = replace(V, name=f"igemm_pipelined[{what}]", defines={**V.defines, "PLANT_FAULT": plant})
    _assert_ok(check(V, p, kind="int"), p, "int")  # the same problem passes without the fault
    r = check(faulty, p, kind="int")
    assert not r.ok, f"the planted fault went unnoticed: {r}"
