"""Day 16 on the CPU: the tensor-map helper (`helpers.tma`), the kernel's maps and refusals, its
coverage model and its launch arguments (tests/gpu/test_wgmma_gpu.py runs the kernel).

* the im2col map of every problem the variant takes walks exactly the conv's input pixels: the
  model of the copy engine's walk (`helpers.tma.im2col_rows`, checked against the H200's copy
  engine) gives, for each m-tile and filter tap, the pixel p * stride - pad + r * dil of each row;
* every configuration writes each output element once (the persistent loop included);
* the copy engine's limits and the kernel's own are refused with a reason, before any launch;
* `helpers.tma.kernel_args` pads to the driver's parameter offsets, and `bind` encodes maps.
* the compiled kernel: no generic loads or stores in its PTX, and setmaxnreg's moves within the
  registers each block is launched with (both with a planted fault);
* the ring replayed (`replay_ring`): no hazard in any schedule, each planted mistake caught; the
  spans the notebooks draw, and the schematic of the persistent and ping-pong schedules.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace

import numpy as np
import pytest
from conftest import RecordingKernel

from days.day16_igemm_wgmma import (
    BEYOND_LIMITS,
    BK,
    BY_NAME,
    CHECK_PROBLEMS,
    CLUSTER_MODES,
    CU_FILE,
    ENTRIES,
    HOPPER_CC,
    MODES,
    MULTI_TILE_PROBLEMS,
    PERSISTENT_MODES,
    RING_BUGS,
    RingHazard,
    capped,
    choose,
    grid_blocks,
    last_wave_fill,
    make_wgmma,
    moved_registers,
    pair_tiles,
    replay_ring,
    ring_spans,
    ring_steps,
    schedule_timeline,
    setmaxnreg_targets,
    tensor_check,
    tile_coords,
    tile_count,
    w_map,
    x_map,
    y_map,
)
from days.kit import cdiv, grid_stride_items
from helpers import compile as hc
from helpers import tma
from helpers.epilogue import PLAIN, Epilogue
from helpers.launch import Launcher, bind, compile_launches, param_buffer
from helpers.problem import Conv2dProblem
from helpers.suites import resnet50
from helpers.variants import KernelLaunch, LaunchConfig, get

V = get("igemm_wgmma")
FORCED = {c.name: make_wgmma(name=f"igemm_wgmma[{c.name}]", config=c) for c in ENTRIES}


def nhwc(**kw) -> Conv2dProblem:
    return Conv2dProblem(layout="NHWC", dtype="fp16", **kw)


PROBLEMS, REFUSED = CHECK_PROBLEMS, BEYOND_LIMITS


def test_entries_are_the_ladder():
    modes = {c.mode for c in ENTRIES}
    assert modes == set(MODES) == {"one_wg", "specialised", "persistent", "pingpong", "cluster", "cluster_a"}
    for c in ENTRIES:
        assert c.threads == (128 if c.mode == "one_wg" else 128 * (1 + c.consumers))
        assert c.shared_bytes <= 227 * 1024, c
        assert c.bm % 64 == 0 and c.bn in (64, 128, 256), c


def test_m_tiles_are_the_entry_lines_mt():
    lines = re.findall(r"^WGMMA_ENTRY\(\w+, (\w+), (\d+), (\d+), (\d+), ", hc.kernel_path(CU_FILE).read_text(), re.M)
    assert [(c.mode, c.bm, c.bn, c.m_tiles) for c in ENTRIES] == [(m, int(a), int(b), int(mt)) for m, a, b, mt in lines]


def test_build_target_is_sm90a_only():
    assert V.target(HOPPER_CC) == "sm_90a"
    assert V.build_reason(HOPPER_CC) is None
    for cc in ((8, 0), (8, 9), (10, 0), (12, 0)):
        reason = V.build_reason(cc)
        assert reason and ("9.0" in reason) and ("sm_90a" in reason or "wgmma" in reason), (cc, reason)


@pytest.mark.parametrize("p", PROBLEMS, ids=lambda p: p.name)
def test_every_configuration_takes_the_problems_and_writes_each_output_once(p):
    for name, v in FORCED.items():
        assert v.supports(p, smem_limit=2**31) is None, (name, v.supports(p, smem_limit=2**31))
        counts = v.covers(p)
        assert counts.shape == (p.gemm.m * p.K,) and (counts == 1).all(), name


def test_persistent_grid_smaller_than_the_tiles_still_covers():
    p = nhwc(N=32, C=64, H=28, W=28, K=512, R=3, S=3, padding=1)  # 196 x 2 tiles of 128 x 256
    v = FORCED["persistent_128x256_c2_s4"]
    launch = v.launch(p)
    assert launch.grid[0] < 392
    for grid in (1, 7, 131, 391, 392, 500):
        cfg = replace(launch, grid=(grid, 1, 1))
        assert (v.plan(p).covers(cfg) == 1).all(), grid
    one = FORCED["specialised_128x256_c2_s4"]
    assert one.launch(p).grid[0] == 392


@pytest.mark.parametrize("units", [1, 2])
@pytest.mark.parametrize("p", MULTI_TILE_PROBLEMS, ids=lambda p: p.name)
def test_capped_grids_give_every_block_several_tiles(p, units):
    """The multi-tile cases of the GPU tests and the sanitizers (`capped`): on a grid of one or two
    blocks (pairs) every schedule that loops over tiles still writes each output once, and the first
    block (pair) takes at least two work items, ping-pong's consumers at least two tiles each (a
    second turn, reused staging buffers); the first problem is the smoke run's for each of them."""
    from benchmarks.smoke import smoke_problem

    for cfg in ENTRIES:
        if cfg.mode not in PERSISTENT_MODES:
            with pytest.raises(ValueError, match="loop over tiles"):
                capped(cfg, units)
            continue
        v = capped(cfg, units)
        assert v.supports(p, smem_limit=2**31) is None
        launch = v.launch(p)
        pair = cfg.mode in CLUSTER_MODES
        assert launch.grid[0] == units * (2 if pair else 1)
        assert (v.covers(p) == 1).all(), v.name
        items = pair_tiles(p, cfg) if pair else tile_count(p, cfg)
        most = -(-items // units)  # the first block (pair) takes the most
        assert most >= (4 if cfg.mode == "pingpong" else 2), (v.name, p.name, items)
        if units == 1:
            assert smoke_problem(v, smem_limit=227 * 1024, cc=HOPPER_CC) == replace(MULTI_TILE_PROBLEMS[0], name="")


def test_pingpong_deals_each_blocks_tiles_to_its_two_consumers():
    """The kernel's ping-pong loop, replayed: consumer g of block b takes the block's tiles
    b + (g + 2 i) grid; together the consumers of all blocks take every tile once, as `covers`
    says, and the slot uses they wait on are those the producer issued for that tile."""
    p = nhwc(N=32, C=128, H=28, W=28, K=256, R=3, S=3, padding=1)  # 196 x 2 tiles of 128 x 128
    v = FORCED["pingpong_128x128_c2_s6"]
    grid, tiles, steps = v.launch(p).grid[0], -(-p.gemm.m // 128) * 2, 9 * 2  # 9 taps x 2 channel blocks
    assert grid == 132 < tiles
    taken = []
    for b in range(grid):
        produced = {tile: i * steps for i, tile in enumerate(range(b, tiles, grid))}  # the producer's order
        for g in (0, 1):
            u, tile = g * steps, b + g * grid
            while tile < tiles:
                assert u == produced[tile], (b, g, tile)
                taken.append(tile)
                u, tile = u + 2 * steps, tile + 2 * grid
    assert sorted(taken) == list(range(tiles))
    assert (v.covers(p) == 1).all()


@pytest.mark.parametrize("tiles_m, tiles_n", [(1, 1), (7, 3), (32, 64), (9, 1), (2, 5)])
def test_tile_order_is_a_bijection_in_groups_of_m_tiles(tiles_m, tiles_n):
    t = np.arange(tiles_m * tiles_n)
    tm, tn = tile_coords(t, tiles_m, tiles_n, 1)
    assert (tm == t // tiles_n).all() and (tn == t % tiles_n).all()  # group_m = 1: row-major
    for group_m in (2, 3, 8):
        tm, tn = tile_coords(t, tiles_m, tiles_n, group_m)
        assert sorted(tm * tiles_n + tn) == list(t), group_m  # every tile once
        rows = min(group_m, tiles_m)
        # the first group walks its m-tiles first: tiles 0 .. rows - 1 are column 0, rows 0 .. rows - 1
        assert (tn[:rows] == 0).all() and (tm[:rows] == np.arange(rows)).all()
        assert (tm // group_m == t // (group_m * tiles_n)).all()  # each tile inside its group's rows


def test_coverage_follows_the_tile_order_on_a_short_grid():
    """One tile per block: a grid one block short leaves exactly the last tile of the order
    unwritten, which is (tiles_m - 1, tiles_n - 1) for every group size."""
    p = nhwc(N=4, C=64, H=20, W=20, K=384, R=1, S=1)  # 13 x 3 tiles of 128 x 128
    for group_m in (1, 3, 8):
        cfg = replace(BY_NAME["specialised_256x128_c2_s4"], group_m=group_m)
        v = make_wgmma(config=cfg)
        short = replace(v.launch(p), grid=(v.launch(p).grid[0] - 2, 1, 1))
        counts = v.plan(p).covers(short).reshape(p.gemm.m, p.K)
        tm, tn = tile_coords(np.arange(short.grid[0], short.grid[0] + 2), -(-p.gemm.m // 256), 3, group_m)
        for a, b in zip(tm, tn):
            assert (counts[256 * a : 256 * (a + 1), 128 * b : 128 * (b + 1)] == 0).all(), (group_m, a, b)
        assert counts.sum() == p.gemm.m * p.K - sum(
            (min(256 * (a + 1), p.gemm.m) - 256 * a) * 128 for a in tm
        ), group_m


def _replay_pairs(rows: int, cols: int, grid: int, group_m: int, axis: str, shape: tuple) -> np.ndarray:
    """The kernel's cluster loop, replayed: pair c = block // 2 walks pair tiles c, c + grid / 2, ...
    of the rows x cols pair grid in `tile_coords` order, and rank block % 2 takes tile 2 x + rank
    along ``axis`` ("m": pair rows, "n": pair columns); a tile past ``shape`` (a ghost) stores
    nothing. Stores per tile of ``shape``."""
    visits = np.zeros(shape, dtype=int)
    for b in range(grid):
        for q in range(b // 2, rows * cols, grid // 2):
            pr, pc = (int(a[0]) for a in tile_coords(np.array([q]), rows, cols, group_m))
            tm, tn = (2 * pr + b % 2, pc) if axis == "m" else (pr, 2 * pc + b % 2)
            if tm < shape[0] and tn < shape[1]:
                visits[tm, tn] += 1
    return visits


def test_cluster_pairs_cover_every_tile_once_with_a_ghost_rank():
    """The kernel's cluster loop, replayed: pair c = block // 2 walks pair tiles c, c + grid / 2, ...
    in `tile_coords` order over ceil(tiles_m / 2) x tiles_n; rank block % 2 computes m-tile 2 pm +
    rank, and with tiles_m odd the last rank 1 is past the end (it stores nothing). `covers` says
    the same on full and short grids, and the grid is pairs."""
    p = nhwc(N=3, C=64, H=20, W=20, K=384, R=3, S=3, padding=1)  # 5 m-tiles of 256: a ghost in the last pair
    for group_m in (1, 3):
        cfg = replace(BY_NAME["cluster_256x128_c2_s4"], group_m=group_m)
        v = make_wgmma(config=cfg)
        tiles_m, tiles_n = -(-p.gemm.m // 256), 3
        assert tiles_m % 2 == 1 and pair_tiles(p, cfg) == 3 * tiles_n
        full = v.launch(p)
        assert full.grid[0] % 2 == 0 and full.grid[0] == 2 * pair_tiles(p, cfg)
        for grid in (full.grid[0], 4, 2):
            want = _replay_pairs(-(-tiles_m // 2), tiles_n, grid, group_m, "m", (tiles_m, tiles_n))
            assert (want == 1).all(), (group_m, grid)
            counts = v.plan(p).covers(replace(full, grid=(grid, 1, 1)))
            assert (counts == 1).all(), (group_m, grid)
    # the planted fault: both ranks on the pair's first m-tile (the rank forgotten) leaves every
    # second m-tile unwritten, which the replay's check sees
    wrong = np.zeros((tiles_m, tiles_n), dtype=int)
    for q in range(pair_tiles(p, cfg)):
        pm, tn = tile_coords(np.array([q]), -(-tiles_m // 2), tiles_n, 1)
        wrong[2 * int(pm[0]), int(tn[0])] += 2
    assert (wrong == 0).any() and not (wrong == 1).all()


def test_group_m_and_tile_indices_are_checked_before_a_launch():
    with pytest.raises(ValueError, match="group_m must be at least 1"):
        make_wgmma(config=replace(BY_NAME["persistent_256x128_c2_s4"], group_m=0))
    # 2^30 GEMM rows fit the 32-bit indices, but 2^23 x 2^9 = 2^32 tiles of 128 x 64 do not
    huge = nhwc(N=1024, C=8, H=1024, W=1024, K=2**15, R=1, S=1)
    v = make_wgmma(config="persistent_128x64_c2_s8")
    reason = v.supports(huge, smem_limit=2**31)
    assert reason is not None and "32-bit tile indices" in reason
    assert v.supports(replace(huge, K=2**12, name=""), smem_limit=2**31) is None  # 2^29 tiles


def _largest_u(p: Conv2dProblem, cfg) -> int:
    """The largest ring counter ``u`` any thread of ``cfg``'s launch on ``p`` reaches, replayed from
    the kernel's loops: the producer adds one per GEMM-K step of each of its block's tiles; a
    ping-pong consumer starts at group x steps and adds 2 x steps per tile it computes."""
    steps = p.R * p.S * cdiv(p.C, BK)
    grid = grid_blocks(p, cfg)
    items, blocks = (pair_tiles(p, cfg), grid // 2) if cfg.mode in CLUSTER_MODES else (
        tile_count(p, cfg), grid)
    per_block = np.bincount(grid_stride_items(items, blocks) % blocks, minlength=blocks).max()
    if cfg.mode != "pingpong":
        return int(per_block * steps)
    mine = [(per_block - g + 1) // 2 for g in (0, 1)]  # each consumer's tiles of the block
    return int(max(g * steps + 2 * steps * n for g, n in enumerate(mine)))


def test_the_ring_counter_is_refused_past_32_bits():
    """``int u`` counts a block's ring steps across all its tiles: N1 C8 33600^2 K8 255x255 pad 127
    needs 4.3e9 of them per persistent block and is refused before a launch (it was accepted); the
    one-tile-per-block schedules take it. `ring_steps` bounds the counter the kernel's loops reach."""
    huge = nhwc(N=1, C=8, H=33600, W=33600, K=8, R=255, S=255, padding=127)
    reason = V.supports(huge, smem_limit=2**31)
    ring = ring_steps(huge, choose(huge))  # 4,344,970,500 with 132 SMs
    assert reason is not None and "32-bit ring counter" in reason and str(ring) in reason, reason
    for cfg in ENTRIES:
        refused = FORCED[cfg.name].supports(huge, smem_limit=2**31)
        assert (refused is not None and "ring counter" in refused) == (ring_steps(huge, cfg) > 2**31 - 1)
        assert (refused is None) == (cfg.mode in ("one_wg", "specialised")), (cfg.name, refused)
    for p in [*PROBLEMS, nhwc(N=3, C=72, H=40, W=41, K=136, R=3, S=3, padding=1)]:
        for cfg in ENTRIES:
            assert _largest_u(p, cfg) <= ring_steps(p, cfg), (cfg.name, p.name)
    # a capped grid (one block, the tests' multi-tile runs) counts its own blocks
    mid = nhwc(N=1, C=8, H=8192, W=8192, K=8, R=65, S=65, padding=32)
    cfg = BY_NAME["persistent_128x64_c2_s8"]
    assert FORCED[cfg.name].supports(mid, smem_limit=2**31) is None
    assert ring_steps(mid, cfg, 1) > 2**31 - 1
    assert "32-bit ring counter" in capped(cfg, 1).supports(mid, smem_limit=2**31)


def test_cluster_a_pairs_cover_every_tile_once_with_a_ghost_rank():
    """cluster_a's pairs share A: pair tile (tm, pn) of tiles_m x ceil(tiles_n / 2) is n-tiles 2 pn
    and 2 pn + 1 of m-tile tm, and with tiles_n odd the last rank 1 is past the end. `covers` agrees
    with that replay on full and short grids; the rank on the wrong axis (cluster's) is caught."""
    p = nhwc(N=3, C=64, H=20, W=20, K=300, R=3, S=3, padding=1)  # 3 n-tiles of 128: a ghost in every row
    tiles_m, tiles_n = -(-p.gemm.m // 256), 3
    for group_m in (1, 3):
        cfg = replace(BY_NAME["cluster_a_256x128_c2_s4"], group_m=group_m)
        v = make_wgmma(config=cfg)
        assert pair_tiles(p, cfg) == tiles_m * 2
        full = v.launch(p)
        assert full.grid[0] == 2 * pair_tiles(p, cfg)
        for grid in (full.grid[0], 4, 2):
            want = _replay_pairs(tiles_m, 2, grid, group_m, "n", (tiles_m, tiles_n))
            wrong = _replay_pairs(tiles_m, 2, grid, group_m, "m", (tiles_m, tiles_n))  # planted: pairs along M
            assert (want == 1).all(), (group_m, grid)
            assert not (wrong == 1).all()
            assert (v.plan(p).covers(replace(full, grid=(grid, 1, 1))) == 1).all(), (group_m, grid)


def test_cluster_copies_half_of_b_or_a_per_block():
    p = PROBLEMS[3]
    assert w_map(p, BY_NAME["cluster_256x128_c2_s4"]).box == (BK, 1, 1, 64)
    assert w_map(p, BY_NAME["persistent_256x128_c2_s4"]).box == (BK, 1, 1, 128)
    assert w_map(p, BY_NAME["cluster_a_256x128_c2_s4"]).box == (BK, 1, 1, 128)
    assert x_map(p, BY_NAME["cluster_a_256x128_c2_s4"]).pixels == 128
    assert x_map(p, BY_NAME["cluster_256x128_c2_s4"]).pixels == 256


def test_a_dropped_tile_is_seen_by_the_coverage_model():
    p = PROBLEMS[1]
    v = FORCED["specialised_256x128_c2_s4"]
    cfg = v.launch(p)
    short = replace(cfg, grid=(cfg.grid[0] - 1, 1, 1))
    assert (v.plan(p).covers(short) == 0).any()


def _walk_matches_the_conv(p: Conv2dProblem, bm: int) -> None:
    desc = replace(x_map(p, replace(ENTRIES[0], bm=bm)), pixels=bm)
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
    M = p.gemm.m
    for m0 in range(0, M, bm):
        n0, rem = divmod(m0, p.P * p.Q)
        p0, q0 = divmod(rem, p.Q)
        for r in range(p.R):
            for s in range(p.S):
                rows = tma.im2col_rows(desc, (q0 * sw - pw, p0 * sh - ph, n0), (s * dw, r * dh))
                for i, got in enumerate(rows):
                    m = m0 + i
                    if m >= M:
                        assert got is None or got[0] >= p.N, (p.name, m, got)
                        continue
                    n, rest = divmod(m, p.P * p.Q)
                    pp, qq = divmod(rest, p.Q)
                    h, w = pp * sh - ph + r * dh, qq * sw - pw + s * dw
                    want = (n, h, w) if 0 <= h < p.H and 0 <= w < p.W else None
                    assert got == want, (p.name, m, r, s, got, want)


@pytest.mark.parametrize("p", PROBLEMS, ids=lambda p: p.name)
def test_im2col_map_walks_the_conv_input(p):
    _walk_matches_the_conv(p, 64)


def test_im2col_map_walks_resnet50():
    for q in resnet50(batches=(1,)):
        q = V.adapt(q)
        if V.supports(q, smem_limit=2**31) is None:
            _walk_matches_the_conv(replace(q, N=2, name=""), 256)


def test_a_wrong_bounding_box_is_caught_by_the_walk_check():
    p = PROBLEMS[2]
    desc = x_map(p, ENTRIES[0])
    bad = replace(desc, upper=(desc.upper[0] + p.stride[1], desc.upper[1]), pixels=64)  # one column too many
    rows = tma.im2col_rows(bad, (-p.padding[1], -p.padding[0], 0), (0, 0))
    good = tma.im2col_rows(replace(desc, pixels=64), (-p.padding[1], -p.padding[0], 0), (0, 0))
    assert rows != good


def test_maps_of_a_resnet_layer():
    p = nhwc(N=256, C=64, H=56, W=56, K=64, R=3, S=3, padding=1)
    cfg = choose(p)
    xm, wm = x_map(p, cfg), w_map(p, cfg)
    assert xm.dims == (64, 56, 56, 256) and xm.lower == (-1, -1) and xm.upper == (-1, -1)
    assert xm.strides == (128, 56 * 128, 56 * 56 * 128) and xm.channels == BK and xm.pixels == cfg.bm
    assert xm.box_bytes == cfg.bm * 128 and xm.reason() is None
    assert wm.dims == (64, 3, 3, 64) and wm.box == (BK, 1, 1, cfg.bn) and wm.reason() is None
    ym = y_map(p)
    assert ym.dims == (64, 256 * 56 * 56) and ym.strides == (128,) and ym.box == (64, 64) and ym.swizzle == 128
    assert ym.box_bytes == 8192 and ym.reason() is None
    s2 = nhwc(N=1, C=256, H=56, W=56, K=512, R=1, S=1, stride=2)
    assert x_map(s2, cfg).upper == (-1, -1) and x_map(s2, cfg).element_strides == (1, 2, 2, 1)


@pytest.mark.parametrize("p, why", REFUSED, ids=[w for _, w in REFUSED])
def test_refusals_name_the_limit(p, why):
    reason = V.supports(p, smem_limit=2**31)
    assert reason is not None and why in reason, reason
    assert get("igemm_production").supports(p, smem_limit=2**31) is None or p.groups > 1  # day 13 takes them


# ---- helpers.tma ------------------------------------------------------------------------------


def test_tiled_map_reasons():
    ok = tma.TiledMap("fp16", (64, 3, 3, 64), (128, 384, 1152), (64, 1, 1, 256))
    assert ok.reason() is None and ok.box_bytes == 64 * 256 * 2
    assert "256" in replace(ok, box=(64, 1, 1, 257)).reason()
    assert "swizzle span" in replace(ok, box=(128, 1, 1, 64)).reason()
    assert "multiple of 16" in replace(ok, strides=(120, 384, 1152)).reason()
    assert "aligned" in ok.reason(address=0x1008)
    assert ok.reason(address=0x1010) is None
    assert "dtype" in replace(ok, dtype="fp32").reason()
    assert "swizzle" in replace(ok, swizzle=16).reason()


def test_im2col_map_reasons():
    ok = tma.Im2colMap("bf16", (64, 56, 56, 8), (128, 7168, 401408), (-1, -1), (-1, -1), 64, 256, (1, 1, 1, 1))
    assert ok.reason() is None and ok.box_bytes == 64 * 256 * 2
    assert "corner" in replace(ok, lower=(-129, 0)).reason()
    assert "corner" in replace(ok, upper=(0, 128)).reason()
    assert "pixels" in replace(ok, pixels=257).reason()
    assert "element strides" in replace(ok, element_strides=(1, 9, 1, 1)).reason()
    assert "swizzle span" in replace(ok, channels=128).reason()
    assert "3 to 5" in replace(ok, dims=(64, 56), strides=(128,), lower=(), upper=()).reason()


def test_encode_refuses_before_the_driver():
    bad = tma.TiledMap("fp16", (64, 64), (120,), (64, 64))
    with pytest.raises(ValueError, match="multiple of 16"):
        tma.encode(bad, 0x10000)


def test_kernel_args_pad_to_the_driver_offsets():
    m = tma.MapBytes(bytes(range(128)))
    args = (np.uintp(5), np.int32(7), m, np.float32(1.5))
    out = tma.kernel_args(args, (0, 8, 112, 240))
    assert [type(a) for a in out] == [np.uintp, np.int32, np.void, np.void, np.float32]
    assert out[2].itemsize == 112 - 12 and out[3].itemsize == 128 and bytes(out[3]) == m.data
    first = tma.kernel_args((m, np.int32(1)), (112, 240))
    assert [a.itemsize for a in first] == [112, 128, 4]
    assert tma.kernel_args((np.int32(1), np.int32(2)), (0, 4)) == (np.int32(1), np.int32(2))


def test_kernel_args_refuse_a_mismatch():
    m = tma.MapBytes(bytes(128))
    with pytest.raises(ValueError, match="takes 2 parameters"):
        tma.kernel_args((m,), (112, 240))
    with pytest.raises(ValueError, match="overlaps"):
        tma.kernel_args((m, np.int32(1)), (0, 64))
    with pytest.raises(TypeError, match="numpy scalars or MapBytes"):
        tma.kernel_args((5,), (0,))
    with pytest.raises(ValueError, match="128 bytes"):
        tma.MapBytes(bytes(64))


def test_launches_pass_the_three_maps_first():
    """x, w and, when K % 8 == 0, y (whose stores the copy engine makes); else a map-sized
    placeholder the kernel does not read (the threads store y); group_m before alpha."""
    for p in PROBLEMS:
        (k,) = V.launches(p)
        x, w = k.args[:2]
        assert isinstance(x, tma.TensorMap) and x.name == "x" and isinstance(x.desc, tma.Im2colMap)
        assert isinstance(w, tma.TensorMap) and w.name == "w" and isinstance(w.desc, tma.TiledMap)
        if p.K % 8 == 0:
            assert k.args[2] == tma.TensorMap("y", y_map(p)), p
        else:
            assert k.args[2] is tma.UNUSED_MAP, p
        assert len(k.args) == 23 and k.args[-4] == choose(p).group_m
        assert k.entry == choose(p).entry("fp16")
    assert {p.K % 8 == 0 for p in PROBLEMS} == {True, False}


def test_y_must_be_16_byte_aligned_when_the_copy_engine_stores_it():
    import torch

    def at(offset: int, shape) -> torch.Tensor:  # a tensor whose storage starts `offset` bytes in
        return torch.zeros(int(np.prod(shape)) + offset // 2, dtype=torch.float16)[offset // 2:].view(shape)

    for p in (nhwc(N=1, C=64, H=8, W=8, K=128, R=1, S=1), nhwc(N=1, C=64, H=8, W=8, K=36, R=1, S=1)):
        x, w = (at(0, shape) for shape in p.input_shapes)
        for off in (0, 4, 8):
            reason = tensor_check(p, {"x": x, "w": w, "y": at(off, p.output_shape)}, PLAIN)
            refused = p.K % 8 == 0 and off % 16 != 0
            assert (reason is not None) == refused, (p.K, off, reason)
            if refused:
                assert "y.data_ptr() is not 16-byte aligned" in reason
        cin = at(2, p.output_shape)
        reason = tensor_check(p, {"x": x, "w": w, "y": at(0, p.output_shape), "cin": cin}, Epilogue(beta=1.0))
        assert reason is not None and "cin" in reason


def test_bind_refuses_a_map_of_a_missing_tensor():
    k = KernelLaunch(
        "main", "e", LaunchConfig((1, 1, 1), (128, 1, 1)), (tma.TensorMap("x", x_map(PROBLEMS[0], ENTRIES[0])),)
    )
    with pytest.raises(ValueError, match="passes 'x'"):
        bind([Launcher(k, RecordingKernel("e", []))], {"w": None})
    with pytest.raises(ValueError, match="as None"):
        bind([Launcher(k, RecordingKernel("e", []))], {"x": None})


def test_compile_launches_asks_for_parameter_offsets(monkeypatch):
    import helpers.compile as hc
    from helpers.compile import CompiledKernel

    asked, calls = {}, []

    def load_kernel(cu_file, entry, defines=None, dynamic_smem=0, arch=None, params=0):
        asked[entry] = params
        return CompiledKernel(RecordingKernel(entry, calls), 168, 0, 0, 1024, (112, 240, 368) if params else None)

    monkeypatch.setattr(hc, "load_kernel", load_kernel)
    cfg = LaunchConfig((1, 1, 1), (128, 1, 1))
    spec = tma.TensorMap("x", x_map(PROBLEMS[0], ENTRIES[0]))
    with_map = KernelLaunch("a", "with_map", cfg, (spec, spec, np.uintp(0)))
    plain = KernelLaunch("b", "plain", cfg, (np.int32(1),))
    compiled = compile_launches(V, [with_map, plain], "sm_90a")
    assert asked == {"with_map": 3, "plain": 0}
    assert [c.offsets for c in compiled] == [(112, 240, 368), None]
    m = tma.MapBytes(bytes(range(128)))
    buf = param_buffer((m, m, np.uintp(3)), compiled[0].offsets)  # the maps at 112 and 240, the pointer at 368
    assert buf == bytes(112) + m.data + m.data + np.uintp(3).tobytes()
    assert param_buffer((np.int32(1),), compiled[1].offsets) == np.int32(1).tobytes()


def test_choose_hides_short_main_loops_and_fills_the_last_wave():
    big = nhwc(N=256, C=256, H=14, W=14, K=256, R=3, S=3, padding=1)  # 36 steps; 392 tiles of 128 x 256: 0.99 full
    assert choose(big).name == "persistent_128x256_c2_s4"  # 784 of 128 x 128 fill as well: the larger tile
    assert choose(replace(big, K=128, H=28, W=28, name="")).name == "persistent_256x128_c2_s4"  # K % 256 != 0
    assert choose(replace(big, K=64, name="")).name == "persistent_128x64_c2_s8"  # 196 of 256 x 64: 0.74; 392: 0.99
    assert choose(replace(big, K=64, H=28, W=28, name="")).name == "persistent_256x64_c2_s4"  # 784 row tiles
    assert choose(replace(big, N=32, name="")).name == "persistent_128x128_c2_s6"  # 49 tiles: 0.37 against 0.74
    assert choose(replace(big, N=32, K=64, name="")).name == "persistent_128x64_c2_s8"  # K <= 64 first
    few = replace(big, N=32, C=512, H=7, W=7, K=512, name="")  # 13 m-tiles: 52 of 128 x 128 fill 0.39 of the SMs
    assert choose(few).name == "persistent_128x64_c2_s8"  # halved: 104 tiles
    assert choose(replace(few, K=1024, name="")).name == "persistent_128x128_c2_s6"  # 104 tiles: no halving
    one_by_one = replace(big, C=256, R=1, S=1, padding=0, name="")  # 4 GEMM-K steps: ping-pong
    assert choose(one_by_one).name == "pingpong_128x128_c2_s6"
    assert choose(replace(one_by_one, K=64, name="")).name == "pingpong_128x64_c2_s8"
    assert choose(replace(one_by_one, C=320, name="")).name == "persistent_128x256_c2_s4"  # 5 steps
    assert last_wave_fill(264, 132) == 1.0 and last_wave_fill(133, 132) == 133 / 264
    gemm = nhwc(N=8, C=8192, H=32, W=32, K=8192, R=1, S=1)  # a 128 MiB filter: grouped tile order
    assert choose(gemm).name == "persistent_128x256_c2_s4_g8"
    assert choose(gemm).compiled == BY_NAME["persistent_128x256_c2_s4"]
    assert choose(replace(gemm, C=1024, name="")).group_m == 1  # 16 MiB: within half of a 50 MiB L2
    assert {choose(replace(p, layout="NHWC", dtype="fp16", name="")).group_m for p in resnet50()} == {1}
    assert last_wave_fill(1, 132) == 1 / 132


def test_parameter_offsets_are_asked_of_the_driver_once(monkeypatch):
    import helpers.compile as hc

    asked = []
    monkeypatch.setattr(hc, "param_offsets", lambda cubin, entry, count: asked.append(entry) or (112, 240))
    monkeypatch.setitem(hc._cubins, ("k",), b"cubin")
    monkeypatch.setattr(hc, "_offsets", {})
    assert hc._offsets_of(("k",), "e", 2) == hc._offsets_of(("k",), "e", 2) == (112, 240)
    assert asked == ["e"]


# ---- the address space of every load and store (the epilogue's 1.7x on one-step layers, day 17 appendix A.5) ----

PTX_ACCESS = re.compile(r"^\s*(?:@!?%\w+\s+)?(ld|st)((?:\.[\w:]+)+)\s", re.M)
STATE_SPACES = {"shared", "global", "param", "local", "const"}
OLD_RING = "reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023))"


def generic_accesses(ptx: str) -> list[str]:
    """The ``ld``/``st`` instructions of ``ptx`` without a state space (.shared, .global, ...): loads
    and stores through generic addresses, which ptxas turns into LD/ST instead of LDS/STS or LDG/STG."""
    return [m.group(1) + m.group(2) for m in PTX_ACCESS.finditer(ptx)
            if not STATE_SPACES & set(m.group(2).split(".")[1:])]


def ptx_of(source: str, tmp_path) -> str:
    src, out = tmp_path / "k.cu", tmp_path / "k.ptx"
    src.write_text(source)
    cmd = ["nvcc", "-ptx", "-arch=sm_90a", *hc.NVCC_OPTIONS, "-I", str(hc.KERNEL_DIR), "-o", str(out), str(src)]
    subprocess.run(cmd, check=True, capture_output=True)
    return out.read_text()


@pytest.mark.nvcc
def test_every_load_and_store_of_the_kernel_names_its_memory(tmp_path):
    ptx = ptx_of(hc.kernel_path("16_igemm_wgmma.cu").read_text(), tmp_path)
    assert "st.shared" in ptx and "st.global" in ptx
    assert generic_accesses(ptx) == []


@pytest.mark.nvcc
def test_the_address_space_check_sees_a_ring_aligned_through_an_integer(tmp_path):
    """The planted fault: the ring aligned by rounding a uintptr_t, as before day 16's epilogue fix;
    the staging of values into the buffers and the threads' 16-byte loads from them become generic."""
    src = hc.kernel_path("16_igemm_wgmma.cu").read_text()
    line = re.search(r"unsigned char\* ring = (.*);", src)
    assert line, "the ring's declaration moved"
    planted = src.replace(line.group(0), f"unsigned char* ring = {OLD_RING};")
    found = set(generic_accesses(ptx_of(planted, tmp_path)))
    assert {"st.u32", "ld.v4.u32"} <= found, found


# ---- setmaxnreg moves registers inside the block's launch allocation ----

def test_setmaxnreg_stays_within_the_launch_allocation():
    """setmaxnreg.inc waits until the block has the registers, and the block only has what it was
    launched with (ptxas's count x threads) plus what .dec gave back: an entry whose moves need
    more never gets past the .inc (the hang of day 16's first cluster try, producer 48 / consumers
    232 on 168 x 384 = 64,512). The planted fault: that producer count, which the check must refuse."""
    regs = {r.entry: r.registers for r in hc.nvcc_compile(CU_FILE, arch="sm_90a")[0]}
    specialised = [c for c in ENTRIES if c.mode != "one_wg"]
    assert {c.mode for c in specialised} >= {"persistent", "cluster"}
    for cfg in specialised:
        for dt in ("fp16", "bf16"):
            launched = regs[cfg.entry(dt)] * cfg.threads
            assert moved_registers(cfg) <= launched, (cfg.name, dt, launched)
    pair, single = (setmaxnreg_targets(BY_NAME[f"{m}_256x128_c2_s4"]) for m in ("cluster", "persistent"))
    assert pair == (56, 224) and single == (40, 232)
    two = [c for c in specialised if c.consumers == 2]
    planted = 128 * 48 + 256 * setmaxnreg_targets(BY_NAME["persistent_256x128_c2_s4"])[1]
    assert two and all(planted > regs[c.entry("fp16")] * c.threads for c in two)


def test_supports_reads_the_device_through_torch_not_pycuda(monkeypatch):
    """`prepare` asks the shape-level `supports` before its tensor checks, promising no pycuda call
    there; day 16's grid needs the SM count and its tile order the L2 size, which it now reads from
    torch's device properties (it called `helpers.gpu.device_info`, which initialises pycuda)."""
    from types import SimpleNamespace

    import torch

    from helpers import gpu

    def pycuda(*a, **k):
        raise AssertionError("pycuda was initialised by supports")

    monkeypatch.setattr(gpu, "has_gpu", lambda: True)
    monkeypatch.setattr(gpu, "init", pycuda)
    monkeypatch.setattr(gpu, "device_info", pycuda)
    props = SimpleNamespace(multi_processor_count=100, L2_cache_size=40 * 2**20)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    p = nhwc(N=8, C=256, H=28, W=28, K=256, R=3, S=3, padding=1)
    assert V.supports(p, smem_limit=2**31) is None
    cfg = choose(p)
    assert cfg.mode == "persistent" and V.launch(p).grid[0] == min(tile_count(p, cfg), 100)


# ---- the ring replayed (`replay_ring`) -------------------------------------------------------------

RING_TILES = {"one_wg": 1, "specialised": 1, "persistent": 3, "pingpong": 5}


@pytest.mark.parametrize("mode", list(RING_TILES))
def test_the_kernels_ring_has_no_hazard_in_any_interleaving(mode):
    for cfg in (c for c in ENTRIES if c.mode == mode):
        for steps in (1, 2, 3, 5, 9):
            for seed in range(8):
                for slow in (1.0, 0.1):
                    assert replay_ring(mode, cfg.stages, steps, RING_TILES[mode], cfg.consumers, cfg.bm, cfg.bn,
                                       seed=seed, slow_copies=slow) > 0


@pytest.mark.parametrize("bug", list(RING_BUGS))
def test_every_planted_mistake_is_caught_in_some_interleaving(bug):
    mode, steps, tiles = ("pingpong", 3, 5) if bug == "no order wait" else ("persistent", 6, 3)
    caught = 0
    for seed in range(60):
        try:
            replay_ring(mode, 4, steps, tiles, seed=seed, bug=bug, slow_copies=(1.0, 0.1)[seed % 2])
        except RingHazard:
            caught += 1
    assert caught, bug
    with pytest.raises(ValueError, match="bug must be one of"):
        replay_ring(mode, 4, steps, tiles, bug="no such mistake")


def test_one_warpgroup_releases_a_slot_only_after_its_wgmma_retired():
    trace = []
    replay_ring("one_wg", 4, 9, seed=2, trace=trace)
    spans = ring_spans(trace)
    assert sorted(u for _, u in spans) == list(range(9)) and all(s == u % 4 for s, u in spans)
    for (s, u), d in spans.items():
        assert d["copy in flight"][1] <= d["landed, waiting"][1] <= d["read by wgmma"][0]
        if (s, u + 4) in spans:  # the refill of the slot is issued after this use's wgmma retired
            assert spans[(s, u + 4)]["copy in flight"][0] > d["read by wgmma"][1]


def test_pingpong_hides_the_epilogue_only_with_several_tiles_per_block():
    """The schematic: persistent pays mainloop + epilogue / 2 per tile; ping-pong overlaps one
    consumer's epilogue with the other's main loop (mainloop per tile while mainloop >= epilogue),
    but with one tile a consumer stores its whole tile alone."""
    def end(mode, tiles):
        return max(e for *_, e in schedule_timeline(mode, tiles, 4.0, 2.0))

    assert end("persistent", 1) == 5.0 and end("pingpong", 1) == 6.0
    assert end("persistent", 8) == 40.0 and end("pingpong", 8) == 34.0
    for mode in ("persistent", "pingpong"):
        mains = sorted((a, b) for _, kind, _, a, b in schedule_timeline(mode, 6, 4.0, 2.0) if kind == "main loop")
        assert all(b0 <= a1 for (_, b0), (a1, _) in zip(mains[::2 if mode == "persistent" else 1],
                                                        mains[2::2] if mode == "persistent" else mains[1:]))
    with pytest.raises(ValueError):
        schedule_timeline("one_wg", 2, 4.0, 2.0)
