"""Day 20 on the CPU (days/day20_winograd.py, kernels/conv2d/20_winograd.cu).

The transforms: built exactly from the points, the 1-D identity proved on a basis, the 2-D tile
against the direct sum in float64, the rounding bound (with the transforms' constants) holding in
float32, the error growing with the tile, and integers exact only where the transforms are dyadic.

The GPU pipeline without a GPU: the kernels' constants generated from the exact transforms (and
read back as the kernel reads them); the four launches and their workspace; the models of what each
launch writes (U, V, M and y each written exactly once, with any grid of the grid-stride loops);
the whole run simulated with the kernels' index arithmetic against torch's conv2d in float64 (odd
sizes, N > 1, C in 1, 3, odd, padding 0, 1, 2, non-square, both layouts, F(2), F(4), F(6)) and in
float32 within the harness's Winograd bound (`winograd_model`), which `helpers.check` uses end to
end; refusals with their reasons; the kernel file compiled for sm_75 .. sm_120 without spills.
Planted faults (a wrong constant, a dropped transform position, a grid one position short) caught.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_launches_match_signatures

from days import day20_winograd as w20
from helpers import compile as hc
from helpers.problem import Conv2dProblem
from helpers.reference import compare, rel_l2_limit
from helpers.suites import edge, resnet50
from helpers.variants import Buffer, LaunchConfig, get


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 8])
def test_the_identity_holds_exactly(m):
    w = w20.winograd(m)
    assert (len(w.at), len(w.at[0]), len(w.g), len(w.g[0]), len(w.bt)) == (m, w.n, w.n, 3, w.n)
    assert w20.check_identity(w)


def test_a_planted_transform_fault_is_caught():
    w = w20.winograd(4)
    bt = [list(row) for row in w.bt]
    bt[2][3] += Fraction(1, 2)
    bad = dataclasses.replace(w, bt=tuple(map(tuple, bt)))
    assert not w20.check_identity(bad)
    rng = np.random.default_rng(0)
    d, g = rng.standard_normal((3, w.n, w.n)), rng.standard_normal((3, 3, 3))
    assert np.abs(w20.correlate_tile(d, g, bad) - w20.direct_tile(d, g, 4)).max() > 1e-3


def test_f23_is_the_textbook_algorithm_up_to_signs():
    """Lavin and Gray's F(2, 3) has Aᵀ = [[1, 1, 1, 0], [0, 1, -1, -1]], G rows (1, 0, 0), (1/2, 1/2, 1/2),
    (1/2, -1/2, 1/2), (0, 0, 1): the same points (0, 1, -1, infinity); ours differ by the signs of a row
    of G and a column of Aᵀ (and Bᵀ's rows with them), which cancel."""
    w = w20.winograd(2)
    at, g, _ = w.arrays()
    assert np.array_equal(np.abs(at), [[1, 1, 1, 0], [0, 1, 1, 1]])
    assert np.array_equal(np.abs(g), [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5], [0, 0, 1]])
    assert w.multiplications_saved() == 2.25
    assert w20.winograd(4).multiplications_saved() == 4.0 and w20.winograd(6).multiplications_saved() == 324 / 64


@pytest.mark.parametrize("m", [2, 4, 6])
@pytest.mark.parametrize("channels", [1, 3, 7, 64])
def test_the_tile_equals_the_direct_sum_in_float64(m, channels):
    w = w20.winograd(m)
    rng = np.random.default_rng(m * 100 + channels)
    d, g = rng.standard_normal((channels, w.n, w.n)), rng.standard_normal((channels, 3, 3))
    ref = w20.direct_tile(d, g, m)
    assert np.abs(w20.correlate_tile(d, g, w) - ref).max() <= 1e-12 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("m", [2, 4, 6])
@pytest.mark.parametrize("kind", ["normal", "int", "wide"])
def test_float32_stays_within_the_bound(m, kind):
    w = w20.winograd(m)
    rng = np.random.default_rng(m)
    c = 64
    if kind == "int":
        d, g = rng.integers(-8, 9, (c, w.n, w.n)), rng.integers(-8, 9, (c, 3, 3))
    elif kind == "wide":  # magnitudes over six orders: the bound must follow the largest terms
        d = rng.standard_normal((c, w.n, w.n)) * 10.0 ** rng.integers(-3, 4, (c, w.n, w.n))
        g = rng.standard_normal((c, 3, 3))
    else:
        d, g = rng.standard_normal((c, w.n, w.n)), rng.standard_normal((c, 3, 3))
    err = np.abs(w20.correlate_tile(d, g, w, np.float32).astype(np.float64) - w20.direct_tile(d, g, m))
    assert (err <= w20.error_bound(d, g, w)).all()


