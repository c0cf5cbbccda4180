"""Day 06's 1x1 GEMM tile (``conv2d_blocked_1x1_m{64,128}``) with both tile heights, on shapes
that divide no tile: HW and K not multiples of 128, HW % 4 != 0 (scalar stores) and == 0 (float4
stores), C not a multiple of the 8-channel step, N > 1. The registered variant picks BM from the
problem's size, so most of these would only ever see BM = 64 without forcing it.
"""

from __future__ import annotations

import pytest

from days.day06_blocked import make_blocked, uses_gemm_tile
from helpers import gpu
from helpers.check import check
from helpers.problem import Conv2dProblem

pytestmark = pytest.mark.gpu

PROBLEMS = [
    Conv2dProblem(N=3, C=45, H=13, W=11, K=70, R=1, S=1, padding="same"),  # HW = 143: scalar stores
    Conv2dProblem(N=2, C=9, H=16, W=12, K=130, R=1, S=1, padding="same"),  # HW = 192: float4 stores
    Conv2dProblem(N=1, C=1, H=5, W=7, K=32, R=1, S=1, padding="same"),  # one channel, K = 32
    Conv2dProblem(N=2, C=64, H=20, W=20, K=256, R=1, S=1, padding="same"),  # whole 8-channel steps
]


@pytest.fixture(scope="module", autouse=True)
def context():
    return gpu.init()


@pytest.mark.parametrize("bm", [64, 128])
@pytest.mark.parametrize("p", PROBLEMS, ids=lambda p: p.name)
@pytest.mark.parametrize("kind", ["normal", "int"])
def test_gemm_tile(bm, p, kind):
    v = make_blocked(f"blocked_m{bm}", bm_rule=lambda _p: bm)
    assert uses_gemm_tile(p) and v.entry_for(p) == f"conv2d_blocked_1x1_m{bm}"
    r = check(v, p, kind=kind)
    assert r.ok, f"BM={bm} on {p.name} ({kind}): {r.reason}"
    assert r.nonfinite == 0 and r.repeat_bitwise
    if kind == "int":
        assert r.exact is True
