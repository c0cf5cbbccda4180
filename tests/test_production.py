"""Day 13 on the CPU: tile descriptions and their refusals, the entry points of the ``.cu`` file,
the iterator, tile and swizzle choices, the write-coverage model under every swizzle, the
epilogue reference and the refusals of `prepare` with a fused epilogue.

The kernel itself runs in tests/gpu/test_production_gpu.py; tests/test_compile.py builds the file
for every architecture. With nvcc on PATH one test here builds it for sm_90 once more and
compares the ptxas entry names with `INSTANTIATED`.
"""

from __future__ import annotations

import re
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from days import day13_igemm_production as hp
from days.day13_igemm_production import (
    CU_FILE,
    INSTANTIATED,
    ITERATORS,
    MAINLOOP,
    MIN_BLOCKS,
    TILES,
    ProductionConfig,
    TileDescription,
    choose,
    choose_iterator,
    choose_swizzle,
    choose_tile,
    covers,
    iterator_reason,
    make_production,
    production_launches,
    tensor_check,
    tiles_for,
)
from days.kit import blocks
from helpers import compile as hc
from helpers import gpu
from helpers.epilogue import PLAIN, Epilogue
from helpers.launch import prepare, run
from helpers.problem import Conv2dProblem
from helpers.reference import reference_epilogue
from helpers.suites import suite
from helpers.variants import MAX_GRID, Buffer, UnsupportedProblem, get

V = get("igemm_production")
DTYPES = ("fp16", "bf16")
PAIRS = [(t, it) for t, its in INSTANTIATED.items() for it in its]  # (tile name, iterator) instantiated
H200_SMEM = 227 * 1024


def nhwc(dtype: str = "fp16", **kw) -> Conv2dProblem:
    return Conv2dProblem(layout="NHWC", dtype=dtype, **kw)


def pipe_entry_lines() -> list[tuple[int, int, int, int, int, int, int, str, str]]:
    """(BM, BN, BK, WGM, WGN, STAGES, MINB, ITER enum, iterator name) of every ``PIPE_ENTRY(...)`` line."""
    src = hc.kernel_path(CU_FILE).read_text()
    lines = [ln for ln in src.splitlines() if ln.startswith("PIPE_ENTRY(")]
    out = []
    for ln in lines:
        m = re.fullmatch(r"PIPE_ENTRY\((\d+), (\d+), (\d+), (\d+), (\d+), (\d+), (\d+), (\w+), (\w+)\)\s*", ln)
        assert m, f"{CU_FILE}: a PIPE_ENTRY line the Python reader would misread: {ln!r}"
        out.append((*map(int, m.groups()[:7]), m[8], m[9]))
    return out


def expected_entries() -> set[str]:
    return {ProductionConfig(TileDescription.parse(t), it, 0).entry(d) for t, it in PAIRS for d in DTYPES}


# ---- tile descriptions ----------------------------------------------------------------------