def test_a_bound_that_ignores_the_transforms_is_broken_by_f63():
    """The bound needs the transforms' magnitudes: the direct algorithm's bound, γ_{C·R·S} times
    the direct terms' magnitudes, is exceeded by F(6, 3) in float32 on one channel (where the
    transforms' rounding is not averaged over a channel sum)."""
    w = w20.winograd(6)
    rng = np.random.default_rng(1)
    broke = False
    for _ in range(20):
        d, g = rng.standard_normal((1, w.n, w.n)), rng.standard_normal((1, 3, 3))
        err = np.abs(w20.correlate_tile(d, g, w, np.float32).astype(np.float64) - w20.direct_tile(d, g, 6))
        direct_terms = w20.direct_tile(np.abs(d), np.abs(g), 6)
        broke |= bool((err > 9 * w20.FLOAT32_U * direct_terms).any())  # C·R·S = 9 terms
        assert (err <= w20.error_bound(d, g, w)).all()
    assert broke


def test_the_error_grows_with_the_tile():
    """Median float32 error over 50 random tiles of 64 channels: F(2, 3) < F(4, 3) < F(6, 3)."""
    rng = np.random.default_rng(2)
    med = {}
    for m in (2, 4, 6):
        w = w20.winograd(m)
        errs = []
        for _ in range(50):
            d, g = rng.standard_normal((64, w.n, w.n)), rng.standard_normal((64, 3, 3))
            y = w20.correlate_tile(d, g, w, np.float32).astype(np.float64)
            errs.append(np.abs(y - w20.direct_tile(d, g, m)).max())
        med[m] = float(np.median(errs))
    assert med[2] < med[4] < med[6], med


def test_integers_are_exact_only_through_dyadic_transforms():
    rng = np.random.default_rng(3)
    assert w20.exact_on_integers(w20.winograd(2))
    assert not w20.exact_on_integers(w20.winograd(4)) and not w20.exact_on_integers(w20.winograd(6))
    w = w20.winograd(2)
    for _ in range(20):
        d, g = rng.integers(-8, 9, (16, 4, 4)), rng.integers(-8, 9, (16, 3, 3))
        assert np.array_equal(w20.correlate_tile(d, g, w, np.float32), w20.direct_tile(d, g, 2))
    w = w20.winograd(4)
    inexact = 0
    for _ in range(20):
        d, g = rng.integers(-8, 9, (16, 6, 6)), rng.integers(-8, 9, (16, 3, 3))
        inexact += not np.array_equal(w20.correlate_tile(d, g, w, np.float32), w20.direct_tile(d, g, 4))
    assert inexact > 0


def test_points_are_refused_with_reasons():
    with pytest.raises(ValueError, match="at least 1"):
        w20.points_for(0)
    with pytest.raises(ValueError, match="finite points"):
        w20.points_for(20)
    with pytest.raises(ValueError, match="repeated interpolation points"):
        w20.g_transform(3, (Fraction(0), Fraction(1), Fraction(1)))



# ==============================================================================================
# The GPU pipeline, on the CPU
# =====================================================================================================

F2, F4 = get("winograd_f2"), get("winograd_f4")
LAYOUTS = ("NCHW", "NHWC")
# (N, C, H, W, K, padding): odd sizes that divide no tile, N > 1, C in 1, 3 and odd, padding 0, 1
# and 2, non-square images and padding, an image smaller than a tile, one pixel, C past Cp's 8.
SHAPES = [
    (2, 3, 7, 9, 5, 1),
    (1, 1, 5, 4, 2, 2),
    (3, 9, 11, 6, 7, 0),
    (1, 2, 1, 1, 3, 1),
    (2, 5, 13, 10, 4, (2, 0)),
    (1, 17, 6, 15, 9, (0, 1)),
]


def problem(spec, layout: str = "NCHW") -> Conv2dProblem:
    n, c, h, w, k, pad = spec
    return Conv2dProblem(N=n, C=c, H=h, W=w, K=k, R=3, S=3, padding=pad, layout=layout)


