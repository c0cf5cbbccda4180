"""Days 20 and 21 on a GPU (any compute capability the series builds for; tests/test_winograd.py is the CPU
half): winograd_f2 and winograd_f4, the non-fused pipeline of kernels/conv2d/20_winograd.cu.

* against the float64 reference (`helpers.check.check`: y poisoned with NaN, a bitwise repeat) with
  the variant's own bound (`days.day20_winograd.winograd_model`: `error_bound` over the whole
  output, with the transforms' constants; the dot product's bound is too tight for F(4) and F(6)),
  on odd sizes, N > 1, C in 1, 3 and odd, padding 0, 1, 2, non-square, both layouts; normal,
  integer (bit-exact for F(2) only: F(4)'s transforms hold 1/6, 1/12, 1/24) and cancelling inputs;
* the four ResNet-50 3 x 3 stride-1 layers at N = 32 in both layouts (N = 256 is the benchmark's);
* every GEMM tile forced; F(6, 3) (built, not registered) within its bound, and the error growing
  F(2) < F(4) < F(6);
* each transform alone against the CPU simulation (`simulate`, the same index arithmetic): the
  workspace's U, V and M, every element written (the workspace poisoned with NaN first);
* NaN-poisoned workspace and y change nothing; two runs agree bit for bit;
* planted faults caught: a GEMM grid one transform position short (its M never written: NaN, or
  zeros, which break the bound), a run without the filter transform;
* bad input refused before any launch (stride 2, a 5 x 5 filter, fp64 tensors, a workspace over
  the limit), y untouched.

Day 21's fused kernels (winograd_f2_fused, winograd_f4_fused: kernels/conv2d/21_winograd_fused.cu), the
same way: against the reference with day 20's bound (normal, integer: bit-exact through F(2) only,
cancelling), the ResNet-50 layers, equal to the pipeline (the same roundings in the same order),
NaN-poisoned workspace and y, bitwise repeats and a batch equal to its images alone, the filter
launch against `simulate_filter`; planted faults (a grid one block short, no filter transform, an
edge column misplaced, a channel chunk dropped) caught; bad problems refused before a launch.

Skipped (tests/conftest.py) without a CUDA device or pycuda.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from days import day20_winograd as w20
from days import day21_winograd_fused as w21
from helpers import gpu
from helpers.check import check
from helpers.launch import prepare, run
from helpers.problem import Conv2dProblem
from helpers.reference import bitwise_equal, compare
from helpers.suites import resnet50
from helpers.variants import UnsupportedProblem

pytestmark = pytest.mark.gpu

VARIANTS = {2: w20.WINOGRAD[2], 4: w20.WINOGRAD[4]}
FUSED = {2: w21.WINOGRAD_FUSED[2], 4: w21.WINOGRAD_FUSED[4]}
LAYOUTS = ("NCHW", "NHWC")
# (N, C, H, W, K, padding)
CASES = {
    "odd sizes, N = 2, C = 3": (2, 3, 37, 53, 5, 1),
    "C = 1, padding 2": (1, 1, 5, 4, 2, 2),
    "padding 0, C = 9, N = 3": (3, 9, 11, 6, 7, 0),
    "one pixel": (1, 2, 1, 1, 3, 1),
    "non-square padding (2, 0)": (2, 5, 13, 10, 4, (2, 0)),
    "C = 45, K = 33 (no tile divides them)": (1, 45, 19, 21, 33, 1),
    "K = 130, several tiles both ways": (2, 64, 30, 34, 130, 1),
    "a long reduction, C = 300": (1, 300, 12, 12, 24, 1),
}
RESNET_3X3_N32 = [p for p in resnet50(batches=(32,)) if p.R == 3 and p.stride == (1, 1)]


@pytest.fixture(scope="module", autouse=True)
def context():
    return gpu.init()


def problem(spec, layout: str = "NCHW") -> Conv2dProblem:
    n, c, h, w, k, pad = spec
    return Conv2dProblem(N=n, C=c, H=h, W=w, K=k, R=3, S=3, padding=pad, layout=layout)


@pytest.mark.parametrize("kind", ["normal", "int", "cancel"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("fused", [False, True], ids=["pipeline", "fused"])
def test_against_the_reference(fused: bool, name: str, m: int, layout: str, kind: str):
    """`check` (y poisoned with NaN, a bitwise repeat) with day 20's bound, pipeline and fused;
    integers bit-exact through F(2) only."""
    v, p = (FUSED if fused else VARIANTS)[m], problem(CASES[name], layout)
    if p.supports_kind(kind):
        pytest.skip(p.supports_kind(kind))
    assert v.supports(p) is None, v.supports(p)
    r = check(v, p, kind=kind)
    assert r.ok and r.repeat_bitwise and r.nonfinite == 0, f"{v.name} on {name} ({layout}, {kind}): {r.reason}"
    if kind == "int":
        assert r.exact is (True if m == 2 else None), r  # F(2): dyadic transforms; F(4): not asked


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("p", RESNET_3X3_N32, ids=lambda p: p.name)
@pytest.mark.parametrize("fused", [False, True], ids=["pipeline", "fused"])
def test_the_resnet50_3x3_layers(fused: bool, p: Conv2dProblem, m: int, layout: str):
    v, q = (FUSED if fused else VARIANTS)[m], dataclasses.replace(p, layout=layout, name="")
    r = check(v, q)
    assert r.ok, f"{v.name} on {q.name} ({layout}): {r.reason}"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("tile", w20.GEMM_TILES, ids=lambda t: f"{t[0]}x{t[1]}")
def test_every_gemm_tile_forced(tile, layout: str):
    """Several tiles on both GEMM axes (K = 130 filters, 2 x 8 x 9 = 144 F(4) tiles) and C = 20
    (Cp = 24: a padded reduction), integer inputs through F(2) (bit-exact) and normal ones through F(4)."""
    p = problem((2, 20, 30, 34, 130, 1), layout)
    for m, kind in ((2, "int"), (4, "normal")):
        v = w20.make_winograd(m, f"winograd_f{m}[{tile[0]}x{tile[1]}]", w20.WinoConfig(*tile))
        r = check(v, p, kind=kind)
        assert r.ok and r.repeat_bitwise, f"{v.name} ({layout}): {r.reason}"
        assert kind != "int" or r.exact


@pytest.mark.parametrize("layout", LAYOUTS)
def test_f6_within_its_bound_and_the_error_grows_with_the_tile(layout: str):
    """The error study: F(6, 3) (not registered) passes its own bound; the relative L2 error grows
    F(2) < F(4) < F(6) on the same 256-channel problem."""
    p = problem((2, 256, 28, 28, 64, 1), layout)
    rel = {}
    for m in (2, 4, 6):
        v = VARIANTS.get(m) or w20.make_winograd(6)
        r = check(v, p, kind="normal")
        assert r.ok, f"{v.name}: {r.reason}"
        rel[m] = r.rel_l2
    assert rel[2] < rel[4] < rel[6], rel


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
def test_each_transform_alone_is_the_simulation(m: int, layout: str):
    """After each launch (the workspace NaN-poisoned first), its part of the workspace equals the CPU
    simulation's (`simulate` in float32: the kernel fuses multiply-adds, so to a few units of the
    last place, relative to the parts' magnitudes); no element is left NaN."""
    v, p = VARIANTS[m], problem((2, 13, 11, 9, 6, (1, 2)), layout)
    g = w20.Geometry.of(p, m)
    x, w = p.make_inputs(device="cuda", seed=8)
    _, sim = w20.simulate(p, x.cpu().numpy(), w.cpu().numpy(), m, np.float32)
    prepared, y = prepare(v, p, x, w)
    ws = prepared.workspace.view(torch.float32)
    ws.fill_(float("nan"))
    y.fill_(float("nan"))
    for launch, part in (("filter", "U"), ("input", "V"), ("gemm", "M")):
        prepared.kernels[launch]()
        torch.cuda.synchronize()
        start, size = g.offset(part) // 4, g.elements(part)
        got = ws[start:start + size].cpu().numpy()
        want = sim[start:start + size]
        assert not np.isnan(got).any(), f"{launch}: {int(np.isnan(got).sum())} elements of {part} unwritten"
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))
    prepared.kernels["output"]()
    torch.cuda.synchronize()
    d = compare(p, x, w, y, model=v.error_model)
    assert d["nonfinite"] == 0 and d["worst_err_over_bound"] <= 1, d


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("fused, case", [(False, "C = 45, K = 33 (no tile divides them)"),
                                         (True, "K = 130, several tiles both ways")], ids=["pipeline", "fused"])