@pytest.mark.parametrize("name", TILES)
def test_tile_name_round_trip_and_valid(name):
    t = TileDescription.parse(name)
    assert t.name == name and TileDescription.parse(t.name) == t
    assert t.instruction == hp.INSTRUCTION == (16, 8, 16)
    assert t.reason() is None and t.reason(smem_limit=H200_SMEM) is None
    assert t.threads == 32 * t.warps_m * t.warps_n <= 1024
    assert t.shared_bytes == max(t.stages * (t.bm + t.bn) * t.bk * 2, t.bm * (t.bn + 8) * 4)
    # the kernel's epilogue loop shape (its static_assert): whole rows of 16-byte runs per pass
    assert t.threads % (t.bn // 8) == 0 and t.bm % (t.threads // (t.bn // 8)) == 0


@pytest.mark.parametrize(
    "name, ring, total",
    [
        ("128x128x32_w2x2_s4_b1", 65536, 69632),  # the fp32 staging tile 128 x 136 x 4 B is larger
        ("128x128x64_w2x4_s3_b2", 98304, 98304),  # the ring is larger
        ("64x64x64_w2x2_s4_b1", 65536, 65536),
    ],
)
def test_shared_bytes_values(name, ring, total):
    t = TileDescription.parse(name)
    assert (t.ring_bytes, t.shared_bytes) == (ring, total)
    assert t.accumulators_per_thread == t.bm * t.bn // t.threads <= 128


@pytest.mark.parametrize(
    "tile, limit, expect",
    [
        (TileDescription(64, 64, 32, 2, 2, 4, instruction=(16, 8, 8)), None, "instruction shape (16, 8, 8)"),
        (TileDescription(64, 64, 48, 2, 2, 4), None, "BK = 48"),
        (TileDescription(64, 64, 32, 2, 2, 1), None, "stages = 1"),
        (TileDescription(64, 64, 32, 0, 2, 4), None, "0 x 2 warps: need 1 .. 32 warps"),
        (TileDescription(256, 256, 32, 8, 8, 3), None, "8 x 8 warps: need 1 .. 32 warps"),
        (TileDescription(64, 64, 32, 3, 2, 4), None, "64 x 64 does not split into 3 x 2 warps"),
        (TileDescription(128, 48, 32, 2, 2, 4), None, "warp tile 64 x 24"),
        (TileDescription(16, 64, 32, 1, 4, 4), None, "BM = 16 and BN = 64 must be multiples of it"),
        (TileDescription(256, 256, 32, 2, 2, 3), None, "512 fp32 accumulators per thread"),
        (TileDescription(128, 96, 32, 2, 2, 4), None, "the epilogue stores rows of 12 16-byte runs"),
        (
            TileDescription(128, 128, 32, 2, 2, 4),
            48 * 1024,
            "needs 69632 B of shared memory per block; the limit is 49152 B",
        ),
        (TileDescription(64, 128, 32, 2, 2, 4), None, f"{CU_FILE} has no entry point for 64x128x32_w2x2_s4_b1"),
        (TileDescription(64, 64, 64, 2, 2, 3), None, "no entry point for 64x64x64_w2x2_s3_b1"),
        (TileDescription(128, 128, 32, 2, 2, 4, 3), None, "min_blocks = 3: 3 blocks of 128 threads leave 170"),
        (TileDescription(128, 128, 32, 2, 4, 4, 3), None, "min_blocks = 3: 3 blocks of 256 threads leave 85"),
        (TileDescription(64, 64, 32, 2, 2, 4, 0), None, "min_blocks = 0"),
    ],
    ids=lambda v: v.name if isinstance(v, TileDescription) else None,
)
def test_invalid_descriptions_name_the_problem(tile, limit, expect):
    reason = tile.reason() if limit is None else tile.reason(smem_limit=limit)
    assert reason is not None and expect in reason, reason
    if limit is None:  # make_production refuses it with the same reason
        with pytest.raises(ValueError, match=re.escape(f"tile {tile.name}: {reason}")):
            make_production(tile=tile)
    else:  # within the largest opt-in: make_production takes it; `supports` checks the device's limit
        p = nhwc(N=1, C=8, H=8, W=8, K=8, R=1, S=1)
        assert make_production(tile=tile).supports(p, smem_limit=limit) is not None
        assert make_production(tile=tile).supports(p, smem_limit=H200_SMEM) is None


def test_not_instantiated_lists_the_instantiated_ones():
    reason = TileDescription.parse("64x128x32_w2x2_s4").reason()
    assert "no entry point" in reason and all(t in reason for t in TILES)


@pytest.mark.parametrize(
    "bad", ["128x128x32", "128x128x32_w2x2", "128x128_w2x2_s4", "axbx32_w2x2_s4", "128x128x32_w2x2_s4 ", ""]
)
def test_parse_refuses_bad_names(bad):
    with pytest.raises(ValueError, match="BMxBNxBK_wWMxWN_sSTAGES_bMINBLOCKS"):
        TileDescription.parse(bad)


# ---- the entry points of the .cu file -------------------------------------------------------


def test_instantiated_list_matches_the_pipe_entry_lines():
    lines = pipe_entry_lines()
    assert len(lines) == sum(len(its) for its in INSTANTIATED.values()) == len(PAIRS)
    assert len(set(PAIRS)) == len(PAIRS), "a (tile, iterator) pair is instantiated twice"
    assert len(set(TILES)) == len(TILES)
    seen = set()
    for bm, bn, bk, wm, wn, st, mb, enum, itname in lines:
        assert enum.lower() == itname, f"PIPE_ENTRY(..., {enum}, {itname}): the name does not match the iterator"
        assert itname in ITERATORS
        t = TileDescription(bm, bn, bk, wm, wn, st, mb)
        assert itname in INSTANTIATED[t.name]
        seen.add((t.name, itname))
    assert seen == set(PAIRS)
    for it in ITERATORS:
        assert tiles_for(it), f"no tile instantiated with the {it} iterator"
        assert {t.name for t in tiles_for(it)} == {t for t, its in INSTANTIATED.items() if it in its}


def test_entry_names_follow_the_macro():
    src = hc.kernel_path(CU_FILE).read_text()
    flat = re.sub(r"\s+", "", src)
    assert "igemm_production_##BM##x##BN##x##BK##_w##WGM##x##WGN##_s##ST##_b##MINB##_##ITNAME##_##DT(" in flat
    assert "__launch_bounds__(32*WGM*WGN,MINB)" in flat
    assert "PIPE_ENTRY_T(BM,BN,BK,WGM,WGN,ST,MINB,ITER,ITNAME,false,fp16)" in flat
    assert "PIPE_ENTRY_T(BM,BN,BK,WGM,WGN,ST,MINB,ITER,ITNAME,true,bf16)" in flat
    entries = expected_entries()
    assert len(entries) == 2 * len(PAIRS)
    for e in entries:
        assert re.fullmatch(
            r"igemm_production_\d+x\d+x\d+_w\d+x\d+_s\d+_b\d+_(analytic|optimized|few_channels)_(fp16|bf16)", e
        )
    for t, it in PAIRS:
        for d in DTYPES:
            v = make_production(tile=t, iterator=it)
            p = nhwc(d, N=1, C=8 if it != "analytic" else 12, H=6, W=6, K=8, R=3, S=3, padding=1)
            if it == "few_channels":
                p = replace(p, C=3, name="")
            assert v.supports(p, smem_limit=H200_SMEM) is None
            assert v.entry_for(p) == f"igemm_production_{t}_{it}_{d}" and v.entry_for(p) in entries


def test_kernel_arguments_match_the_launch_by_name():
    """The launch's arguments have the kernel's names, types and order (pycuda passes them raw):
    pointers as Buffers named like the kernel's parameters, scalars of the kernel's types."""
    src = hc.kernel_path(CU_FILE).read_text()
    body = src.split("#define PIPE_ENTRY_T", 1)[1].replace("\\\n", " ")
    params = re.search(r"##_##DT\((.*?)\)\s*\{", body, re.S)[1]
    decls = [d.strip() for d in params.split(",")]
    names = [d.split()[-1].lstrip("*") for d in decls]

    def kind(decl: str):
        return Buffer if "*" in decl else np.float32 if decl.startswith("float") else np.int32

    p = nhwc(N=2, C=16, H=9, W=7, K=24, R=3, S=2, stride=(2, 1), padding=(1, 0), dilation=(1, 2))
    cfg = ProductionConfig(TileDescription.parse("64x64x32_w2x2_s4"), "optimized", 3)
    (launch,) = production_launches(p, Epilogue(alpha=2.0, beta=-1.0, relu=True), cfg)
    args = launch.args
    assert [kind(d) for d in decls] == [type(a) for a in args]
    got = {nm: (a.name if isinstance(a, Buffer) else a.item()) for nm, a in zip(names, args)}
    assert got == {
        "x": "x", "w": "w", "y": "y",
        "N": 2, "C": 16, "H": 9, "W": 7, "K": 24, "R": 3, "S": 2, "P": p.P, "Q": p.Q, "sh": 2, "sw": 1,
        "ph": 1, "pw": 0, "dh": 1, "dw": 2, "cin": "cin", "bias": "bias", "alpha": 2.0, "beta": -1.0,
        "relu": 1, "swz_log": 3,
    }
    (plain,) = production_launches(p, PLAIN, cfg)
    assert [a.item() for a in plain.args[20:23]] == [1.0, 0.0, 0]


@pytest.fixture(scope="module")
def sm90_build():
    return hc.nvcc_compile(CU_FILE, arch="sm_90")


@pytest.mark.nvcc
def test_sm90_build_has_exactly_the_instantiated_entries(sm90_build):
    reports, log = sm90_build
    by_entry = {r.entry: r for r in reports}
    assert set(by_entry) == expected_entries(), log
    for r in reports:
        assert r.registers > 0, r
        assert (r.spill_stores, r.spill_loads, r.stack_bytes) == (0, 0, 0), f"{r.entry} spills: {r}"


# ---- iterators ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "C, iterator",
    [(64, "optimized"), (8, "optimized"), (16, "optimized"), (40, "optimized"), (1, "few_channels"),
     (3, "few_channels"), (5, "few_channels"), (7, "few_channels"), (9, "analytic"), (12, "analytic"),
     (45, "analytic")],
)
def test_choose_iterator(C, iterator):
    p = nhwc(N=1, C=C, H=8, W=8, K=16, R=3, S=3, padding=1)
    assert choose_iterator(p) == iterator
    assert iterator_reason(p, iterator) is None
    assert iterator_reason(p, "analytic") is None  # analytic takes any C
    assert choose(p).iterator == iterator