def torch_reference(p: Conv2dProblem, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.conv2d(p.to_logical(x).double(), p.w_to_kcrs(w).double(), padding=p.padding)


# ---- the constants --------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [2, 4, 6])
def test_the_kernel_constants_are_the_exact_transforms_rounded_once(m):
    """The -D defines read back as the kernel reads them are each transform entry's nearest float32,
    and hold no comma (nvcc splits a -D value there)."""
    defines = w20.kernel_defines(m)
    assert defines["WINO_M"] == m and not any("," in str(v) for v in defines.values())
    w = w20.winograd(m)
    for got, exact in zip(w20.parse_defines(defines), (w.at, w.g, w.bt)):
        assert got.shape == (len(exact), len(exact[0]))
        for gv, ev in zip(got.ravel(), (v for row in exact for v in row)):
            assert gv == w20.float32_nearest(ev)
            assert abs(Fraction(float(gv)) - ev) <= abs(ev) * Fraction(1, 2**24)  # one rounding of float32
    for got, want in zip(w20.parse_defines(defines), w20.constants_f32(w)):
        assert np.array_equal(got, want)


def test_float32_nearest_rounds_once_where_float64_rounds_twice():
    """1 + 2^-24 + 2^-60 is past the midpoint of 1 and 1 + 2^-23: its nearest float32 is 1 + 2^-23;
    through float64 (1 + 2^-24, a tie) it would round to 1.0."""
    v = 1 + Fraction(1, 2**24) + Fraction(1, 2**60)
    assert np.float32(float(v)) == np.float32(1.0)
    assert w20.float32_nearest(v) == np.float32(1 + 2**-23)
    assert w20.float32_nearest(Fraction(1, 2) + Fraction(1, 2**25)) == np.float32(0.5)  # a tie: to even


def test_a_wrong_constant_in_the_defines_is_caught():
    defines = dict(w20.kernel_defines(4))
    defines["WINO_BT"] = defines["WINO_BT"].replace("WINO_E(-5.0f)", "WINO_E(-4.0f)", 1)
    at, g, bt = w20.parse_defines(defines)
    bad = dataclasses.replace(w20.winograd(4), bt=tuple(tuple(Fraction(float(v)) for v in row) for row in bt))
    assert not w20.check_identity(bad)


# ---- the launches and the workspace ---------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
def test_four_launches_over_one_workspace(m, layout):
    p = problem((2, 5, 13, 10, 4, 1), layout)
    v = w20.WINOGRAD[m]
    plan = v.plan(p)
    g = w20.Geometry.of(p, m)
    ks = plan.launches
    lay = layout.lower()
    assert [k.name for k in ks] == ["filter", "input", "gemm", "output"]
    assert [k.entry for k in ks] == [f"wino_filter_{lay}", f"wino_input_{lay}", f"wino_gemm_{plan.config.name}",
                                     f"wino_output_{lay}"]
    assert plan.workspace_bytes == g.workspace_bytes
    offs = {part: g.offset(part) for part in ("U", "V", "M")}
    assert all(o % w20.WORKSPACE_ALIGN == 0 for o in offs.values())
    assert offs["U"] == 0 < offs["U"] + 4 * g.elements("U") <= offs["V"] < offs["V"] + 4 * g.elements("V") <= offs["M"]
    bufs = [[a for a in k.args if isinstance(a, Buffer)] for k in ks]
    assert bufs[0] == [Buffer("w"), Buffer("workspace", offs["U"])]
    assert bufs[1] == [Buffer("x"), Buffer("workspace", offs["V"])]
    a, b = ("U", "V") if layout == "NCHW" else ("V", "U")
    assert bufs[2] == [Buffer("workspace", offs[a]), Buffer("workspace", offs[b]), Buffer("workspace", offs["M"])]
    assert bufs[3] == [Buffer("workspace", offs["M"]), Buffer("y")]
    mg, ng, kg = (int(x) for x in ks[2].args[3:6])
    assert (mg, ng, kg) == g.gemm and kg % w20.GEMM_BK == 0 and ng % 4 == 0
    assert int(ks[2].args[6]) == (layout == "NCHW") and ks[2].config.grid[2] == g.positions
    assert all(type(x) is np.int32 for k in ks for x in k.args if not isinstance(x, Buffer))
    assert v.defines == w20.kernel_defines(m) and v.layouts == LAYOUTS and v.dtypes == ("fp32",)


def test_the_resnet50_3x3_layers_are_claimed_with_their_workspace():
    """The four 3 x 3 stride-1 layers at N = 32 and 256 in both layouts: claimed, each workspace
    well under the limit (at most 1.6 GiB: F(2) at N = 256 on the 56 x 56 layer)."""
    layers = [p for p in resnet50() if p.R == 3 and p.stride == (1, 1)]
    assert len(layers) == 8
    for p in layers:
        for layout in LAYOUTS:
            q = dataclasses.replace(p, layout=layout, name="")
            for v in w20.WINOGRAD.values():
                assert v.supports(q) is None, (v.name, q.name, v.supports(q))
                nbytes = v.workspace_bytes(q)
                assert nbytes <= 1.6 * 2**30, (v.name, q.name, nbytes)
    big = dataclasses.replace(layers[4], layout="NCHW", name="")  # N256 C64 56x56
    assert F2.workspace_bytes(big) == 2 * 16 * 64 * 200704 * 4 + 16 * 64 * 64 * 4  # U + V + M, all aligned
    assert F4.workspace_bytes(big) == w20.aligned(36 * 64 * 64 * 4) + 2 * 36 * 64 * 50176 * 4


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_tile_rule(layout):
    """128 x 128 where K > 64 and blocks are many; K = 64 takes a 64-filter side; a small problem
    halves the tiles' side."""
    layers = [dataclasses.replace(p, layout=layout, name="") for p in resnet50() if p.R == 3 and p.stride == (1, 1)]
    for p in layers:
        cfg = w20.default_tile(p, 4)
        fside, tside = (cfg.bm, cfg.bn) if layout == "NCHW" else (cfg.bn, cfg.bm)
        assert fside == (64 if p.K == 64 else 128) or w20.gemm_blocks(w20.Geometry.of(p, 4), cfg) >= w20.MIN_GEMM_BLOCKS
        assert w20.gemm_blocks(w20.Geometry.of(p, 4), cfg) >= w20.MIN_GEMM_BLOCKS
    tiny = problem((1, 3, 8, 8, 4, 1), layout)
    assert w20.default_tile(tiny, 4) == w20.WinoConfig(64, 64)
    with pytest.raises(ValueError, match="no wino_gemm entry"):
        w20.WinoConfig(32, 64)


# ---- refusals -------------------------------------------------------------------------------------


REFUSED = [
    (dict(N=1, C=3, H=9, W=9, K=4, R=3, S=3, padding=1, stride=2), "needs stride 1"),
    (dict(N=1, C=3, H=9, W=9, K=4, R=3, S=3, padding=2, dilation=2), "needs dilation 1"),
    (dict(N=1, C=3, H=9, W=9, K=4, R=5, S=5, padding=2), "3 x 3 filter; got 5 x 5"),
    (dict(N=1, C=3, H=9, W=9, K=4, R=3, S=1, padding=(1, 0)), "3 x 3 filter; got 3 x 1"),
    (dict(N=1, C=4, H=9, W=9, K=4, R=3, S=3, padding=1, groups=2), "needs groups = 1"),
    (dict(N=1, C=1, H=32800, W=32800, K=1, R=3, S=3, padding=1), "of workspace"),  # the edge suite's 2^31 problem
    (dict(N=2**30, C=1, H=5, W=5, K=1, R=3, S=3, padding=1), "int32"),
    (dict(N=1, C=1, H=6000, W=6000, K=1, R=3, S=3, padding=1), "grid y"),
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("spec, words", REFUSED)
def test_refusals_say_why(spec, words, layout):
    p = Conv2dProblem(**spec, layout=layout)
    if words == "grid y" and layout == "NHWC":  # BM = 128 tiles a block along T on y: 9M tiles / 128 > 65,535
        assert w20.default_tile(p, 2).bm == 128
    reason = F2.supports(p, smem_limit=2**31)
    assert reason is not None and reason.startswith("winograd_f2: ") and words in reason, reason


def test_the_workspace_refusal_says_how_much():
    p = Conv2dProblem(N=2, C=1, H=32800, W=32800, K=1, R=3, S=3, padding=1)
    reason = F4.supports(p)
    g = w20.Geometry.of(p, 4)
    assert f"needs {g.workspace_bytes} bytes" in reason and "the limit is 8.00 GiB" in reason
    assert "U " in reason and "V " in reason and "M " in reason
    assert w20.workspace_reason(g, limit=g.workspace_bytes) is None  # exactly at the limit: taken


def test_bad_input_is_refused_before_any_gpu_use(monkeypatch):
    """Shape first (stride 2), then the tensors (dtype, shape, device): all before a GPU call."""
    from helpers import gpu
    from helpers.launch import prepare
    from helpers.variants import UnsupportedProblem

    def touched(*a, **k):
        raise AssertionError("the GPU was touched before the input was validated")

    monkeypatch.setattr(gpu, "device_info", touched)
    monkeypatch.setattr(gpu, "init", touched)
    p = Conv2dProblem(N=1, C=3, H=9, W=9, K=4, R=3, S=3, padding=1, stride=2)
    with pytest.raises(UnsupportedProblem, match="needs stride 1"):
        prepare(F4, p, *p.make_inputs())
    p = problem((1, 3, 9, 9, 4, 1))
    x, w = p.make_inputs()
    with pytest.raises(TypeError, match="x must be torch.float32"):
        prepare(F4, p, x.double(), w)
    with pytest.raises(ValueError, match="w must have shape"):
        prepare(F4, p, x, w[:, :2])
    with pytest.raises(ValueError, match="x is on cpu"):
        prepare(F4, p, x, w)


# ---- models of each launch's writes -----------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("spec", SHAPES, ids=str)
def test_every_output_and_workspace_element_is_written_once(spec, m, layout):
    p = problem(spec, layout)
    v = w20.WINOGRAD[m]
    plan = v.plan(p)
    assert plan.refusal() is None
    y = plan.covers()
    assert y.shape == (p.y_numel,) and (y == 1).all()
    ws = w20.workspace_writes(p, m, plan.config, list(plan.launches))
    g = w20.Geometry.of(p, m)
    for part in ("U", "V", "M"):
        start = g.offset(part) // 4
        assert (ws[start:start + g.elements(part)] == 1).all(), part
    assert ws.sum() == sum(g.elements(part) for part in ("U", "V", "M"))  # the gaps: never written


@pytest.mark.parametrize("layout", LAYOUTS)
def test_grid_stride_loops_cover_everything_with_any_grid(layout):
    """One block, one thread short of the elements, or more threads than elements: once each."""
    p = problem((2, 5, 13, 10, 4, 1), layout)
    g = w20.Geometry.of(p, 4)
    for step in ("filter", "input", "output"):
        total = w20.transform_elements(g, step)
        for blocks in (1, max(1, total // 256), total):
            cfg = LaunchConfig(grid=(blocks, 1, 1), block=(256, 1, 1))
            writes = w20.output_writes(p, 4, cfg) if step == "output" else w20.transform_writes(p, 4, step, cfg)
            assert (writes == 1).all(), (step, blocks)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_gemm_grid_one_position_short_leaves_that_position_unwritten(layout):
    p = problem((2, 5, 13, 10, 70, 1), layout)
    cfg = w20.default_tile(p, 2)
    g = w20.Geometry.of(p, 2)
    full = w20.gemm_launch(g, cfg)
    short = dataclasses.replace(full, grid=(full.grid[0], full.grid[1], full.grid[2] - 1))
    writes = w20.gemm_writes_model(p, 2, cfg, short).reshape(g.positions, -1)
    assert (writes[:-1] == 1).all() and (writes[-1] == 0).all()
    tiles_short = dataclasses.replace(full, grid=(full.grid[0], full.grid[1] - 1, full.grid[2]))
    assert (w20.gemm_writes_model(p, 2, cfg, tiles_short) == 0).any()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("tile", w20.GEMM_TILES, ids=lambda t: f"{t[0]}x{t[1]}")
def test_the_gemm_blocks_thread_by_thread_compute_the_product(tile, layout):
    """`gemm_blocks_model` (each thread's loads, the shared stages, its accumulators and stores) on a
    GEMM position of a problem whose Mg and Ng divide no tile: A·B, each element stored once."""
    p = problem((1, 13, 19, 22, 70, 1), layout)  # NCHW: Mg = K = 70; NHWC: Mg = T = 66 (F(4)), Ng = Kp = 72
    cfg = w20.WinoConfig(*tile)
    g = w20.Geometry.of(p, 4)
    mg, ng, kg = g.gemm
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((mg, kg)), rng.standard_normal((kg, ng))
    out, stores = w20.gemm_blocks_model(a, b, cfg, w20.gemm_launch(g, cfg), g.nchw)
    assert (stores == 1).all()
    np.testing.assert_allclose(out, a @ b, rtol=1e-12, atol=1e-12)
    assert np.array_equal(stores.ravel(), w20.gemm_writes_model(p, 4, cfg)[: mg * ng])


def test_every_launch_matches_its_entrys_signature():
    """Each launch passes as many arguments as its ``extern "C"`` entry declares, pointers where
    it takes pointers (`Buffer`) and ints where it takes ints, read from the kernel file."""
    import re

    src = hc.kernel_path(w20.CU_FILE).read_text()
    sigs = {m[0]: [a.strip() for a in m[1].split(",")]
            for m in re.findall(r"\b(wino_\w+)\(((?:const )?float\*[^)]*)\)\s*\{", src)}
    for bm, bn in w20.GEMM_TILES:  # the GEMM's entries come from one macro
        sigs[f"wino_gemm_{bm}x{bn}"] = ["const float* A", "const float* B", "float* Cm", "int Mg", "int Ng",
                                        "int Kg", "int m_on_x"]
    assert re.search(r"wino_gemm_##BM##x##BN\(const float\* __restrict__ A, const float\* __restrict__ B, "
                     r"float\* __restrict__ Cm,\s*\\\s*int Mg, int Ng, int Kg, int m_on_x\)", src)
    probs = [problem((2, 5, 13, 10, 4, 1), lay) for lay in LAYOUTS]
    assert_launches_match_signatures(sigs, w20.WINOGRAD.values(), probs)


# ---- the whole pipeline, simulated ------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4, 6])
@pytest.mark.parametrize("spec", SHAPES, ids=str)
def test_the_simulated_pipeline_is_the_convolution_in_float64(spec, m, layout):
    """The four kernels' index arithmetic (filter, input, GEMM, output) in float64 against torch's
    conv2d: equal to rounding (1e-12 of the |x|·|w| scale); the workspace read nowhere unwritten."""
    p = problem(spec, layout)
    x, w = p.make_inputs(seed=sum(spec[:5]))
    y, ws = w20.simulate(p, x.numpy(), w.numpy(), m)
    ref = torch_reference(p, x, w)
    scale = F.conv2d(p.to_logical(x).double().abs(), p.w_to_kcrs(w).double().abs(), padding=p.padding)
    err = (p.to_logical(torch.from_numpy(y)) - ref).abs()
    assert not np.isnan(y).any()
    assert bool((err <= 1e-12 * (scale + 1)).all()), float(err.max())
    written = w20.workspace_writes(p, m, w20.default_tile(p, m)) > 0
    assert np.array_equal(~np.isnan(ws), written)  # every written element finite; only the gaps NaN


@pytest.mark.parametrize("m", [2, 4])
def test_batched_images_are_the_single_image_runs(m):
    """Each image of a batch comes out as it does alone: to float32 rounding, not bit for bit, since
    numpy's BLAS may block the batched GEMM (more tile columns) differently from one image's (seen
    with numpy 2.4.6's OpenBLAS 0.3.31: a few elements 1 ulp apart). A tile or channel taken from
    the wrong image moves an output by O(1), a million times the tolerance."""
    p = problem((3, 5, 9, 7, 6, 1), "NHWC")
    x, w = p.make_inputs(seed=5)
    y, _ = w20.simulate(p, x.numpy(), w.numpy(), m, np.float32)
    p1 = dataclasses.replace(p, N=1, name="")
    for n in range(p.N):
        y1, _ = w20.simulate(p1, x[n:n + 1].numpy(), w.numpy(), m, np.float32)
        np.testing.assert_allclose(y[n:n + 1], y1, rtol=0, atol=1e-5)
        assert not np.allclose(y[(n + 1) % p.N:(n + 1) % p.N + 1], y1, rtol=0, atol=1e-2)  # another image differs


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4, 6])
def test_float32_runs_stay_within_the_harness_bound(m, layout):
    """The float32 simulation (each product and sum rounded apart: more roundings than the kernels'
    FMAs) against the float64 reference with `winograd_model`: under the element bound, the
    relative L2 error far under the harness's limit; the direct algorithm's bound is too tight for
    F(6) (`compare` without the model)."""
    p = problem((2, 64, 13, 10, 8, 1), layout)
    x, w = p.make_inputs(seed=3)
    y, _ = w20.simulate(p, x.numpy(), w.numpy(), m, np.float32)
    r = compare(p, x, w, torch.from_numpy(y), model=w20.winograd_model(m))
    assert r["nonfinite"] == 0 and r["worst_err_over_bound"] <= 1, r
    assert r["rel_l2"] <= rel_l2_limit(p) / 10, r


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_dot_products_bound_cannot_judge_f4(layout):
    """Why the variant brings its own bound: zero input columns 4..6 make the exact outputs of
    column 5 zero, and the direct bound there only the underflow floor; F(4)'s tile over columns
    4..7 still reads columns 3..8, whose rounding residue lands on column 5, far past that floor,
    inside `winograd_model`'s bound. (F(2)'s dyadic transforms leave such outputs exactly 0.)"""
    p = problem((1, 16, 12, 12, 4, 1), layout)
    x4, w4 = problem((1, 16, 12, 12, 4, 1)).make_inputs(seed=1)
    x4[:, :, :, 4:7] = 0
    x, w = p.from_logical(x4), p.from_logical(w4)
    y, _ = w20.simulate(p, x.numpy(), w.numpy(), 4, np.float32)
    assert float(p.to_logical(torch.from_numpy(y))[..., 5].abs().max()) > 0
    assert compare(p, x, w, torch.from_numpy(y))["worst_err_over_bound"] > 1e30
    assert compare(p, x, w, torch.from_numpy(y), model=w20.winograd_model(4))["worst_err_over_bound"] <= 1


def test_the_bound_scale_is_error_bound_on_every_tile():
    """`winograd_scale` (what the harness multiplies by γ_k) equals `error_bound` / γ_k computed tile
    by tile from the padded input, for outputs at every offset in their tile, cut into bands that
    split tiles."""
    m = 4
    p = problem((2, 3, 11, 9, 2, 1))
    x, w = p.make_inputs(seed=9)
    x4, w4 = x.double(), w.double()
    wd = w20.winograd(m)
    k = w20.rounding_depth(wd, p.C)
    gamma = k * w20.FLOAT32_U / (1 - k * w20.FLOAT32_U)
    full = w20.winograd_scale(p, x4, w4, 0, p.N, 0, p.P, m)
    xp = F.pad(x4, (1, 1 + m, 1, 1 + m))  # the padding, then zeros past the last partial tile
    for n in range(p.N):
        for kk in range(p.K):
            for th in range(w20.cdiv(p.P, m)):
                for tw in range(w20.cdiv(p.Q, m)):
                    d = xp[n, :, th * m:th * m + wd.n, tw * m:tw * m + wd.n].numpy()
                    want = w20.error_bound(d, w4[kk].numpy(), wd) / gamma
                    got = full[n, kk, th * m:th * m + m, tw * m:tw * m + m].numpy()
                    np.testing.assert_allclose(got, want[: got.shape[0], : got.shape[1]], rtol=1e-12)
    bands = torch.cat([w20.winograd_scale(p, x4, w4, 0, p.N, r0, r1, m) for r0, r1 in ((0, 3), (3, 6), (6, 11))], 2)
    assert torch.allclose(bands, full, rtol=1e-14, atol=0)


@pytest.mark.parametrize("m", [2, 4])
def test_a_dropped_transform_position_breaks_the_bound(m):
    p = problem((2, 8, 9, 10, 4, 1), "NHWC")
    x, w = p.make_inputs(seed=4)
    y, _ = w20.simulate(p, x.numpy(), w.numpy(), m, np.float32, drop_position=w20.winograd(m).n + 1)
    r = compare(p, x, w, torch.from_numpy(y), model=w20.winograd_model(m))
    assert r["worst_err_over_bound"] > 10 and r["rel_l2"] > rel_l2_limit(p), r


@pytest.mark.parametrize("m", [2, 4])
def test_integer_inputs_exact_through_f2_only(m):
    p = problem((2, 45, 9, 10, 4, 1))
    x, w = p.make_inputs(kind="int")
    y, _ = w20.simulate(p, x.numpy(), w.numpy(), m, np.float32)
    r = compare(p, x, w, torch.from_numpy(y), exact=True, model=w20.winograd_model(m))
    assert r["worst_err_over_bound"] <= 1
    assert w20.integers_exact(p, m) == (m == 2) and r["exact_equal"] == (m == 2), r


def test_integer_exactness_has_a_channel_limit():
    """F(2, 3)'s integer run is exact while the largest intermediate, 486·C units of 1/4 (inputs in
    [-3, 3] and [-2, 2]), stays under 2^24: up to C = 8,630."""
    peak, den = w20.integer_peak(w20.winograd(2), 1, 3, 2)
    assert (peak, den) == (486, 4)
    ok = problem((1, 8630, 4, 4, 1, 1))
    past = problem((1, 8631, 4, 4, 1, 1))
    assert ok.int_ranges == past.int_ranges == (3, 2)
    assert w20.integers_exact(ok, 2) and not w20.integers_exact(past, 2)
    assert not w20.winograd_model(2).exact_on_integers(past) and not w20.winograd_model(4).exact_on_integers(ok)


def test_compare_refuses_a_model_with_a_precomputed_expected_or_another_op():
    p = problem((1, 2, 5, 5, 2, 1))
    x, w = p.make_inputs()
    y = torch.zeros(p.y_shape)
    with pytest.raises(ValueError, match="error model"):
        compare(p, x, w, y, expected=(y, y), model=w20.winograd_model(2))
    q = dataclasses.replace(p, op="dgrad", name="")
    dy, w = q.make_inputs()
    with pytest.raises(ValueError, match="error model"):
        compare(q, dy, w, torch.zeros(q.x_shape), model=w20.winograd_model(2))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fused", [False, True], ids=["pipeline", "fused"])
def test_the_harness_check_judges_the_kernels_by_their_model(simulated_gpu, fused, layout):
    """`check` (normal and int, a repeat compared bitwise) passes both variants, pipeline and
    fused, with their own bound: F(2) bit-exact on integers, F(4) not required to be (its
    ``exact`` is None); the cancelling inputs pass too."""
    check = simulated_gpu
    f2, f4 = (get("winograd_f2_fused"), get("winograd_f4_fused")) if fused else (F2, F4)
    p = problem((2, 6, 9, 7, 5, 1), layout)
    r2 = check(f2, p, device="cpu")
    assert r2.ok and r2.kind == "normal+int" and r2.exact is True, r2
    r4 = check(f4, p, device="cpu")
    assert r4.ok and r4.exact is None, r4
    assert check(f4, p, kind="cancel", device="cpu").ok


def test_the_harness_catches_a_dropped_position(simulated_gpu, monkeypatch):
    check = simulated_gpu
    real = w20.simulate
    monkeypatch.setattr(w20, "simulate", lambda *a, **k: real(*a, **k, drop_position=3))
    r = check(F4, problem((1, 6, 9, 7, 5, 1)), kind="normal", device="cpu")
    assert not r.ok and "rounding bound" in r.reason and "relative L2" in r.reason, r


def test_the_edge_suite_3x3_problems_are_claimed_but_the_huge_one():
    claimed = [p.name for p in edge() if F4.supports(p) is None]
    assert {"N1 C1 600000x3 K2 3x3 s1 p1", "N1 C1 8x8 K70000 3x3 s1 p1", "N1 C45 19x21 K33 3x3 s1 p1"} <= set(claimed)
    assert "N2 C1 32800x32800 K1 3x3 s1 p1" not in claimed  # 2^31 elements: its workspace is refused
    assert len(claimed) == 9, claimed
    assert all(F2.supports(p) is not None for p in edge() if p.R != 3 or p.S != 3 or p.stride != (1, 1))


# ---- the kernel file compiles everywhere, without spills ----------------------------------------------

ENTRIES = {"wino_filter_nchw", "wino_filter_nhwc", "wino_input_nchw", "wino_input_nhwc", "wino_output_nchw",
           "wino_output_nhwc", *(f"wino_gemm_{bm}x{bn}" for bm, bn in w20.GEMM_TILES)}


@pytest.mark.nvcc
@pytest.mark.parametrize("m", [2, 4, 6])
@pytest.mark.parametrize("arch", hc.ARCHS)
def test_the_kernels_compile_for_every_arch_without_spills(arch, m):
    reports, log = hc.nvcc_compile(w20.CU_FILE, arch=arch, defines=w20.kernel_defines(m))
    by = {r.entry: r for r in reports}
    assert set(by) == ENTRIES, log
    for r in reports:
        assert (r.spill_stores, r.spill_loads, r.stack_bytes) == (0, 0, 0), r
        assert 0 < r.registers <= (255 if r.entry == "wino_gemm_128x128" else 128), r  # launch bounds (256, 2)
    assert by["wino_gemm_128x128"].shared_bytes == 2 * 8 * (128 + 4 + 128) * 4


@pytest.mark.nvcc
def test_the_kernel_refuses_to_build_without_its_constants():
    with pytest.raises(RuntimeError, match="WINO_M"):
        hc.nvcc_compile(w20.CU_FILE, arch="sm_90")


def test_integer_dtypes_and_an_undefined_bound_are_refused():
    w = w20.winograd(2)
    d, g = np.ones((1, 4, 4)), np.ones((1, 3, 3))
    with pytest.raises(TypeError, match="floating type"):
        w20.correlate_tile(d, g, w, np.int64)  # would truncate G's halves to 0
    bf16_u = 2.0**-8
    with pytest.raises(ValueError, match="k u = .* >= 1"):
        w20.error_bound(np.ones((255, 4, 4)), np.ones((255, 3, 3)), w, u=bf16_u)
