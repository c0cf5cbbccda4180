"""Day 11's mma.sync kernel on a GPU (sm_80+): the NHWC edge suite in fp16 and bf16 (normal,
integer bit-exact, cancelling), ResNet-50-shaped layers at N=2, the misaligned-pointer refusal.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from helpers import gpu
from helpers.check import check
from helpers.launch import run
from helpers.problem import Conv2dProblem
from helpers.suites import is_big, suite
from helpers.variants import get

pytestmark = pytest.mark.gpu


def _cases():
    v = get("igemm_mma")
    extra = [
        Conv2dProblem(N=2, C=64, H=56, W=56, K=64, R=3, S=3, padding=1),
        Conv2dProblem(N=2, C=256, H=28, W=28, K=128, R=1, S=1, stride=2),
        Conv2dProblem(N=2, C=40, H=14, W=14, K=72, R=3, S=3, padding=1),  # C % 8 == 0, K not a tile multiple
    ]
    for dt in ("fp16", "bf16"):
        for p in suite("edge", dtype=dt, layout="NHWC") + [replace(q, layout="NHWC", dtype=dt, name="") for q in extra]:
            if is_big(p) or v.supports(p):
                continue
            for kind in ["normal", "int"] + (["cancel"] if p.C % 2 == 0 else []):
                yield pytest.param(p, kind, id=f"{dt}-{p.name}-{kind}")


@pytest.fixture(scope="module", autouse=True)
def context():
    ctx = gpu.init()
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("mma.sync m16n8k16 with bf16 and ldmatrix need sm_80+")
    return ctx


@pytest.mark.parametrize("p, kind", list(_cases()))
def test_check_passes(p, kind):
    r = check("igemm_mma", p, kind=kind)
    assert r.ok, f"{p.name} ({p.dtype}, {kind}): {r.reason}"
    assert r.nonfinite == 0 and r.repeat_bitwise
    if kind == "int":
        assert r.exact is True


def test_int_inputs_match_torch_bit_for_bit():
    """Small-integer fp16 inputs: fp32 accumulation is exact, so ours equals cuDNN's output."""
    p = Conv2dProblem(N=2, C=64, H=20, W=20, K=96, R=3, S=3, padding=1, dtype="fp16", layout="NHWC")
    x, w = p.make_inputs(device="cuda", kind="int")
    y = run("igemm_mma", p, x, w)
    ref = torch.nn.functional.conv2d(p.to_nchw(x), p.w_to_kcrs(w), **p.torch_kwargs())
    assert torch.equal(p.to_nchw(y), ref)


def test_misaligned_x_refused():
    p = Conv2dProblem(N=1, C=64, H=8, W=8, K=64, R=1, S=1, dtype="fp16", layout="NHWC")
    x, w = p.make_inputs(device="cuda")
    xs = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")[1:].view(x.shape)
    xs.copy_(x)
    with pytest.raises(ValueError, match="x.data_ptr"):
        run("igemm_mma", p, xs, w)