def test_iterator_reason_refusals():
    c45 = nhwc(N=1, C=45, H=8, W=8, K=16, R=3, S=3, padding=1)
    c16 = replace(c45, C=16, name="")
    reason = iterator_reason(c45, "optimized")
    assert "C % 8 == 0" in reason and "C = 45" in reason
    reason = iterator_reason(c16, "few_channels")
    assert "C <= 8" in reason and "C = 16" in reason
    assert "choose one of analytic, optimized, few_channels" in iterator_reason(c16, "bogus")
    assert iterator_reason(replace(c45, C=8, name=""), "few_channels") is None


@pytest.mark.parametrize("R, S", [(17, 1), (1, 17), (17, 17)])
def test_optimized_iterator_needs_16_filter_rows_and_columns(R, S):
    """Its tap masks keep one bit per filter row and column: a larger filter goes to analytic."""
    p = nhwc(N=1, C=16, H=20, W=20, K=16, R=R, S=S)
    reason = iterator_reason(p, "optimized")
    assert "R, S <= 16" in reason and f"R = {R}, S = {S}" in reason
    assert choose_iterator(p) == "analytic" and choose(p).iterator == "analytic"
    assert V.supports(p, smem_limit=H200_SMEM) is None
    assert choose_iterator(replace(p, C=8, name="")) == "few_channels"  # C <= 8 keeps its packed walk
    edge = nhwc(N=1, C=16, H=20, W=20, K=16, R=16, S=16)
    assert iterator_reason(edge, "optimized") is None and choose_iterator(edge) == "optimized"
    big = make_production(name="big17", tile="128x128x64_w2x2_s3_b1")  # only built with optimized
    reason = big.supports(p, smem_limit=H200_SMEM)
    assert "not instantiated with the analytic iterator" in reason and "optimized: " in reason
    assert "R, S <= 16" in reason
    forced = make_production(name="opt17", iterator="optimized")
    assert "R, S <= 16" in forced.supports(p, smem_limit=H200_SMEM)
    x, w = p.make_inputs()  # CPU tensors: the problem is refused before they are looked at
    with pytest.raises(UnsupportedProblem, match=re.escape("R, S <= 16")):
        run(forced, p, x, w)


# ---- forced choices -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, expect",
    [
        ({"tile": "64x128x32_w2x2_s4"}, "tile 64x128x32_w2x2_s4_b1: 13_igemm_production.cu has no entry point"),
        ({"tile": "256x256x32_w2x2_s3"}, "512 fp32 accumulators"),
        ({"tile": TileDescription(64, 64, 32, 2, 2, 4, instruction=(16, 8, 8))}, "instruction shape"),
        ({"tile": "64x64"}, "a tile name looks like"),
        ({"iterator": "bogus"}, "iterator 'bogus': choose one of"),
        ({"swizzle": 5}, "swizzle = 5"),
        ({"swizzle": -1}, "swizzle = -1"),
    ],
)
def test_make_production_refuses(kw, expect):
    with pytest.raises(ValueError, match=re.escape(expect)):
        make_production(**kw)