def test_nan_poisoned_workspace_and_y_change_nothing_and_runs_repeat_bitwise(fused: bool, case: str, m: int,
                                                                             layout: str):
    v, p = (FUSED if fused else VARIANTS)[m], problem(CASES[case], layout)
    x, w = p.make_inputs(device="cuda", seed=2)
    clean = run(v, p, x, w).clone()
    prepared, out = prepare(v, p, x, w)
    for _ in range(2):
        prepared.workspace.view(torch.float32).fill_(float("nan"))
        out.fill_(float("nan"))
        prepared()
        torch.cuda.synchronize()
        assert bitwise_equal(out, clean), "a NaN-poisoned workspace or y changed the result"
    d = compare(p, x, w, clean, model=v.error_model)
    assert d["nonfinite"] == 0 and d["worst_err_over_bound"] <= 1, d


def short_gemm(v):
    """A planted fault: the GEMM's grid one transform position short (the last position's M is
    never written)."""
    def launches(p, ep, cfg):
        ks = v.launches_fn(p, ep, cfg)
        return [dataclasses.replace(k, config=dataclasses.replace(
            k.config, grid=(*k.config.grid[:2], k.config.grid[2] - 1))) if k.name == "gemm" else k for k in ks]
    return dataclasses.replace(v, name=f"{v.name}_short_gemm", launches_fn=launches)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
