"""Day 21's fused kernel on the CPU (days/day21_winograd_fused.py, kernels/conv2d/21_winograd_fused.cu).

* the simulation of the fused kernels (`simulate_fused`: the filter launch into the blocked U, then
  each block's column jobs, row jobs, U chunk, GEMM channel by channel and epilogue pieces, with
  the kernels' index arithmetic and padded shared pitches, NaN where nothing wrote) against torch's
  conv2d in float64 (P, Q not multiples of m, C not a multiple of BC, K not a multiple of BK, N > 1,
  padding 0, 1, 2 and non-square, both layouts), and in float32 within day 20's `winograd_model`;
  a batch bit-identical to its images run alone; integers exact through F(2) only;
* the write-coverage model (`fused_output_writes`, the variants' ``covers_fn``): every y element
  written once, edge tiles included; a grid one block short leaves outputs unwritten;
* planted faults caught: a channel chunk dropped, a transform position dropped, an edge tile
  misplaced: each breaks the check (the check can fail);
* the launches, the blocked U workspace and the entries' signatures; refusals with reasons;
  `helpers.check.check` judging the simulation by the model;
* the kernel file compiled for sm_75 .. sm_120: at most 128 registers at 256 threads, no spills,
  static shared memory as `FusedConfig.smem_bytes`, under 48 KB.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_launches_match_signatures

from days import day20_winograd as w20
from days import day21_winograd_fused as w21
from helpers import compile as hc
from helpers.problem import Conv2dProblem
from helpers.reference import compare, rel_l2_limit
from helpers.suites import edge, resnet50
from helpers.variants import MAX_GRID, Buffer, LaunchConfig, get

F2F, F4F = get("winograd_f2_fused"), get("winograd_f4_fused")
FUSED = {2: F2F, 4: F4F}
LAYOUTS = ("NCHW", "NHWC")
# (N, C, H, W, K, padding): P, Q divide no tile; C past BC (8 for F(2), 4 for F(4)) and not a
# multiple; K past BK = 32 and not a multiple; more tiles than BT (several tile blocks); N > 1;
# padding 0, 1, 2, non-square; an image smaller than a tile; one pixel.
SHAPES = [
    (2, 3, 7, 9, 5, 1),
    (3, 9, 11, 6, 37, 0),
    (2, 13, 13, 10, 40, (2, 0)),
    (1, 1, 5, 4, 2, 2),
    (2, 10, 23, 17, 33, (0, 1)),
    (1, 2, 1, 1, 3, 1),
]


def problem(spec, layout: str = "NCHW") -> Conv2dProblem:
    n, c, h, w, k, pad = spec
    return Conv2dProblem(N=n, C=c, H=h, W=w, K=k, R=3, S=3, padding=pad, layout=layout)


def torch_reference(p: Conv2dProblem, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.conv2d(p.to_logical(x).double(), p.w_to_kcrs(w).double(), padding=p.padding)


def judged(p: Conv2dProblem, x: torch.Tensor, w: torch.Tensor, y: np.ndarray, m: int) -> dict:
    return compare(p, x, w, torch.from_numpy(np.ascontiguousarray(y)), model=w20.winograd_model(m))


# ---- the tile ---------------------------------------------------------------------------------------


def test_the_block_tiles():
    """F(2): 32 tiles x 32 filters, 8 channels a step, 4 x 4 register tiles over 4 positions: 64
    accumulators; F(4): 16 x 32, 4 channels, 2 x 4 over 9 positions: 72; both under 48 KB."""
    c2, c4 = w21.FUSED_TILES[2], w21.FUSED_TILES[4]
    assert (c2.bt, c2.bk, c2.bc, c2.tt, c2.tk, c2.pg, c2.np_, c2.accumulators) == (32, 32, 8, 4, 4, 4, 4, 64)
    assert (c4.bt, c4.bk, c4.bc, c4.tt, c4.tk, c4.pg, c4.np_, c4.accumulators) == (16, 32, 4, 2, 4, 4, 9, 72)
    assert (c2.smem_bytes, c4.smem_bytes) == (37376, 27648)
    for c in (c2, c4):
        assert c.tcs % 32 == c.n and c.tcs >= c.bt * c.trow
        assert w21.fused_defines(c) == {**w20.kernel_defines(c.m), "WINOF_BT": c.bt, "WINOF_BK": c.bk,
                                        "WINOF_BC": c.bc}
    with pytest.raises(ValueError, match="BT in 8, 16, 32"):
        w21.FusedConfig(4, 24, 32, 4)
    with pytest.raises(ValueError, match="shared memory"):
        w21.FusedConfig(4, 32, 64, 8)
    with pytest.raises(ValueError, match="position groups"):
        w21.FusedConfig(4, 32, 16, 4)  # 32 threads a position: 8 groups do not divide 36 positions


# ---- the launches ------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
def test_two_launches_and_the_blocked_u(m, layout):
    p = problem((2, 13, 13, 10, 40, 1), layout)
    v = FUSED[m]
    plan = v.plan(p)
    cfg = plan.config
    fg = w21.FusedGeometry.of(p, cfg)
    ks = plan.launches
    lay = layout.lower()
    assert [k.name for k in ks] == ["filter", "main"]
    assert [k.entry for k in ks] == [f"winof_filter_{lay}", f"winof_main_{lay}"]
    assert [k.source(v) for k in ks] == [w21.FUSED_CU_FILE] * 2
    assert plan.workspace_bytes == 4 * fg.kblocks * fg.chunks * cfg.npos * cfg.bc * cfg.bk
    assert [a for a in ks[0].args if isinstance(a, Buffer)] == [Buffer("w"), Buffer("workspace")]
    assert [a for a in ks[1].args if isinstance(a, Buffer)] == [Buffer("x"), Buffer("workspace"), Buffer("y")]
    assert ks[1].config == LaunchConfig(grid=(fg.tblocks * fg.kblocks, 1, 1), block=(256, 1, 1))
    assert fg.kblocks == 2 and fg.tblocks == w20.cdiv(2 * w20.cdiv(13, m) * w20.cdiv(10, m), cfg.bt)
    assert all(type(x) is np.int32 for k in ks for x in k.args if not isinstance(x, Buffer))
    assert v.error_model.name == w20.winograd_model(m).name and v.layouts == LAYOUTS and v.dtypes == ("fp32",)


def test_every_launch_matches_its_entrys_signature():
    src = hc.kernel_path(w21.FUSED_CU_FILE).read_text()
    sigs = {m[0]: [a.strip() for a in m[1].split(",")]
            for m in re.findall(r"\b(winof_filter_\w+)\(((?:const )?float\*[^)]*)\)\s*\{", src)}
    macro = re.search(r"NAME\((const float\* __restrict__ x,[^)]*)\)", src)
    main = [a.strip().rstrip("\\").strip() for a in macro[1].replace("\\\n", " ").split(",")]
    assert re.findall(r"WINOF_MAIN_ENTRY\((winof_main_\w+), ", src) == ["winof_main_nchw", "winof_main_nhwc"]
    sigs |= {"winof_main_nchw": main, "winof_main_nhwc": main}
    assert_launches_match_signatures(sigs, FUSED.values(), [problem((2, 5, 13, 10, 4, 1), lay) for lay in LAYOUTS])


def test_the_resnet50_3x3_layers_are_claimed_with_a_small_workspace():
    """The eight 3 x 3 stride-1 layers (N = 32 and 256), both layouts: claimed, the workspace U
    alone (n²·C·K floats: C and K are multiples of BC and BK), as large as the pipeline's U part."""
    layers = [p for p in resnet50() if p.R == 3 and p.stride == (1, 1)]
    assert len(layers) == 8
    for p in layers:
        for layout in LAYOUTS:
            q = dataclasses.replace(p, layout=layout, name="")
            for m, v in FUSED.items():
                assert v.supports(q) is None, (v.name, q.name, v.supports(q))
                assert v.workspace_bytes(q) == 4 * (m + 2) ** 2 * q.C * q.K  # C, K multiples of BC, BK
                assert v.workspace_bytes(q) == 4 * w20.Geometry.of(q, m).elements("U")