def test_forced_iterator_refused_per_problem():
    c3 = nhwc(N=2, C=3, H=16, W=16, K=64, R=3, S=3, padding=1)
    c64 = replace(c3, C=64, name="")
    reason = make_production(iterator="optimized").supports(c3, smem_limit=2**31)
    assert reason.startswith("igemm_production: ") and "C % 8 == 0" in reason and "C = 3" in reason
    assert "C <= 8" in make_production(iterator="few_channels").supports(c64, smem_limit=2**31)
    forced = make_production(name="forced_analytic", iterator="analytic")
    assert forced.supports(c64, smem_limit=2**31) is None
    assert forced.entry_for(c64).endswith("_analytic_fp16") and "iterator=analytic" in forced.summary
    assert V.entry_for(c64).endswith("_optimized_fp16") and V.entry_for(c3).endswith("_few_channels_fp16")
    # a forced tile whose entry exists for another iterator only
    reason = make_production(tile="256x64x32_w4x2_s4").supports(c3, smem_limit=2**31)
    assert "256x64x32_w4x2_s4_b1 is not instantiated with the few_channels iterator" in reason
    assert make_production(tile="256x64x32_w4x2_s4").supports(c64, smem_limit=2**31) is None


def test_refusals_of_the_variant():
    ok = nhwc(N=1, C=8, H=8, W=8, K=8, R=3, S=3, padding=1)
    assert V.supports(ok) is None and V.supports(replace(ok, dtype="bf16", name="")) is None
    assert "dtype fp16/bf16; got fp32" in V.supports(replace(ok, dtype="fp32", name=""))
    assert "layout NHWC; got NCHW" in V.supports(replace(ok, layout="NCHW", name=""))
    assert "groups=1; got 2" in V.supports(replace(ok, groups=2, name=""))
    # the CPU default limit (48 KB without opt-in) refuses the large tiles; 227 KB takes them
    big = make_production(tile="256x64x32_w4x2_s4")  # 4 stages of (256 + 64) x 32 halves: 80 KB
    assert "needs 81920 B of shared memory per block; the limit is 49152 B" in big.supports(ok, smem_limit=48 * 1024)
    assert big.supports(ok, smem_limit=H200_SMEM) is None
    for p in suite("resnet50", dtype="fp16", layout="NHWC")[:4]:  # the limit named: a GPU's default is its opt-in
        reason = V.supports(p, smem_limit=48 * 1024)
        assert (reason is None) == (V.launch(p).shared_bytes <= 48 * 1024), (p.name, reason)


def test_unsupported_forced_iterator_refused_before_the_tensors():
    """`run` refuses a problem the forced iterator cannot take before looking at the tensors."""
    p = nhwc(N=1, C=64, H=8, W=8, K=64, R=3, S=3, padding=1)
    x, w = p.make_inputs()  # CPU tensors: check_tensors would say so, but the problem is refused first
    v = make_production(name="few64", tile="64x64x32_w2x2_s4", iterator="few_channels")
    with pytest.raises(UnsupportedProblem, match="few_channels iterator is for C <= 8; got C = 64"):
        run(v, p, x, w)


# ---- tensor checks --------------------------------------------------------------------------


def test_tensor_check_alignment(misaligned):
    p = nhwc(N=1, C=16, H=6, W=6, K=16, R=3, S=3, padding=1)
    x, w = p.make_inputs()
    y = torch.empty(p.y_shape, dtype=torch.float16)
    opt = ProductionConfig(TileDescription.parse("64x64x32_w2x2_s4"), "optimized", 0)
    ana = replace(opt, iterator="analytic")
    assert tensor_check(p, {"x": x, "w": w, "y": y}, PLAIN, opt) is None
    assert tensor_check(p, {"x": x, "w": w, "y": None}, PLAIN, opt) is None
    assert "x.data_ptr() is not 16-byte aligned" in tensor_check(p, {"x": misaligned(x), "w": w, "y": y}, PLAIN, opt)
    assert "w.data_ptr() is not 16-byte aligned" in tensor_check(p, {"x": x, "w": misaligned(w), "y": y}, PLAIN, opt)
    assert "y.data_ptr() is not 16-byte aligned" in tensor_check(p, {"x": x, "w": w, "y": misaligned(y)}, PLAIN, opt)
    assert tensor_check(p, {"x": misaligned(x), "w": misaligned(w), "y": y}, PLAIN, ana) is None  # element loads
    assert "y.clone()" in tensor_check(p, {"x": misaligned(x), "w": misaligned(w), "y": misaligned(y)}, PLAIN, ana)
    p7 = replace(p, K=7, name="")  # K % 8 != 0: y stored element by element
    x7, w7 = p7.make_inputs()
    y7 = misaligned(torch.empty(p7.y_shape, dtype=torch.float16))
    assert tensor_check(p7, {"x": misaligned(x7), "w": misaligned(w7), "y": y7}, PLAIN, ana) is None


# ---- launch and coverage --------------------------------------------------------------------