def test_a_dropped_transform_position_is_caught(m: int, layout: str):
    bad, p = short_gemm(VARIANTS[m]), problem((2, 16, 14, 15, 8, 1), layout)
    x, w = p.make_inputs(device="cuda", seed=4)
    prepared, out = prepare(bad, p, x, w)
    prepared.workspace.view(torch.float32).fill_(float("nan"))  # the unwritten position reads NaN
    prepared()
    torch.cuda.synchronize()
    assert compare(p, x, w, out, model=bad.error_model)["nonfinite"] > 0
    prepared.workspace.zero_()  # ... or zeros: the bound sees the missing position
    prepared()
    torch.cuda.synchronize()
    d = compare(p, x, w, out, model=bad.error_model)
    assert d["nonfinite"] == 0 and d["worst_err_over_bound"] > 1, d


def test_a_run_without_the_filter_transform_is_caught():
    v = VARIANTS[4]
    dropped = dataclasses.replace(v, name="winograd_f4_no_filter", launches_fn=lambda q, ep, cfg: [
        k for k in v.launches_fn(q, ep, cfg) if k.name != "filter"])
    p = problem((1, 8, 9, 10, 4, 1))
    x, w = p.make_inputs(device="cuda", seed=1)
    prepared, out = prepare(dropped, p, x, w)
    prepared.workspace.view(torch.float32).fill_(float("nan"))
    prepared()
    torch.cuda.synchronize()
    assert compare(p, x, w, out, model=v.error_model)["nonfinite"] > 0


@pytest.mark.parametrize("spec, words", [
    (dict(N=1, C=3, H=9, W=9, K=4, R=3, S=3, padding=1, stride=2), "needs stride 1"),
    (dict(N=1, C=3, H=9, W=9, K=4, R=5, S=5, padding=2), "3 x 3 filter"),
    (dict(N=1, C=3, H=9, W=9, K=4, R=3, S=3, padding=2, dilation=2), "needs dilation 1"),
    (dict(N=1, C=4, H=9, W=9, K=4, R=3, S=3, padding=1, groups=2), "needs groups = 1"),
])
def test_bad_problems_are_refused_before_a_launch(spec, words):
    p = Conv2dProblem(**spec)
    x, w = p.make_inputs(device="cuda")
    y = torch.full(p.y_shape, 7.0, device="cuda")
    for v in [*VARIANTS.values(), *FUSED.values()]:
        with pytest.raises(UnsupportedProblem, match=words):
            run(v, p, x, w, out=y)
    torch.cuda.synchronize()
    assert bool((y == 7.0).all()), "y was touched before the refusal"


def test_bad_tensors_and_a_huge_workspace_are_refused_before_a_launch():
    p = problem((1, 3, 9, 9, 4, 1))
    x, w = p.make_inputs(device="cuda")
    with pytest.raises(TypeError, match="torch.float32"):
        run(VARIANTS[2], p, x.double(), w)
    with pytest.raises(ValueError, match="must have shape"):
        run(VARIANTS[2], p, x, w[:, :2])
    big = Conv2dProblem(N=1, C=4096, H=1024, W=1024, K=8, R=3, S=3, padding=1)  # V alone: 16 x 4096 x 512^2 floats
    assert "of workspace" in VARIANTS[2].supports(big)
    with pytest.raises(UnsupportedProblem, match="GiB"):
        prepare(VARIANTS[2], big, torch.empty(0, device="cuda"), torch.empty(0, device="cuda"))
    r = check(VARIANTS[2], p)  # the context still runs a check afterwards
    assert r.ok, r.reason


# ==============================================================================================
# Day 21's fused kernels (kernels/conv2d/21_winograd_fused.cu; tests/test_winograd_fused.py: the CPU half)
# ==============================================================================================


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
def test_fused_equals_the_pipeline(m: int, layout: str):
    """The same transforms and the same fmaf chain over the channels in the same order: the fused
    output equals the pipeline's (==, so only a zero's sign may differ: the pipeline pads C to 8,
    the fused kernel to BC)."""
    for name in ("odd sizes, N = 2, C = 3", "C = 45, K = 33 (no tile divides them)", "a long reduction, C = 300"):
        p = problem(CASES[name], layout)
        x, w = p.make_inputs(device="cuda", seed=6)
        fused = run(FUSED[m], p, x, w).clone()
        pipe = run(VARIANTS[m], p, x, w)
        torch.cuda.synchronize()
        assert torch.equal(fused, pipe), (name, float((fused - pipe).abs().max()))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