# ---- refusals ------------------------------------------------------------------------------------------

REFUSED = [
    (dict(N=1, C=3, H=9, W=9, K=4, R=3, S=3, padding=1, stride=2), "needs stride 1"),
    (dict(N=1, C=3, H=9, W=9, K=4, R=3, S=3, padding=2, dilation=2), "needs dilation 1"),
    (dict(N=1, C=3, H=9, W=9, K=4, R=5, S=5, padding=2), "3 x 3 filter; got 5 x 5"),
    (dict(N=1, C=3, H=9, W=9, K=4, R=3, S=1, padding=(1, 0)), "3 x 3 filter; got 3 x 1"),
    (dict(N=1, C=4, H=9, W=9, K=4, R=3, S=3, padding=1, groups=2), "needs groups = 1"),
    (dict(N=2**30, C=1, H=5, W=5, K=1, R=3, S=3, padding=1), "int32"),
    (dict(N=1, C=16384, H=4, W=4, K=16384, R=3, S=3, padding=1), "of workspace for the blocked U"),
    (dict(N=2**26, C=1, H=7, W=7, K=4128, R=3, S=3, padding=1), "on grid x"),
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("spec, words", REFUSED)
@pytest.mark.parametrize("m", [2, 4])
def test_refusals_say_why(m, spec, words, layout):
    p = Conv2dProblem(**spec, layout=layout)
    v = FUSED[m]
    reason = v.supports(p, smem_limit=2**31)
    assert reason is not None and reason.startswith(f"{v.name}: ") and words in reason, reason


def test_the_refusal_limits_are_tight():
    """The workspace at exactly the limit is taken, a float more refused; the grid at 2^31 − 1 blocks."""
    p = Conv2dProblem(N=1, C=64, H=8, W=8, K=64, R=3, S=3, padding=1)
    cfg = w21.FUSED_TILES[4]
    need = w21.FusedGeometry.of(p, cfg).workspace_bytes
    assert w21.fused_reason(p, cfg, limit=need) is None and "workspace" in w21.fused_reason(p, cfg, limit=need - 4)
    big = Conv2dProblem(N=2**26, C=1, H=7, W=7, K=4128, R=3, S=3, padding=1)
    fg = w21.FusedGeometry.of(big, w21.FUSED_TILES[2])
    assert fg.blocks > MAX_GRID[0] and f"needs {fg.blocks} blocks" in w21.fused_reason(big, w21.FUSED_TILES[2])


def test_the_edge_suite_3x3_problems_are_claimed():
    """Every 3 x 3 stride-1 problem of the edge suite, the 2^31-element one too: the fused kernel needs
    no workspace for V or M, and its offsets into x and y are 64-bit."""
    claimed = [p.name for p in edge() if F4F.supports(p) is None]
    assert {"N1 C1 600000x3 K2 3x3 s1 p1", "N1 C1 8x8 K70000 3x3 s1 p1", "N2 C1 32800x32800 K1 3x3 s1 p1"} <= set(
        claimed)
    assert set(claimed) >= {p.name for p in edge() if get("winograd_f4").supports(p) is None}
    assert all(F2F.supports(p) is not None for p in edge() if p.R != 3 or p.S != 3 or p.stride != (1, 1))


# ---- what the main kernel writes -------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("spec", SHAPES, ids=str)
def test_every_output_is_written_once(spec, m, layout):
    p = problem(spec, layout)
    plan = FUSED[m].plan(p)
    assert plan.refusal() is None
    counts = plan.covers()
    assert counts.shape == (p.y_numel,) and (counts == 1).all()
    assert (w21.block_pair_writes(plan.config, layout == "NHWC") == 1).all()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_grid_one_block_short_or_doubled_is_seen(layout):
    p = problem((2, 10, 23, 17, 33, 1), layout)
    cfg = w21.FUSED_TILES[4]
    full = w21.main_launch(w21.FusedGeometry.of(p, cfg))
    short = dataclasses.replace(full, grid=(full.grid[0] - 1, 1, 1))
    counts = w21.fused_output_writes(p, cfg, short)
    assert (counts == 0).any() and ((counts == 0) | (counts == 1)).all()
    twice = dataclasses.replace(full, grid=(full.grid[0], 2, 1))  # every block run twice
    assert (w21.fused_output_writes(p, cfg, twice) == 2).all()


def test_a_wrong_pair_decode_is_seen():
    """The model's pair decode is the one that covers: swapping NCHW's for NHWC's does not."""
    cfg = w21.FUSED_TILES[4]
    tile, kk = w21.pair_decode(cfg, True, np.arange(cfg.npair))
    assert sorted(zip(tile.tolist(), kk.tolist())) == [(t, k) for t in range(cfg.bt) for k in range(8)]
    tile, kk = w21.pair_decode(cfg, False, np.arange(cfg.npair))
    assert sorted(zip(tile.tolist(), kk.tolist())) == [(t, k) for t in range(cfg.bt) for k in range(8)]
    bad = np.zeros((cfg.bt, cfg.bk), dtype=np.int64)
    pair = np.arange(cfg.npair)
    np.add.at(bad, (pair % cfg.bt, pair // cfg.bt % 4), 1)  # kk wrapped at 4: half the filters never written
    assert not (bad == 1).all()


# ---- the simulated run ------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("spec", SHAPES, ids=str)
def test_the_simulated_fused_kernel_is_the_convolution_in_float64(spec, m, layout):
    """float64 against torch: equal to rounding (1e-12 of the |x|·|w| scale), nothing left NaN."""
    p = problem(spec, layout)
    x, w = p.make_inputs(seed=sum(spec[:5]))
    y = w21.simulate_fused(p, x.numpy(), w.numpy(), m)
    ref = torch_reference(p, x, w)
    scale = F.conv2d(p.to_logical(x).double().abs(), p.w_to_kcrs(w).double().abs(), padding=p.padding)
    err = (p.to_logical(torch.from_numpy(y)) - ref).abs()
    assert not np.isnan(y).any()
    assert bool((err <= 1e-12 * (scale + 1)).all()), float(err.max())


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("spec", SHAPES[:3] + [(2, 64, 13, 10, 8, 1)], ids=str)
def test_float32_runs_stay_within_day_20s_bound(spec, m, layout):
    """float32 (products and sums rounded apart: more roundings than the kernel's fmaf) within
    `winograd_model`, the relative L2 error far under the harness's limit."""
    p = problem(spec, layout)
    x, w = p.make_inputs(seed=3)
    r = judged(p, x, w, w21.simulate_fused(p, x.numpy(), w.numpy(), m, np.float32), m)
    assert r["nonfinite"] == 0 and r["worst_err_over_bound"] <= 1, r
    assert r["rel_l2"] <= rel_l2_limit(p) / 10, r


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
def test_a_batch_is_its_images_run_alone_bit_for_bit(m, layout):
    """Images 0..2 of a batch (their tiles spread over blocks differently than alone) agree bitwise
    with each image run alone (float32: every rounding of the simulation)."""
    p = problem((3, 11, 9, 7, 37, 1), layout)
    x, w = p.make_inputs(seed=5)
    y = w21.simulate_fused(p, x.numpy(), w.numpy(), m, np.float32)
    p1 = dataclasses.replace(p, N=1, name="")
    for n in range(p.N):
        y1 = w21.simulate_fused(p1, x[n:n + 1].numpy(), w.numpy(), m, np.float32)
        assert np.array_equal(y[n:n + 1], y1)


@pytest.mark.parametrize("m", [2, 4])
def test_integer_inputs_exact_through_f2_only(m):
    p = problem((2, 45, 9, 10, 4, 1))
    x, w = p.make_inputs(kind="int")
    y = w21.simulate_fused(p, x.numpy(), w.numpy(), m, np.float32)
    r = compare(p, x, w, torch.from_numpy(y), exact=True, model=w20.winograd_model(m))
    assert r["worst_err_over_bound"] <= 1
    assert r["exact_equal"] == (m == 2), r


# ---- planted faults -------------------------------------------------------------------------------


FAULT_SPEC = (2, 11, 13, 10, 37, 1)  # chunks: 2 (F(2)), 3 (F(4)); 4 x 3 and 3 x 3 tiles an image


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
def test_the_clean_run_passes_the_check_the_faults_fail(m, layout):
    """The check that passes the clean run: nothing NaN, every output within `winograd_model`."""
    p = problem(FAULT_SPEC, layout)
    x, w = p.make_inputs(seed=7)
    r = judged(p, x, w, w21.simulate_fused(p, x.numpy(), w.numpy(), m, np.float32), m)
    assert r["nonfinite"] == 0 and r["worst_err_over_bound"] <= 1, r


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("chunk", [0, 1])
def test_a_dropped_channel_chunk_is_caught(chunk, m, layout):
    p = problem(FAULT_SPEC, layout)
    x, w = p.make_inputs(seed=7)
    r = judged(p, x, w, w21.simulate_fused(p, x.numpy(), w.numpy(), m, np.float32, drop_chunk=chunk), m)
    assert r["worst_err_over_bound"] > 10 and r["rel_l2"] > rel_l2_limit(p), r


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
def test_a_dropped_transform_position_is_caught(m, layout):
    p = problem(FAULT_SPEC, layout)
    x, w = p.make_inputs(seed=7)
    for pos in (0, w20.winograd(m).n + 1, (m + 2) ** 2 - 1):
        y = w21.simulate_fused(p, x.numpy(), w.numpy(), m, np.float32, drop_position=pos)
        r = judged(p, x, w, y, m)
        assert r["worst_err_over_bound"] > 10, (pos, r)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
def test_a_misplaced_edge_tile_is_caught(m, layout):
    """The last tile of each row written one tile to the left: its own pixels stay NaN, its
    neighbour's are overwritten (wrong values where the blocks' order lets it win)."""
    p = problem(FAULT_SPEC, layout)
    x, w = p.make_inputs(seed=7)
    y = w21.simulate_fused(p, x.numpy(), w.numpy(), m, np.float32, edge_fault=True)
    r = judged(p, x, w, y, m)
    assert r["nonfinite"] > 0, r
    yl = p.to_logical(torch.from_numpy(y))
    q_last = (w20.cdiv(p.Q, m) - 1) * m
    assert bool(torch.isnan(yl[..., q_last:]).all()) and not bool(torch.isnan(yl[..., :q_last]).any())


# ---- the kernel file compiles everywhere, without spills -----------------------------------------------

ENTRIES = {"winof_filter_nchw", "winof_filter_nhwc", "winof_main_nchw", "winof_main_nhwc"}


@pytest.mark.nvcc
@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("arch", hc.ARCHS)
def test_the_fused_kernels_compile_for_every_arch_without_spills(arch, m):
    cfg = w21.FUSED_TILES[m]
    reports, log = hc.nvcc_compile(w21.FUSED_CU_FILE, arch=arch, defines=w21.fused_defines(cfg))
    by = {r.entry: r for r in reports}
    assert set(by) == ENTRIES, log
    for r in reports:
        assert (r.spill_stores, r.spill_loads, r.stack_bytes) == (0, 0, 0), r
        assert 0 < r.registers <= 128, r  # __launch_bounds__(256, 2) for main: two blocks of 256 threads an SM
    for lay in ("nchw", "nhwc"):
        assert by[f"winof_main_{lay}"].shared_bytes == cfg.smem_bytes <= 48 * 1024
        assert by[f"winof_filter_{lay}"].shared_bytes == 0


@pytest.mark.nvcc
@pytest.mark.parametrize("m", [2, 4])
def test_every_tile_of_the_tuners_space_compiles_for_sm_90_with_its_shared_memory(m):
    """The fused spaces (day 15's tuner) build each tile alone: each compiles, its static shared memory
    is `FusedConfig.smem_bytes`; spills only where SPACE_MAX_ACCUMULATORS's comment says (F(4) 8 x 64 x 4)."""
    spilled = set()
    for cfg in w21.space_tiles(m):
        reports, log = hc.nvcc_compile(w21.FUSED_CU_FILE, arch="sm_90", defines=w21.fused_defines(cfg))
        by = {r.entry: r for r in reports}
        assert set(by) == ENTRIES, log
        assert all(by[f"winof_main_{lay}"].shared_bytes == cfg.smem_bytes for lay in ("nchw", "nhwc")), cfg
        if any(r.spill_stores for r in reports):
            spilled.add(cfg.name)
    assert spilled == ({"8x64x4"} if m == 4 else set())


@pytest.mark.nvcc
def test_the_fused_kernel_refuses_to_build_without_its_tile():
    with pytest.raises(RuntimeError, match="WINOF_BT"):
        hc.nvcc_compile(w21.FUSED_CU_FILE, arch="sm_90", defines=w20.kernel_defines(4))
    with pytest.raises(RuntimeError, match="WINO_M"):
        hc.nvcc_compile(w21.FUSED_CU_FILE, arch="sm_90")


def test_a_step_left_out_is_a_define_and_a_name():
    v = get("winograd_f4_fused")
    s = w21.skipping(v, "GEMM", "input")
    assert s.name == "winograd_f4_fused[no GEMM + input]" and s.defines["WINOF_SKIP"] == 5
    assert {k: d for k, d in s.defines.items() if k != "WINOF_SKIP"} == v.defines and "WINOF_SKIP" not in v.defines
    for bad in ((), ("x",)):
        with pytest.raises(ValueError, match="one or more of"):
            w21.skipping(v, *bad)


@pytest.mark.nvcc
@pytest.mark.parametrize("steps", [("input",), ("U",), ("GEMM",)])
def test_each_step_left_out_builds_without_spills(steps):
    """The timing experiments of day 21's section 5 build (sm_90), the main kernel without spills;
    leaving the GEMM out frees registers (its accumulators), leaving the others out does not."""
    v = get("winograd_f4_fused")
    full = {r.entry: r for r in hc.nvcc_compile(w21.FUSED_CU_FILE, arch="sm_90", defines=v.defines)[0]}
    reports, _ = hc.nvcc_compile(w21.FUSED_CU_FILE, arch="sm_90", defines=w21.skipping(v, *steps).defines)
    main = [r for r in reports if r.entry.startswith("winof_main")]
    assert len(main) == 2 and all(r.spill_stores == r.spill_loads == 0 for r in main)
    if steps == ("GEMM",):
        assert all(r.registers < full[r.entry].registers for r in main)