COVER_PROBLEMS = [
    nhwc(N=2, C=64, H=15, W=13, K=70, R=3, S=3, padding=1),  # M = 390, K = 70: neither divides a tile
    nhwc(N=3, C=40, H=9, W=11, K=34, R=2, S=3, padding=(1, 0), stride=2, dilation=(1, 2)),
    nhwc(N=1, C=8, H=7, W=5, K=7, R=1, S=1),  # K odd and smaller than every BN, M = 35
    nhwc(N=2, C=16, H=20, W=19, K=300, R=3, S=3, padding=1),  # K = 300: 5 filter tiles of 64, 3 of 128, 2 of 256
    nhwc(N=1, C=24, H=16, W=16, K=257, R=1, S=1),  # M = 256 exactly, K one past 256
    nhwc(N=2, C=3, H=32, W=28, K=64, R=7, S=7, padding=3, stride=2),  # a stem
    nhwc(N=1, C=45, H=19, W=21, K=33, R=3, S=3, padding=1),
    nhwc(N=1, C=1, H=1, W=1, K=1, R=1, S=1),  # one output element
]


def brute_force_covers(p: Conv2dProblem, grid: tuple[int, int, int], cfg: ProductionConfig) -> np.ndarray:
    """The kernel's block -> tile mapping, block by block, as written in the .cu file."""
    t, lg = cfg.tile, cfg.swizzle
    counts = np.zeros((p.gemm.m, p.K), dtype=np.int64)
    for bx in range(grid[0]):
        for by in range(grid[1]):
            tile_m, tile_n = bx >> lg, (by << lg) + (bx & ((1 << lg) - 1))
            if tile_n * t.bn >= p.K:
                continue
            counts[tile_m * t.bm : (tile_m + 1) * t.bm, tile_n * t.bn : (tile_n + 1) * t.bn] += 1
    return counts.ravel()