def test_fused_batch_is_its_images_alone_bit_for_bit(m: int, layout: str):
    v, p = FUSED[m], problem((3, 21, 17, 19, 40, 1), layout)
    x, w = p.make_inputs(device="cuda", seed=3)
    y = run(v, p, x, w).clone()
    p1 = dataclasses.replace(p, N=1, name="")
    for n in range(p.N):
        y1 = run(v, p1, x[n:n + 1].contiguous(), w)
        torch.cuda.synchronize()
        assert bitwise_equal(y[n:n + 1], y1), n


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
def test_fused_filter_transform_is_the_simulation(m: int, layout: str):
    """The filter launch alone (workspace NaN first): the blocked U equals `simulate_filter` in
    float32 to a few units of the last place, every element written."""
    v, p = FUSED[m], problem((2, 13, 11, 9, 37, (1, 2)), layout)
    x, w = p.make_inputs(device="cuda", seed=8)
    want = w21.simulate_filter(p, w.cpu().numpy(), w21.FUSED_TILES[m], np.float32)
    prepared, _ = prepare(v, p, x, w)
    ws = prepared.workspace.view(torch.float32)
    ws.fill_(float("nan"))
    prepared.kernels["filter"]()
    torch.cuda.synchronize()
    got = ws[: want.size].cpu().numpy()
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def with_main_args(v, name: str, change):
    """A planted fault: the main launch's arguments (or config) changed by ``change(launch)``."""
    def launches(p, ep, cfg):
        return [change(k) if k.name == "main" else k for k in v.launches_fn(p, ep, cfg)]
    return dataclasses.replace(v, name=f"{v.name}_{name}", launches_fn=launches)


def run_poisoned(v, p, seed: int = 4):
    x, w = p.make_inputs(device="cuda", seed=seed)
    prepared, out = prepare(v, p, x, w)
    prepared.workspace.view(torch.float32).fill_(float("nan"))
    out.fill_(float("nan"))
    prepared()
    torch.cuda.synchronize()
    return compare(p, x, w, out, model=v.error_model)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
def test_fused_planted_faults_are_caught(m: int, layout: str):
    """The clean run passes; a grid one block short (outputs never written: NaN), a run without the
    filter transform (U read NaN), the main kernel told one output column fewer (the edge tiles'
    last column unwritten, every row placed with the wrong pitch) fail."""
    v, p = FUSED[m], problem((2, 16, 14, 15, 40, 1), layout)
    clean = run_poisoned(v, p)
    assert clean["nonfinite"] == 0 and clean["worst_err_over_bound"] <= 1, clean
    short = with_main_args(v, "short_grid", lambda k: dataclasses.replace(
        k, config=dataclasses.replace(k.config, grid=(k.config.grid[0] - 1, 1, 1))))
    assert run_poisoned(short, p)["nonfinite"] > 0
    no_filter = dataclasses.replace(v, name=f"{v.name}_no_filter", launches_fn=lambda q, ep, cfg: [
        k for k in v.launches_fn(q, ep, cfg) if k.name != "filter"])
    assert run_poisoned(no_filter, p)["nonfinite"] > 0
    q_arg = 9  # x, Ub, y, N, C, H, W, K, P, Q
    edge = with_main_args(v, "edge", lambda k: dataclasses.replace(
        k, args=k.args[:q_arg] + (np.int32(int(k.args[q_arg]) - 1),) + k.args[q_arg + 1:]))
    d = run_poisoned(edge, p)
    assert d["nonfinite"] > 0 or d["worst_err_over_bound"] > 1, d


def test_fused_dropped_channel_chunk_is_caught():
    """N = 1, NCHW: the main kernel told C - BC channels (x's channel stride unused for image 0)
    skips the last chunk: past the bound."""
    v, p = FUSED[4], problem((1, 16, 14, 15, 40, 1))
    c_arg = 4
    bc = w21.FUSED_TILES[4].bc
    drop = with_main_args(v, "drop_chunk", lambda k: dataclasses.replace(
        k, args=k.args[:c_arg] + (np.int32(int(k.args[c_arg]) - bc),) + k.args[c_arg + 1:]))
    d = run_poisoned(drop, p)
    assert d["nonfinite"] == 0 and d["worst_err_over_bound"] > 1, d


def test_fused_refuses_a_wrong_dtype_before_a_launch():
    q = problem((1, 3, 9, 9, 4, 1))
    xq, wq = q.make_inputs(device="cuda")
    with pytest.raises(TypeError, match="torch.float32"):
        run(FUSED[4], q, xq.double(), wq)
