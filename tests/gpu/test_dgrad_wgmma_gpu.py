"""Day 18 on a GPU (sm_90a: an H100 or H200; tests/test_dgrad_wgmma.py is the CPU half): unit-stride
dgrad as the rotate kernel plus day 16's fprop over dy.

* against the float64 reference (`helpers.check.check`: dx poisoned with NaN, the fp32 bound, a
  bitwise repeat) on day 14's dgrad edge problems that the variant claims (stride 1, K % 8 == 0,
  padding within the dilated filter) and on its own (C odd, R != S, dilations (1, 2) and (2, 1),
  padding' 0, several tiles); fp16 and bf16, normal and integer inputs (bit-exact);
* every one of day 16's configurations forced, on a problem of several tiles, integer inputs;
* the rotate kernel alone: the workspace holds exactly w turned around and transposed, w unchanged;
* a NaN-poisoned workspace and dx change nothing; two runs are bitwise equal; a run without the
  rotate launch (a planted fault) is caught;
* tensors the copy engine cannot take (a misaligned dy, dx when C % 8 == 0) are refused before any
  launch, and the context runs a check afterwards.

Skipped (tests/conftest.py) without a CUDA device or pycuda; the whole file is skipped on GPUs
other than compute capability 9.0.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from days import day18_dgrad_wgmma as d18
from days.day16_igemm_wgmma import ENTRIES, HOPPER_CC
from helpers import gpu
from helpers.check import check
from helpers.launch import prepare, run
from helpers.problem import Conv2dProblem
from helpers.reference import bitwise_equal, compare
from helpers.suites import BACKWARD_EDGES
from helpers.variants import get

pytestmark = pytest.mark.gpu

V = get("dgrad_wgmma")
NHWC = dict(dtype="fp16", layout="NHWC")
# Day 14's backward edge problems (helpers.suites.BACKWARD_EDGES, as day 14's tests run them).
DAY14_EDGES = BACKWARD_EDGES
UNCLAIMED_DAY14 = ["stride 3 > 2x2 filter", "padding past the dilated filter"]  # a crop: padding' < 0
CLAIMED_DAY14 = [k for k in DAY14_EDGES if k not in UNCLAIMED_DAY14]
# Day 18's own: C odd and not a multiple of 8 (the threads store dx, the rotate kernel loads w element
# by element), R != S, both dilations, padding 0 and padding' 0, a partial channel block of dy (K = 40),
# several m- and n-tiles, a 1x1 filter.
OWN = {
    "C odd, 3x2, dilation (1, 2)": dict(N=3, C=5, H=11, W=9, K=40, R=3, S=2, padding=(2, 0), dilation=(1, 2)),
    "C = 33, dilation (2, 1)": dict(N=2, C=33, H=15, W=12, K=24, R=3, S=2, padding=(0, 1), dilation=(2, 1)),
    "1x1, C past the tiles": dict(N=4, C=300, H=14, W=14, K=64, R=1, S=1),
    "5x4, padding R - 1 (padding' 0)": dict(N=2, C=72, H=17, W=13, K=136, R=5, S=4, padding=(4, 3)),
    "3x3 padding 0 (padding' 2)": dict(N=2, C=64, H=20, W=18, K=64, R=3, S=3),
    "C = 3, 5x5": dict(N=1, C=3, H=17, W=15, K=8, R=5, S=5, padding=2),
    # strided (an fprop per phase, then the scatter): C odd (the threads store the phases' y and dx),
    # stride (2, 3) with tapless phases, stride (2, 1) with C past the tiles, a 3 x 3 stride 2 with C odd
    "strided 1x1, C odd, stride (2, 3)": dict(N=3, C=5, H=11, W=8, K=16, R=1, S=1, stride=(2, 3)),
    "strided 1x1, stride (2, 1), C = 200": dict(N=2, C=200, H=13, W=7, K=40, R=1, S=1, stride=(2, 1)),
    "3x3 stride 2, C = 5": dict(N=2, C=5, H=13, W=7, K=40, R=3, S=3, stride=2, padding=1),
}
CASES = {**{k: DAY14_EDGES[k] for k in CLAIMED_DAY14}, **OWN}


@pytest.fixture(scope="module", autouse=True)
def context():
    ctx = gpu.init()
    cc = gpu.device_info().cc
    if cc != HOPPER_CC:
        pytest.skip(f"day 16's wgmma and im2col copies need sm_90a (compute capability 9.0); this GPU is {cc}")
    return ctx


def problem(spec: dict, dtype: str = "fp16") -> Conv2dProblem:
    return Conv2dProblem(**spec, dtype=dtype, layout="NHWC", op="dgrad")


def test_day_14s_edges_are_claimed_but_the_two_crops():
    claimed = [name for name, spec in DAY14_EDGES.items() if V.supports(problem(spec)) is None]
    assert claimed == CLAIMED_DAY14, claimed
    for name, spec in DAY14_EDGES.items():
        if name not in claimed:
            reason = V.supports(problem(spec))
            assert "(a crop)" in reason, (name, reason)


@pytest.mark.parametrize("kind", ["normal", "int"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_dgrad_against_the_reference(name: str, dtype: str, kind: str):
    p = problem(CASES[name], dtype)
    assert V.supports(p) is None, V.supports(p)
    r = check(V, p, kind=kind)
    assert r.ok and r.repeat_bitwise and r.nonfinite == 0, f"{name} ({dtype}, {kind}): {r.reason}"
    if kind == "int":
        assert r.exact, f"{name} ({dtype}): integer inputs but not bit-exact"


@pytest.mark.parametrize("config", ENTRIES, ids=lambda c: c.name)
def test_every_configuration_forced(config):
    """Each of day 16's entries runs the fprop over dy: 612 x 300 dx pixels x channels (several
    tiles on both axes for every tile), 9 taps of 72 channels (a partial channel block)."""
    v = d18.make_dgrad_wgmma(f"dgrad_wgmma[{config.name}]", config)
    p = problem(dict(N=2, C=300, H=17, W=18, K=72, R=3, S=3, padding=1))
    assert v.supports(p) is None, v.supports(p)
    r = check(v, p, kind="int")
    assert r.ok and r.exact and r.repeat_bitwise, f"{config.name}: {r.reason}"


@pytest.mark.parametrize("name", ["C odd, 3x2, dilation (1, 2)", "C, K past the tiles",
                                  "5x4, padding R - 1 (padding' 0)"])
def test_the_rotate_kernel_alone_turns_the_filter_around(name: str):
    """After the ``rotate`` launch the workspace is w'[c][r'][s'][k] = w[k][R-1-r'][S-1-s'][c] bit
    for bit (a NaN-poisoned workspace first: every element written), and w is unchanged."""
    p = problem(CASES[name])
    dy, w = p.make_inputs(device="cuda", seed=7)
    w0 = w.clone()
    prepared, _ = prepare(V, p, dy, w)
    prepared.workspace.fill_(255)
    prepared.kernels["rotate"]()
    torch.cuda.synchronize()
    got = prepared.workspace.view(p.torch_dtype).view(p.C, p.R, p.S, p.K)
    assert bitwise_equal(got, w.flip(1, 2).permute(3, 1, 2, 0).contiguous())
    assert bitwise_equal(w, w0)


def test_nan_poisoned_workspace_and_dx_change_nothing_and_runs_repeat_bitwise():
    p = problem(OWN["5x4, padding R - 1 (padding' 0)"])
    dy, w = p.make_inputs(device="cuda", seed=2)
    clean = run(V, p, dy, w).clone()
    prepared, out = prepare(V, p, dy, w)
    for _ in range(2):
        prepared.workspace.fill_(255)  # NaN halves
        out.fill_(float("nan"))
        prepared()
        torch.cuda.synchronize()
        assert bitwise_equal(out, clean), "a NaN-poisoned workspace or dx changed the result"
    d = compare(p, dy, w, clean)
    assert d["nonfinite"] == 0 and d["worst_err_over_bound"] <= 1, d


def test_a_run_without_the_rotate_launch_is_caught():
    """The planted fault: the fprop reads a workspace no launch wrote (poisoned with NaN)."""
    p = problem(OWN["3x3 padding 0 (padding' 2)"])
    dropped = dataclasses.replace(V, name="dgrad_wgmma_no_rotate", launches_fn=lambda q, ep, cfg: [
        k for k in V.launches_fn(q, ep, cfg) if k.name != "rotate"])
    dy, w = p.make_inputs(device="cuda", seed=4)
    prepared, out = prepare(dropped, p, dy, w)
    prepared.workspace.fill_(255)
    out.fill_(float("nan"))
    prepared()
    torch.cuda.synchronize()
    d = compare(p, dy, w, out)
    assert d["nonfinite"] > 0 or d["worst_err_over_bound"] > 1


def test_tensors_the_copy_engine_cannot_take_are_refused_before_a_launch(misaligned):
    p = problem(OWN["3x3 padding 0 (padding' 2)"])  # C = 64: dx stored by the copy engine
    dy, w = p.make_inputs(device="cuda")
    with pytest.raises(ValueError, match=r"dy\.data_ptr\(\) is not 16-byte aligned"):
        run(V, p, misaligned(dy), w)
    with pytest.raises(ValueError, match=r"dx\.data_ptr\(\) is not 16-byte aligned"):
        run(V, p, dy, w, out=misaligned(torch.empty(p.x_shape, dtype=p.torch_dtype, device="cuda")))
    with pytest.raises(ValueError, match=r"w\.data_ptr\(\) is not 16-byte aligned"):
        run(V, p, dy, misaligned(w))
    r = check(V, p)
    assert r.ok, r.reason
    q = problem(OWN["C odd, 3x2, dilation (1, 2)"])  # C = 5: the threads store dx, w read element by element
    dy, w = q.make_inputs(device="cuda", kind="int")
    want = run(V, q, dy, w).clone()
    out = misaligned(torch.empty(q.x_shape, dtype=q.torch_dtype, device="cuda"))
    assert bitwise_equal(run(V, q, dy, misaligned(w), out=out), want)


@pytest.mark.parametrize("name", ["strided 1x1, ResNet-style", "strided 1x1, C odd, stride (2, 3)",
                                  "3x3 stride 2, C = 5"])
def test_a_strided_run_without_the_scatter_is_caught(name: str):
    """The planted fault: the scatter launch dropped, dx (poisoned with NaN) is never written."""
    p = problem({**DAY14_EDGES, **OWN}[name])
    dropped = dataclasses.replace(V, name="dgrad_wgmma_no_scatter", launches_fn=lambda q, ep, cfg: [
        k for k in V.launches_fn(q, ep, cfg) if k.name != "scatter"])
    dy, w = p.make_inputs(device="cuda", seed=4)
    prepared, out = prepare(dropped, p, dy, w)
    out.fill_(float("nan"))
    prepared()
    torch.cuda.synchronize()
    assert compare(p, dy, w, out)["nonfinite"] > 0


def test_a_strided_run_writes_the_zeros_over_a_nan_poisoned_dx():
    p = problem(DAY14_EDGES["strided 1x1, ResNet-style"])
    dy, w = p.make_inputs(device="cuda", seed=6)
    prepared, out = prepare(V, p, dy, w)
    prepared.workspace.fill_(255)
    out.fill_(float("nan"))
    prepared()
    torch.cuda.synchronize()
    d = compare(p, dy, w, out)
    assert d["nonfinite"] == 0 and d["worst_err_over_bound"] <= 1, d
    assert (out.view(p.N, p.H, p.W, p.C)[:, 1::2] == 0).all()  # odd rows: no dy pixel reaches them