@pytest.mark.parametrize("tile, iterator", PAIRS, ids=[f"{t}-{it}" for t, it in PAIRS])
def test_every_output_written_once(tile, iterator):
    t = TileDescription.parse(tile)
    claimed = 0
    for p in COVER_PROBLEMS:
        for s in range(4):
            v = make_production(tile=tile, iterator=iterator, swizzle=s)
            if v.supports(p, smem_limit=H200_SMEM) is not None:
                assert iterator_reason(p, iterator), (p.name, v.supports(p, smem_limit=H200_SMEM))
                continue
            claimed += 1
            cfg = v.launch(p)
            m_tiles, n_tiles = -(-p.gemm.m // t.bm), -(-p.K // t.bn)
            assert cfg.grid == (m_tiles << s, -(-n_tiles // 2**s), 1)
            assert cfg.block == (t.threads, 1, 1) and cfg.shared_bytes == t.shared_bytes
            assert all(1 <= g <= lim for g, lim in zip(cfg.grid, MAX_GRID))
            counts = np.asarray(v.plan(p).covers(cfg))
            assert counts.shape == (p.N * p.P * p.Q * p.K,)
            assert (counts == 1).all(), (
                f"{p.name} swizzle {s}: {(counts == 0).sum()} unwritten, {(counts > 1).sum()} twice"
            )
            if n_tiles % 2**s:  # some blocks of the last grid row have no filter tile: they must write nothing
                assert cfg.grid[0] * cfg.grid[1] > m_tiles * n_tiles
    assert claimed >= 4


def test_swizzle_leaves_blocks_idle_when_filter_tiles_do_not_fill_the_group():
    p = COVER_PROBLEMS[3]  # K = 300, BN = 64: 5 filter tiles
    v = make_production(tile="64x64x32_w2x2_s4", swizzle=3)
    cfg = v.launch(p)
    m_tiles = -(-p.gemm.m // 64)
    assert cfg.grid == (m_tiles * 8, 1, 1)  # 8 filter-tile slots per A tile, 3 of them past K
    assert (np.asarray(v.covers(p)) == 1).all()


@pytest.mark.parametrize("swizzle", [0, 1, 2, 3])
def test_covers_model_follows_the_swizzle(swizzle):
    """On shortened grids the model agrees with a block-by-block replay of the kernel's mapping."""
    p = COVER_PROBLEMS[3]
    cfg = choose(p, tile="64x64x32_w2x2_s4", swizzle=swizzle)
    full = cfg.launch(p)
    assert np.array_equal(covers(p, full, cfg), brute_force_covers(p, full.grid, cfg))
    for gx, gy in ((full.grid[0] - 1, full.grid[1]), (full.grid[0], max(1, full.grid[1] - 1)), (1, 1)):
        short = replace(full, grid=(gx, gy, 1))
        model = covers(p, short, cfg)
        assert np.array_equal(model, brute_force_covers(p, short.grid, cfg)), (gx, gy)
        assert model.max() <= 1
    # dropping the last block in x leaves exactly the last tile_n of the last A tile unwritten
    short = replace(full, grid=(full.grid[0] - 1, full.grid[1], 1)) if swizzle else None
    if short is not None:
        counts = covers(p, short, cfg).reshape(p.gemm.m, p.K)
        last_m = (full.grid[0] - 1) >> swizzle
        missing = [((by << swizzle) + (1 << swizzle) - 1) for by in range(full.grid[1])]
        for tn in missing:
            if tn * 64 < p.K:
                assert (counts[last_m * 64 :, tn * 64 : (tn + 1) * 64] == 0).all()


def test_covers_on_the_edge_suite():
    """The automatic choice on the NHWC edge suite (tests/test_variants.py runs it in fp16 through
    `Variant.adapt`, with the 48 KB limit; here in bf16 with the H200's limit)."""
    claimed = 0
    for p in suite("edge", dtype="bf16", layout="NHWC"):
        if V.supports(p, smem_limit=H200_SMEM) is not None:
            assert p.groups > 1, V.supports(p, smem_limit=H200_SMEM)
            continue
        cfg = V.launch(p)
        assert all(1 <= g <= lim for g, lim in zip(cfg.grid, MAX_GRID)), (p.name, cfg)
        t = choose(p).tile
        if -(-p.gemm.m // t.bm) * t.bm * -(-p.K // t.bn) * t.bn > 2**24:  # the model's padded array
            continue
        claimed += 1
        assert (np.asarray(V.covers(p)) == 1).all(), p.name
    assert claimed >= 14


# ---- tile and swizzle choice ----------------------------------------------------------------


@pytest.mark.parametrize("iterator", [None, "analytic"])
def test_k64_picks_a_64_wide_tile(iterator):
    for n in (1, 2, 32, 256):
        p = nhwc(N=n, C=64, H=56, W=56, K=64, R=3, S=3, padding=1)
        t = choose_tile(p, iterator)
        assert t.bn == 64 and t.reason() is None
        assert (iterator or "optimized") in INSTANTIATED[t.name]


def test_choose_tile_on_resnet50():
    for p in suite("resnet50", dtype="fp16", layout="NHWC"):
        t = choose_tile(p)
        assert t.reason() is None, (p.name, t.name)
        assert choose_iterator(p) in INSTANTIATED[t.name]
        assert V.supports(p, smem_limit=H200_SMEM) is None, p.name
        assert blocks(p, t) >= MIN_BLOCKS or t.name in ("64x64x64_w2x2_s4_b1", "128x64x32_w2x2_s4_b1"), (p.name, t.name)
        if p.K <= 64:
            assert t.bn == 64, p.name


def test_large_k_layers_take_the_64x64_warp_tile():
    p = nhwc(N=256, C=256, H=14, W=14, K=256, R=3, S=3, padding=1)  # 784 tiles of 128 x 128
    assert choose_tile(p).name == "128x128x64_w2x2_s3_b1"
    small = nhwc(N=1, C=256, H=14, W=14, K=256, R=3, S=3, padding=1)  # 4 tiles: more, smaller blocks
    assert choose_tile(small).name == "64x64x64_w2x2_s4_b1"


@pytest.mark.parametrize(
    "name, iterator, expect",
    [
        ("128x64x32_w2x2_s4_b1", "optimized", True),  # 64 x 32 warp tiles, cap 512
        ("128x128x32_w2x4_s4_b2", "optimized", False),  # 64 x 32 warp tiles, but held to 128 registers
        ("128x128x64_w2x4_s3_b2", "optimized", False),
        ("128x128x32_w2x2_s4_b1", "optimized", True),  # 64 x 64, cap 255, 4 + 4 chunk rows
        ("128x128x64_w2x2_s3_b1", "optimized", True),  # 64 x 64, cap 255, 8 + 8 chunk rows
        ("16x256x32_w1x1_s2", "optimized", False),  # 2 + 32 chunk rows: more than 16
        ("128x64x32_w2x2_s4_b1", "analytic", False),  # register-staged loads: the plain loop
        ("128x128x32_w2x4_s4_b1", "optimized", True),  # 8 warps of 64 x 32, cap 256
        ("256x64x32_w4x2_s4_b1", "optimized", True),
        ("64x64x32_w2x2_s4_b1", "optimized", True),  # 32 x 32 warp tiles
        ("64x64x64_w2x2_s4_b1", "optimized", True),
        ("128x128x32_w2x2_s4_b1", "few_channels", False),
        ("128x128x32_w2x2_s4", "optimized", True),
        ("128x128x48_w2x2_s4", "optimized", False),  # BK = 48: not a shape the kernel builds
    ],
)
def test_fragment_double_buffering_mirrors_the_kernel(name, iterator, expect):
    assert TileDescription.parse(name).fragment_double_buffering(iterator) is expect


def test_frag_db_condition_is_the_kernels():
    src = hc.kernel_path(MAINLOOP).read_text()
    line = next(ln.strip() for ln in src.splitlines() if "constexpr bool FRAG_DB" in ln)
    assert line == (
        "constexpr bool FRAG_DB = ASYNC && ((MI * NJ * 4 <= 64 && REG_CAP >= 160) || "
        "(REG_CAP >= 255 && A_PER + B_PER <= 16));"
    ), "the kernel's FRAG_DB changed: update TileDescription.fragment_double_buffering and this test"


@pytest.mark.parametrize("C", [1, 3, 12, 45])
def test_choose_tile_for_element_iterators(C):
    for n in (1, 64):
        p = nhwc(N=n, C=C, H=56, W=56, K=64, R=3, S=3, padding=1)
        t = choose_tile(p)
        assert t.name in ("128x64x32_w2x2_s4_b1", "64x64x32_w2x2_s4_b1") and choose_iterator(p) in INSTANTIATED[t.name]
        assert (t.bm == 128) == (blocks(p, TileDescription.parse("128x64x32_w2x2_s4")) >= MIN_BLOCKS)


@pytest.mark.parametrize("K, expect", [(1, 0), (64, 0), (65, 1), (128, 1), (129, 2), (300, 2), (70000, 2)])
def test_choose_swizzle(K, expect):
    p = nhwc(N=1, C=8, H=8, W=8, K=K, R=1, S=1)
    assert choose_swizzle(p, TileDescription.parse("64x64x32_w2x2_s4")) == expect


# ---- the epilogue reference -----------------------------------------------------------------


def _epilogue_operands(p: Conv2dProblem, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    cin = torch.randn(p.y_shape, generator=g).to(p.torch_dtype)
    bias = torch.randn((p.K,), generator=g).to(p.torch_dtype)
    return cin, bias


EPI_PROBLEM = nhwc(N=2, C=5, H=9, W=8, K=6, R=3, S=2, padding=(1, 0), stride=(1, 2), dilation=(2, 1))


def test_reference_epilogue_by_hand():
    p = EPI_PROBLEM
    x, w = p.make_inputs(device="cpu", seed=1)
    cin, bias = _epilogue_operands(p)
    xd, wd = p.to_nchw(x).double(), p.w_to_kcrs(w).double()
    conv = F.conv2d(xd, wd, **p.torch_kwargs())
    cin4 = p.to_nchw(cin).double()
    ep = Epilogue(alpha=2.0, beta=-1.0, relu=True)
    want = (2.0 * conv - cin4 + bias.double()[None, :, None, None]).clamp_min(0)
    got = reference_epilogue(p, x, w, ep, cin, bias)
    assert got.dtype == torch.float64 and got.shape == (p.N, p.K, p.P, p.Q)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert (got == 0).any() and (got > 0).any()  # the ReLU did something
    scale = reference_epilogue(p, x, w, ep, cin, bias, absolute=True)
    want_abs = (
        2.0 * F.conv2d(xd.abs(), wd.abs(), **p.torch_kwargs()) + cin4.abs() + bias.double().abs()[None, :, None, None]
    )
    torch.testing.assert_close(scale, want_abs, rtol=1e-12, atol=1e-12)
    assert (scale >= got.abs() - 1e-9).all()


def test_reference_epilogue_defaults_and_unused_operands():
    p = EPI_PROBLEM
    x, w = p.make_inputs(device="cpu", seed=2)
    cin, bias = _epilogue_operands(p)
    conv = F.conv2d(p.to_nchw(x).double(), p.w_to_kcrs(w).double(), **p.torch_kwargs())
    torch.testing.assert_close(reference_epilogue(p, x, w, Epilogue()), conv, rtol=1e-12, atol=1e-12)
    # beta = 0: cin is not read; no relu: negative outputs stay
    got = reference_epilogue(p, x, w, Epilogue(alpha=0.5), cin * float("nan"), bias)
    torch.testing.assert_close(got, 0.5 * conv + bias.double()[None, :, None, None], rtol=1e-12, atol=1e-12)
    assert (got < 0).any()


# ---- fused-epilogue refusals of prepare -----------------------------------------------------------------


def test_fused_refuses_cpu_tensors():
    p = nhwc(N=1, C=8, H=6, W=6, K=8, R=3, S=3, padding=1)
    x, w = p.make_inputs()
    with pytest.raises(ValueError, match="kernels need CUDA tensors"):
        prepare(V, p, x, w)
    cin, bias = _epilogue_operands(p)
    with pytest.raises(ValueError, match="kernels need CUDA tensors"):
        prepare(V, p, x, w, cin=cin, bias=bias, epilogue=Epilogue(beta=1.0))


def test_operands_and_epilogues_only_where_a_variant_fuses_them(no_gpu_checks):
    p = nhwc(N=1, C=8, H=6, W=6, K=8, R=3, S=3, padding=1)
    x, w = p.make_inputs()
    cin, bias = _epilogue_operands(p)
    with pytest.raises(ValueError, match="igemm_mma reads no cin, bias; the operands it takes: none"):
        prepare("igemm_mma", p, x, w, cin=cin, bias=bias)
    with pytest.raises(ValueError, match="igemm_mma fuses no epilogue"):
        prepare("igemm_mma", p, x, w, epilogue=Epilogue(relu=True))
    with pytest.raises(TypeError, match="unknown operands"):
        prepare(V, p, x, w, residual=cin)
    with pytest.raises(_Compiled):  # None operands and the plain epilogue are what every variant takes
        prepare("igemm_mma", p, x, w, cin=None, epilogue=Epilogue())


class _Compiled(Exception):
    """Raised by the stand-in `load_kernel`: every check before the compile passed."""


@pytest.fixture
def no_gpu_checks(monkeypatch):
    """CPU tensors pass `check_tensors`, the device is a stand-in H200 on the default stream, and
    compiling raises `_Compiled`: every other check of `prepare` runs for real."""
    monkeypatch.setattr("helpers.launch.check_tensors", lambda *a, **k: None)
    monkeypatch.setattr(gpu, "device_info", lambda: SimpleNamespace(smem_per_block_optin=H200_SMEM, cc=(9, 0)))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(cuda_stream=0))

    def compiled(*a, **k):
        raise _Compiled

    monkeypatch.setattr(hc, "load_kernel", compiled)


def test_fused_operand_refusals(no_gpu_checks):
    p = nhwc(N=2, C=8, H=6, W=5, K=12, R=3, S=3, padding=1)
    x, w = p.make_inputs()
    cin, bias = _epilogue_operands(p)
    ep = Epilogue(alpha=1.0, beta=1.0)
    with pytest.raises(_Compiled):  # everything right: it gets as far as compiling
        prepare(V, p, x, w, cin=cin, bias=bias, epilogue=ep)
    with pytest.raises(_Compiled):  # beta = 0 needs no cin
        prepare(V, p, x, w, cin=None, bias=bias, epilogue=Epilogue(alpha=3.0, relu=True))
    bad_cin = [
        (torch.zeros(p.N, p.P, p.Q, p.K + 1, dtype=torch.float16), ValueError, "cin must be a contiguous"),
        (p.to_nchw(cin), ValueError, "not contiguous"),  # NCHW view of the right numbers
        (cin.float(), ValueError, "cin must be a contiguous torch.float16"),
        (cin.numpy(), TypeError, "cin must be a torch.Tensor or None; got ndarray"),
    ]
    for bad, exc, msg in bad_cin:
        with pytest.raises(exc, match=re.escape(msg)):
            prepare(V, p, x, w, cin=bad, bias=bias, epilogue=ep)
    for bad, exc, msg in [
        (torch.zeros(p.K + 1, dtype=torch.float16), ValueError,
         f"bias must be a contiguous torch.float16 tensor of shape ({p.K},)"),
        (torch.zeros(1, p.K, dtype=torch.float16), ValueError, "bias must be"),
        (bias.to(torch.bfloat16), ValueError, "bias must be"),
        ([0.0] * p.K, TypeError, "bias must be a torch.Tensor or None; got list"),
    ]:
        with pytest.raises(exc, match=re.escape(msg)):
            prepare(V, p, x, w, cin=cin, bias=bad, epilogue=ep)
    with pytest.raises(ValueError, match=r"epilogue beta = 2.0 needs cin"):
        prepare(V, p, x, w, cin=None, bias=bias, epilogue=Epilogue(beta=2.0))


def test_fused_cin_alignment(no_gpu_checks, misaligned):
    """Cin is read in 16-byte runs when K % 8 == 0: a misaligned Cin is refused then, and accepted
    when it is not read (beta = 0) or read element by element (K % 8 != 0)."""
    p = nhwc(N=2, C=8, H=6, W=5, K=16, R=3, S=3, padding=1)
    x, w = p.make_inputs()
    cin, bias = _epilogue_operands(p)
    with pytest.raises(ValueError, match=r"cin\.data_ptr\(\) is not 16-byte aligned"):
        prepare(V, p, x, w, cin=misaligned(cin), bias=bias, epilogue=Epilogue(beta=1.0))
    with pytest.raises(_Compiled):
        prepare(V, p, x, w, cin=misaligned(cin), bias=bias, epilogue=Epilogue(beta=0.0))
    p_odd = nhwc(N=2, C=8, H=6, W=5, K=12, R=3, S=3, padding=1)
    x, w = p_odd.make_inputs()
    cin, bias = _epilogue_operands(p_odd)
    with pytest.raises(_Compiled):
        prepare(V, p_odd, x, w, cin=misaligned(cin), bias=bias, epilogue=Epilogue(beta=1.0))


def test_fused_refuses_aliasing(no_gpu_checks):
    """y is written while other blocks read x, w, bias and Cin: shared memory is refused, except
    Cin being exactly y (in place)."""
    p = nhwc(N=1, C=8, H=6, W=6, K=8, R=1, S=1)  # 1x1, C == K: x and y have one shape
    x, w = p.make_inputs()
    cin, bias = _epilogue_operands(p)
    ep = Epilogue(alpha=1.0, beta=1.0)
    with pytest.raises(ValueError, match="y overlaps x in memory"):
        prepare(V, p, x, w, cin=cin, bias=bias, epilogue=ep, out=x)
    big = torch.zeros(2 * cin.numel(), dtype=cin.dtype)
    y, shifted = big[: cin.numel()].view(cin.shape), big[64 : 64 + cin.numel()].view(cin.shape)
    with pytest.raises(ValueError, match="cin overlaps y without being y"):
        prepare(V, p, x, w, cin=shifted, bias=bias, epilogue=ep, out=y)
    with pytest.raises(ValueError, match="y overlaps bias in memory"):
        prepare(V, p, x, w, cin=cin, bias=y.view(-1)[: p.K], epilogue=ep, out=y)
    with pytest.raises(_Compiled):  # in place: Cin is y itself
        prepare(V, p, x, w, cin=y, bias=bias, epilogue=ep, out=y)
    with pytest.raises(_Compiled):  # Cin may share memory with the inputs: all of them are only read
        prepare(V, p, x, w, cin=x.clone().view(cin.shape), bias=bias, epilogue=ep, out=torch.zeros_like(cin))


@pytest.mark.parametrize(
    "ep, msg",
    [(Epilogue(alpha=1e39), "alpha = 1e+39 is inf in float32"), (Epilogue(alpha=float("nan")), "alpha = nan"),
     (Epilogue(beta=1e-50), "beta = 1e-50 is 0.0 in float32")],
)
def test_fused_refuses_scalars_float32_cannot_carry(no_gpu_checks, ep, msg):
    p = nhwc(N=1, C=8, H=6, W=6, K=8, R=3, S=3, padding=1)
    x, w = p.make_inputs()
    cin, bias = _epilogue_operands(p)
    with pytest.raises(ValueError, match=re.escape(msg)):
        prepare(V, p, x, w, cin=cin, bias=bias, epilogue=ep)


def test_kernel_32_bit_walk_limits():
    """GEMM-K walks in steps of BK, and the input row/column tested is origin + tap offset: both are
    32-bit in the kernel, so problems where they would wrap are refused (the automatic variant and
    a forced BK = 64 tile)."""
    wide_c = nhwc(N=1, C=2**31 - 32, H=1, W=1, K=1, R=1, S=1)
    assert "plus two BK = 64 steps" in make_production(tile="64x64x64_w2x2_s4_b1").supports(wide_c, smem_limit=2**31)
    far = nhwc(N=1, C=8, H=4, W=1, K=8, R=3, S=1, stride=(2**20, 1), padding=(2**31 - 1, 0), dilation=(2**30 + 1, 1))
    assert "input rows" in V.supports(far, smem_limit=2**31)
    assert hp.int32_walk_reason(nhwc(N=1, C=8, H=8, W=8, K=8, R=3, S=3, padding=1), 64) is None
