"""Day 10 on a real GPU (tests/test_wmma.py is the CPU half): ``igemm_wmma`` in fp16 and bf16 on
the NHWC edge suite and on ResNet-50-like layers, batching, misaligned and wrongly typed tensors.

tests/gpu/test_correctness.py runs the edge and quick suites through `Variant.adapt`, i.e. in
fp16 only; this file adds bf16, shapes that reach every entry point, ResNet-50 layers and the
tensor checks. Every `check` poisons the output with NaN, compares with the float64 reference
within the fp32-accumulation bound (bit for bit with integer inputs) and repeats the launch to
compare bitwise.

Skipped (tests/conftest.py) without a CUDA device or without pycuda; the whole file is skipped
on GPUs older than sm_80, which the variant refuses.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers import gpu
from helpers.check import check
from helpers.launch import prepare, run
from helpers.problem import Conv2dProblem
from helpers.reference import bitwise_equal
from helpers.suites import RESNET50_LAYERS, edge, is_big
from helpers.variants import UnsupportedProblem, get

pytestmark = pytest.mark.gpu

V = get("igemm_wmma")
DTYPES = ("fp16", "bf16")


def as_wmma(p: Conv2dProblem, dtype: str) -> Conv2dProblem:
    return dataclasses.replace(p, layout="NHWC", dtype=dtype, name="")


def nhwc(dtype: str = "fp16", **kw) -> Conv2dProblem:
    return Conv2dProblem(layout="NHWC", dtype=dtype, **kw)


EDGE = [as_wmma(p, d) for d in DTYPES for p in edge() if V.supports(as_wmma(p, d), smem_limit=2**31) is None]
EXTRA = [
    nhwc(N=2, C=8, H=13, W=11, K=130, R=3, S=3, padding=1),  # vec loads, K > 128 and K % 8 != 0 (scalar stores)
    nhwc(N=3, C=16, H=12, W=12, K=200, R=1, S=1),  # 1x1, 16-byte loads and stores everywhere
    nhwc(N=2, C=24, H=17, W=19, K=64, R=2, S=3, stride=(2, 1), padding=(1, 0), dilation=(1, 2)),  # C % 32 != 0
    nhwc(N=2, C=12, H=10, W=9, K=40, R=3, S=3, padding=1),  # C % 8 != 0 but even: scalar loads
    nhwc(N=4, C=96, H=14, W=14, K=96, R=3, S=3, padding=1),  # GEMM-K = 864: many steps
    nhwc("bf16", N=2, C=40, H=9, W=9, K=136, R=3, S=3, padding=1),  # 2 x 2 blocks, partial last step of a tap
]
EXTRA += [dataclasses.replace(p, dtype="bf16" if p.dtype == "fp16" else "fp16", name="") for p in EXTRA]
# ResNet-50 layers at N = 2: the stem-less 56x56 .. 7x7 shapes, 1x1 (strided) and 3x3.
RESNET = [
    nhwc(d, N=2, C=c, H=h, W=h, K=k, R=r, S=r, padding=pad, stride=s)
    for d in DTYPES
    for h, c, k, r, pad, s in (RESNET50_LAYERS[2], RESNET50_LAYERS[4], RESNET50_LAYERS[11], RESNET50_LAYERS[18])
]


def kinds_for(p: Conv2dProblem) -> list[str]:
    """normal and int always; cancel (exact result 0) when C is even."""
    return ["normal", "int"] + (["cancel"] if p.C % 2 == 0 else [])


def _cases(problems, suite_name):
    for p in problems:
        for kind in kinds_for(p):
            marks = [pytest.mark.big] if is_big(p) else []
            yield pytest.param(p, kind, id=f"{suite_name}:{p.dtype}:{p.name}-{kind}", marks=marks)


@pytest.fixture(scope="module", autouse=True)
def context():
    ctx = gpu.init()
    cc = gpu.device_info().cc
    if V.build_reason(cc):
        pytest.skip(f"igemm_wmma needs sm_80+; this GPU is sm_{cc[0]}{cc[1]}")
    return ctx


@pytest.mark.parametrize("p, kind", list(_cases(EDGE, "edge")) + list(_cases(EXTRA, "extra"))
                         + list(_cases(RESNET, "resnet50")))
def test_check_passes(p: Conv2dProblem, kind: str):
    r = check(V, p, kind=kind)
    assert r.ok, f"igemm_wmma on {p.dtype} {p.name} ({kind}): {r.reason}"
    assert r.nonfinite == 0 and r.repeat_bitwise and r.worst_err_over_bound <= 1
    if kind == "int":
        assert r.exact is True, f"{p.dtype} {p.name}: integer inputs but not bit-exact"
    if is_big(p):
        torch.cuda.empty_cache()


def test_every_entry_is_exercised():
    entries = {V.entry_for(p) for p in EDGE + EXTRA + RESNET}
    assert entries == {f"conv2d_igemm_wmma_{d}_{path}" for d in DTYPES for path in ("vec", "scalar")}


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_matches_single_images(dtype):
    """y[n] of a batched launch equals, bit for bit, the N = 1 launch on x[n:n+1]."""
    p = nhwc(dtype, N=3, C=16, H=11, W=9, K=40, R=3, S=3, padding=1, stride=(2, 1))
    x, w = p.make_inputs(device="cuda", seed=11)
    y = run(V, p, x, w).clone()
    p1 = dataclasses.replace(p, N=1, name="")
    for n in range(p.N):
        assert bitwise_equal(y[n : n + 1], run(V, p1, x[n : n + 1], w)), f"image {n} differs from its N=1 run"


@pytest.mark.parametrize("which", ["x", "w", "y"])
def test_misaligned_vec_tensors_refused_before_launch(which, misaligned):
    p = nhwc(N=2, C=16, H=8, W=8, K=16, R=3, S=3, padding=1)  # 16-byte loads and stores
    x, w = p.make_inputs(device="cuda")
    y = torch.full(p.y_shape, 7.0, dtype=p.torch_dtype, device="cuda")
    args = {"x": x, "w": w, "y": y}
    args[which] = misaligned(args[which])
    with pytest.raises(ValueError, match=rf"igemm_wmma: {which}\.data_ptr\(\) is not 16-byte aligned"):
        run(V, p, args["x"], args["w"], out=args["y"], poison=True)
    torch.cuda.synchronize()
    assert bool((args["y"] == 7.0).all()), "y was touched before the refusal"


def test_wrong_dtype_and_old_gpu_refused(monkeypatch):
    p = nhwc(N=1, C=8, H=6, W=6, K=8, R=3, S=3, padding=1)
    x, w = p.make_inputs(device="cuda")
    with pytest.raises(TypeError, match=r"x must be torch\.float16"):
        run(V, p, x.float(), w)
    with pytest.raises(UnsupportedProblem, match="dtype fp16/bf16; got fp32"):
        run(V, dataclasses.replace(p, dtype="fp32", name=""), x.float(), w.float())
    real = gpu.device_info()
    monkeypatch.setattr(gpu, "device_info", lambda: dataclasses.replace(real, cc=(7, 5)))
    y = torch.full(p.y_shape, 7.0, dtype=p.torch_dtype, device="cuda")
    with pytest.raises(UnsupportedProblem, match="compute capability 8.0 or newer"):
        prepare(V, p, x, w, out=y)
    assert bool((y == 7.0).all())
