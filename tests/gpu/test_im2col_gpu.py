"""Day 08 on a real GPU (tests/test_im2col.py is the CPU half; a distinct file name, since the test
folders are not packages): both kernels of ``im2col`` on the NHWC edge suite and on extra shapes,
each kernel on its own, the steps mechanism (workspace, one closure per step) and misaligned
tensors (the kernels' scalar fallbacks).

Skipped (tests/conftest.py) without a CUDA device or without pycuda. tests/gpu/test_correctness.py
also runs every variant on the NHWC edge suite (through `Variant.adapt`); this file adds
what is particular to a two-kernel variant.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from days import day08_im2col as hi
from helpers import gpu
from helpers.check import check
from helpers.launch import prepare, run
from helpers.problem import Conv2dProblem
from helpers.reference import bitwise_equal, compare
from helpers.suites import edge, is_big
from helpers.variants import get

pytestmark = pytest.mark.gpu

V = get("im2col")
EDGE = [p for p in map(V.adapt, edge()) if V.supports(p, smem_limit=2**31) is None and not is_big(p)]
EXTRA = [
    Conv2dProblem(N=2, C=8, H=13, W=11, K=130, R=3, S=3, padding=1, layout="NHWC"),  # K > 128, K % 4 != 0
    Conv2dProblem(N=3, C=16, H=12, W=12, K=200, R=1, S=1, layout="NHWC"),  # 1x1, float4 everywhere
    Conv2dProblem(N=2, C=5, H=17, W=19, K=64, R=2, S=3, stride=(2, 1), padding=(1, 0), dilation=(1, 2), layout="NHWC"),
    Conv2dProblem(N=4, C=64, H=14, W=14, K=96, R=3, S=3, padding=1, layout="NHWC"),  # GEMM-K = 576: many BK steps
]


def kinds_for(p: Conv2dProblem) -> list[str]:
    return ["normal", "int"] + (["cancel"] if p.C % 2 == 0 else [])


@pytest.fixture(scope="module", autouse=True)
def context():
    return gpu.init()


@pytest.mark.parametrize(
    "p, kind", [pytest.param(p, k, id=f"{p.name}-{k}") for p in EDGE + EXTRA for k in kinds_for(p)]
)
def test_check_passes_nhwc(p: Conv2dProblem, kind: str):
    r = check(V, p, kind=kind)
    assert r.ok, f"im2col on {p.name} ({kind}): {r.reason}"
    assert r.nonfinite == 0 and r.repeat_bitwise and r.worst_err_over_bound <= 1
    if kind == "int":
        assert r.exact is True


@pytest.mark.parametrize("p", EDGE + EXTRA, ids=lambda p: p.name)
def test_im2col_kernel_alone_equals_unfold(p: Conv2dProblem):
    """The lowered matrix, bit for bit (a copy: no arithmetic), against unfold reordered."""
    x, _ = p.make_inputs(device="cuda", seed=4)
    col = hi.lower(p, x)
    assert bitwise_equal(col, hi.lower_reference(p, x).contiguous())


@pytest.mark.parametrize("m, n, k", [(1000, 130, 77), (513, 64, 576), (300, 257, 1), (128, 128, 8)])
def test_gemm_alone_within_bound_of_float64(m: int, n: int, k: int):
    """sgemm_nt against a float64 matmul: |Y - ref| <= gamma_k * (|A| |B|^T) element-wise."""
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", generator=g)
    b = torch.randn(n, k, device="cuda", generator=g)
    y = torch.full((m, n), float("nan"), device="cuda")
    hi.sgemm_nt(a, b, y)
    torch.cuda.synchronize()
    ref = a.double() @ b.double().T
    u = 2.0**-24
    gamma = k * u / (1 - k * u)
    bound = (gamma + u) * (a.double().abs() @ b.double().abs().T) + 1e-300
    assert bool(torch.isfinite(y).all())
    worst = float(((y.double() - ref).abs() / bound).max())
    assert worst <= 1, f"sgemm_nt {m}x{n}x{k}: error {worst:.3g} x the bound"
    y2 = hi.sgemm_nt(a, b)
    assert bitwise_equal(y, y2)


def test_gemm_matches_torch_matmul_without_tf32():
    """Our SGEMM and torch.matmul (TF32 off) on the same lowered matrix agree within the fp32 bound."""
    p = EXTRA[3]
    x, w = p.make_inputs(device="cuda", seed=2)
    plan, y = prepare(V, p, x, w)
    plan.kernels["im2col"]()
    plan.kernels["gemm"]()
    col, wm = hi.col_view(p, plan.workspace), w.view(p.K, -1)
    m = torch.backends.cuda.matmul
    new_api = hasattr(m, "fp32_precision")  # torch >= 2.9; the legacy allow_tf32 before
    old = m.fp32_precision if new_api else m.allow_tf32
    if new_api:
        m.fp32_precision = "ieee"
    else:
        m.allow_tf32 = False
    try:
        ym = torch.matmul(col, wm.T)
    finally:
        if new_api:
            m.fp32_precision = old
        else:
            m.allow_tf32 = old
    r_ours = compare(p, x, w, y)
    r_torch = compare(p, x, w, ym.view(p.y_shape))
    assert r_ours["worst_err_over_bound"] <= 1 and r_torch["worst_err_over_bound"] <= 1, (r_ours, r_torch)


def test_steps_apart_equal_the_whole_run_and_workspace_size():
    p = EXTRA[0]
    x, w = p.make_inputs(device="cuda", seed=7)
    y_all = run(V, p, x, w)
    plan, y = prepare(V, p, x, w)
    ws = plan.workspace
    assert list(plan.kernels) == ["im2col", "gemm"]
    assert ws is not None and ws.dtype == torch.uint8 and ws.numel() == hi.lowered_bytes(p) and ws.device == x.device
    y.fill_(float("nan"))
    for f in plan.kernels.values():
        f()
    torch.cuda.synchronize()
    assert bitwise_equal(y, y_all)


def test_workspace_is_freed_with_the_closures():
    p = EXTRA[3]
    x, w = p.make_inputs(device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    launch, y = prepare(V, p, x, w)
    launch()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    assert held >= hi.lowered_bytes(p) + p.y_numel * 4
    del launch, y
    assert torch.cuda.memory_allocated() - before < hi.lowered_bytes(p)


def test_capped_grids_still_cover_everything():
    """The im2col grid capped at 1 block and the SGEMM's at 1 pixel tile: the grid-stride loops cover all."""
    p = EXTRA[3]

    def capped(q, ep):
        k1, k2 = hi.im2col_launches(q)
        return [
            dataclasses.replace(k1, config=dataclasses.replace(k1.config, grid=(1, 1, 1))),
            dataclasses.replace(k2, config=dataclasses.replace(k2.config, grid=(k2.config.grid[0], 1, 1))),
        ]

    v1 = dataclasses.replace(V, name="im2col_capped", launches_fn=capped)
    x, w = p.make_inputs(device="cuda", seed=9)
    assert bitwise_equal(run(v1, p, x, w), run(V, p, x, w))


