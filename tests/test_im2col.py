"""Day 08 on the CPU: the im2col index mapping, the two-kernel (steps + workspace) mechanism, the
coverage models of both kernels, the workspace size and the refusals.

The lowered matrix is built in numpy with ``im2col_nhwc``'s own index arithmetic
(`days.day08_im2col.lower_emulate`) and compared with ``torch.nn.functional.unfold``, reordered to
rows (n, p, q) and columns (r, s, c). The kernels themselves run in tests/gpu/test_im2col_gpu.py.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from days import day08_im2col as hi
from helpers import gpu
from helpers.launch import prepare, run
from helpers.problem import Conv2dProblem
from helpers.suites import edge, is_big, resnet50
from helpers.variants import Buffer, KernelLaunch, LaunchConfig, UnsupportedProblem, get

V = get("im2col")
EDGE = [V.adapt(p) for p in edge()]
CLAIMED = [p for p in EDGE if V.supports(p) is None]
SMALL = [p for p in CLAIMED if p.x_numel * p.R * p.S < 2_000_000]
EXTRA = [
    Conv2dProblem(N=2, C=8, H=13, W=11, K=130, R=3, S=3, padding=1, layout="NHWC"),  # K > 128, not a multiple of 4
    Conv2dProblem(N=3, C=16, H=12, W=12, K=200, R=1, S=1, layout="NHWC"),  # 1x1: col is x itself
    Conv2dProblem(N=2, C=5, H=17, W=19, K=64, R=2, S=3, stride=(2, 1), padding=(1, 0), dilation=(1, 2), layout="NHWC"),
    Conv2dProblem(N=1, C=8, H=9, W=9, K=3, R=3, S=3, stride=2, padding=0, layout="NHWC"),
]


def nhwc(**kw) -> Conv2dProblem:
    return Conv2dProblem(layout="NHWC", **kw)


def ids(ps):
    return [p.name for p in ps]


# ---- the lowered matrix ----------------------------------------------------------------------


@pytest.mark.parametrize("p", SMALL + EXTRA, ids=ids(SMALL + EXTRA))
def test_kernel_index_math_matches_unfold(p: Conv2dProblem):
    x, _ = p.make_inputs(kind="normal", seed=5)
    ref = hi.lower_reference(p, x)
    assert tuple(ref.shape) == hi.lowered_shape(p)
    for vec in sorted({1, hi.im2col_vec(p)}):  # the scalar path, and the float4 path where C % 4 == 0
        emu = hi.lower_emulate(p, x, vec=vec)
        assert np.array_equal(emu, ref.numpy()), f"{p.name}, V={vec}: emulated im2col differs from unfold"


@pytest.mark.parametrize("p", SMALL[:8] + EXTRA, ids=ids(SMALL[:8] + EXTRA))
def test_lowered_gemm_is_the_convolution(p: Conv2dProblem):
    """col . W^T (W = KRSC filters as K x R*S*C) equals conv2d, exactly, on integer inputs."""
    x, w = p.make_inputs(kind="int", seed=1)
    col = torch.from_numpy(hi.lower_emulate(p, x)).double()
    y = (col @ w.reshape(p.K, -1).double().T).reshape(p.y_shape)  # (N, P, Q, K): NHWC
    ref = F.conv2d(p.to_nchw(x).double(), p.w_to_kcrs(w).double(), **p.torch_kwargs())
    assert torch.equal(p.to_nchw(y), ref)


def test_worked_example_rows():
    """The notebook's example: a 1x4x4x2 input, 3x3 filter, padding 1: row m holds pixel (p, q)'s 3x3x2 taps."""
    p = nhwc(N=1, C=2, H=4, W=4, K=1, R=3, S=3, padding=1)
    x = torch.arange(p.x_numel, dtype=torch.float32).reshape(p.x_shape)
    col = hi.lower_emulate(p, x)
    assert col.shape == (16, 18)
    # row 5 = (p, q) = (1, 1): its receptive field is input rows 0..2, columns 0..2, all inside
    expect = x[0, 0:3, 0:3, :].reshape(-1).numpy()
    assert np.array_equal(col[5], expect)
    # row 0 = (0, 0): the top row and left column of taps fall in the padding
    taps = col[0].reshape(3, 3, 2)
    assert (taps[0] == 0).all() and (taps[:, 0] == 0).all() and np.array_equal(taps[1:, 1:], x[0, :2, :2].numpy())


# ---- sizes -----------------------------------------------------------------------------------


def test_workspace_is_the_lowered_matrix():
    for p in CLAIMED + EXTRA + [V.adapt(q) for q in resnet50((32,))]:
        m, gk = hi.lowered_shape(p)
        assert (m, gk) == (p.N * p.P * p.Q, p.R * p.S * p.C) == (p.gemm.m, p.gemm.k)
        assert hi.lowered_bytes(p) == m * gk * 4 == V.workspace_bytes(p) == hi.workspace_bytes(p)
        assert hi.input_bytes(p) == p.x_numel * 4


def test_blowup_is_rs_over_stride_squared():
    same3 = nhwc(N=2, C=8, H=10, W=12, K=4, R=3, S=3, padding=1)  # stride 1, 'same': exactly R*S
    assert hi.blowup(same3) == 9
    s2_1x1 = nhwc(N=2, C=8, H=10, W=12, K=4, R=1, S=1, stride=2)  # reads every other pixel of every other row
    assert hi.blowup(s2_1x1) == 0.25
    for p in (V.adapt(q) for q in resnet50((32,))):
        approx = p.R * p.S / (p.stride[0] * p.stride[1])
        assert hi.blowup(p) == pytest.approx(approx, rel=0.1), p.name  # border effects only


# ---- steps, launches and coverage ------------------------------------------------------------


def test_launches_are_im2col_then_gemm():
    p = EXTRA[0]
    k1, k2 = V.launches(p)
    m, gk = hi.lowered_shape(p)
    assert (k1.name, k1.entry, k1.config) == ("im2col", "im2col_nhwc", hi.im2col_launch(p))
    assert k1.args[:2] == (Buffer("x"), Buffer("workspace"))
    assert [int(a) for a in k1.args[2:]] == [p.N, p.C, p.H, p.W, p.R, p.S, p.P, p.Q, *p.stride, *p.padding, *p.dilation]
    assert (k2.name, k2.entry, k2.config) == ("gemm", V.entry_for(p), V.launch(p))  # the one `covers` models
    assert k2.args[:3] == (Buffer("workspace"), Buffer("w"), Buffer("y"))
    assert [int(a) for a in k2.args[3:]] == [m, p.K, gk]
    assert all(isinstance(a, np.int32) for a in k1.args[2:] + k2.args[3:])
    assert V.entry_for(nhwc(N=1, C=4, H=8, W=8, K=64, R=1, S=1)) == "sgemm_nt_128x64"
    assert V.entry_for(nhwc(N=1, C=4, H=8, W=8, K=65, R=1, S=1)) == "sgemm_nt_128x128"


def test_single_kernel_variant_is_one_main_launch():
    v = get("general")
    p = edge()[0]
    (k,) = v.launches(p)
    assert (k.name, k.entry, k.config) == ("main", v.entry_for(p), v.launch(p))
    assert k.args[:3] == (Buffer("x"), Buffer("w"), Buffer("y")) and len(k.args) == 3 + 16
    assert v.workspace_bytes(p) == 0


def test_launch_names_must_be_unique():
    def twice(p, ep):
        k = KernelLaunch("main", "conv2d_general", LaunchConfig((1, 1, 1), (1, 1, 1)), ())
        return [k, k]

    bad = dataclasses.replace(get("general"), name="general_twice", launches_fn=twice)
    with pytest.raises(ValueError, match="unique"):
        bad.launches(edge()[0])


@pytest.mark.parametrize("p", CLAIMED + EXTRA, ids=ids(CLAIMED + EXTRA))
def test_every_output_and_col_element_written_once(p: Conv2dProblem):
    if is_big(p):
        pytest.skip("2^31-element problem")
    assert (np.asarray(V.covers(p)) == 1).all(), f"{p.name}: the SGEMM model misses or repeats outputs"
    assert (hi.im2col_writes(p) == 1).all(), f"{p.name}: the im2col model misses or repeats col elements"
    # capped grids: the grid-stride loops still cover everything once
    capped = dataclasses.replace(V.launch(p), grid=(V.launch(p).grid[0], 1, 1))
    assert (np.asarray(V.plan(p).covers(capped)) == 1).all()
    assert (hi.im2col_writes(p, LaunchConfig(grid=(1, 1, 1), block=(256, 1, 1))) == 1).all()


def test_grid_limits_on_resnet50_and_the_tall_edge_problem():
    for p in [V.adapt(q) for q in resnet50()] + [q for q in CLAIMED if q.P > 65535]:
        assert V.supports(p) is None, p.name
        for k in V.launches(p):
            assert 1 <= k.config.grid[0] <= 2**31 - 1 and k.config.grid[1] <= 65535 and k.config.grid[2] == 1


def test_supports_checks_every_launch():
    def launches_with_big_block(p, ep):
        k1, k2 = hi.im2col_launches(p)
        return [dataclasses.replace(k1, config=LaunchConfig(grid=(1, 1, 1), block=(2048, 1, 1))), k2]

    bad = dataclasses.replace(V, name="im2col_bad", launches_fn=launches_with_big_block)
    reason = bad.supports(EXTRA[0])
    assert reason is not None and reason.startswith("im2col_bad (im2col kernel): block (2048, 1, 1)"), reason


# ---- refusals --------------------------------------------------------------------------------


def test_refusals_name_the_reason():
    ok = nhwc(N=1, C=4, H=8, W=8, K=4, R=3, S=3, padding=1)
    assert V.supports(ok) is None
    r = V.supports(nhwc(N=1, C=4, H=8, W=8, K=4, R=3, S=3, padding=1, groups=2))
    assert r.startswith("im2col: needs groups=1; got 2"), r
    r = V.supports(Conv2dProblem(N=1, C=4, H=8, W=8, K=4, R=3, S=3, padding=1))
    assert r == "im2col takes layout NHWC; got NCHW", r
    assert "dtype fp32" in V.supports(nhwc(N=1, C=4, H=8, W=8, K=4, R=3, S=3, padding=1, dtype="fp16"))


def test_workspace_cap_refusal():
    big = next(p for p in EDGE if is_big(p))
    r = V.supports(big)
    assert r is not None and "lowered matrix would be" in r and "GiB" in r and "WORKSPACE_CAP" in r, r
    # just under and just over the cap
    p = nhwc(N=64, C=64, H=64, W=64, K=64, R=3, S=3, padding=1)  # 64*64*64 rows x 576 columns x 4 B = 576 MiB
    assert V.supports(p) is None
    assert hi.lowered_bytes(p) == 576 * 2**20


def test_workspace_cap_is_read_at_call_time(monkeypatch):
    p = nhwc(N=2, C=8, H=16, W=16, K=8, R=3, S=3, padding=1)
    monkeypatch.setattr(hi, "WORKSPACE_CAP", hi.lowered_bytes(p) - 1)
    assert "workspace cap" in V.supports(p)
    monkeypatch.setattr(hi, "WORKSPACE_CAP", hi.lowered_bytes(p))
    assert V.supports(p) is None


def test_gemm_int32_refusal():
    p = nhwc(N=1, C=1, H=1, W=1, K=2**31 - 100, R=1, S=1)
    r = V.supports(p)
    assert r is not None and "GEMM-N = K" in r and "int32" in r, r


@pytest.fixture
def no_gpu(monkeypatch):
    def touched(*a, **k):
        raise AssertionError("the GPU was touched before the input was validated")

    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    monkeypatch.setattr(gpu, "init", touched)
    monkeypatch.setattr(gpu, "device_info", touched)
    monkeypatch.setattr(gpu, "has_gpu", lambda: False)  # `supports` without a limit asks no device either


@pytest.mark.parametrize("call", [prepare, run], ids=["prepare", "run"])
def test_refused_before_any_gpu_call(call, no_gpu):
    grouped = nhwc(N=1, C=4, H=8, W=8, K=4, R=3, S=3, padding=1, groups=2)
    x, w = grouped.make_inputs()
    with pytest.raises(UnsupportedProblem, match="groups=1"):
        call("im2col", grouped, x, w)
    nchw = Conv2dProblem(N=1, C=4, H=8, W=8, K=4, R=3, S=3, padding=1)
    x, w = nchw.make_inputs()
    with pytest.raises(UnsupportedProblem, match="layout NHWC"):
        call("im2col", nchw, x, w)
    p = EXTRA[0]
    x, w = p.make_inputs()
    with pytest.raises(ValueError, match=r"x is on cpu"):
        call("im2col", p, x, w)
    with pytest.raises(ValueError, match="w must have shape"):
        call("im2col", p, x, w.permute(0, 3, 1, 2))
    with pytest.raises(ValueError, match="y must be"):
        call("im2col", p, x, w, out=torch.empty(p.y_shape, dtype=torch.float64))


def test_sgemm_nt_validates_before_the_gpu(no_gpu):
    a, b = torch.zeros(10, 8), torch.zeros(5, 8)
    with pytest.raises(TypeError, match="a must be torch.float32"):
        hi.sgemm_nt(a.double(), b)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        hi.sgemm_nt(a, b.numpy())
    with pytest.raises(ValueError, match="contiguous 2-D"):
        hi.sgemm_nt(a, b.T)
    with pytest.raises(ValueError, match="second dimensions"):
        hi.sgemm_nt(a, torch.zeros(5, 9))
    with pytest.raises(ValueError, match=r"out must have shape \(10, 5\)"):
        hi.sgemm_nt(a, b, torch.zeros(5, 10))
    with pytest.raises(ValueError, match="a is on cpu"):
        hi.sgemm_nt(a, b)