def _shifted(t: torch.Tensor) -> torch.Tensor:
    """A copy of t that starts 4 bytes past a 256-byte-aligned allocation (contiguous, misaligned)."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    out = buf[1:].view(t.shape)
    out.copy_(t)
    return out


@pytest.mark.parametrize("p", EXTRA[:2], ids=lambda p: p.name)
def test_misaligned_tensors_take_the_scalar_paths(p: Conv2dProblem):
    x, w = p.make_inputs(device="cuda", kind="int", seed=5)
    ref = run(V, p, x, w)
    xs, wsh = _shifted(x), _shifted(w)
    ys = _shifted(torch.full(p.y_shape, float("nan"), device="cuda"))
    out = run(V, p, xs, wsh, out=ys)
    assert out.data_ptr() % 16 == 4
    assert bitwise_equal(out, ref)
    assert compare(p, x, w, out, exact=True)["exact_equal"]


def test_time_split_closures_are_timeable():
    from helpers.timing import time_gpu

    p = EXTRA[3]
    x, w = p.make_inputs(device="cuda")
    plan, _ = prepare(V, p, x, w)
    plan.kernels["im2col"]()  # the GEMM reads the lowered matrix: fill it once before timing the GEMM alone
    for name, f in plan.kernels.items():
        t = time_gpu(f, warmup=1, reps=5)
        assert 0 < t.ms_p20 <= t.ms_p50 <= t.ms_p80 and math.isfinite(t.ms_p50), name
