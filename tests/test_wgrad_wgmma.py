"""Day 19 on the CPU: wgrad on Hopper's wgmma/TMA loop (`days.day19_wgrad_wgmma`;
tests/gpu/test_wgrad_wgmma_gpu.py runs the kernels).

* the MN-major SW128 descriptor: 19_wgrad_wgmma.cu's ``sw128_mn_desc`` expression evaluated here packs
  the fields `decode_desc` reads; a slot placed as the copy engine writes it (128-byte swizzle,
  one box after the other) and read back through the descriptors the kernel's ``mma_step`` builds
  gives exactly the logical A (64 filters x 16 pixels) and B (16 pixels x BN channels) of every k16
  slice, every m-tile and consumer, every 64-wide channel chunk, every ring slot, for every entry;
  planted faults (K-major slice steps, CUTLASS's default LBO for an atom-interleaved tile, swapped
  LBO / SBO, no swizzle) are caught;
* the whole main loop on the CPU (`main_model`: units, ring slots, the simulated shared memory and
  descriptors, the stores) then the reduction (`reduce_model`) give the float64 reference exactly on
  integer inputs (fp16 and bf16: strided, dilated, padded, odd sizes, C and K off the tile, N > 1,
  splits 1 to 5, capped grids with several units per block), and within the fp32 bound on normal
  inputs; a skipped k16 slice is caught;
* the split rule (`choose_splits`: the SM count an argument), `split_ranges` (day 14's slices in
  64-pixel steps, none empty), workspace sizes, the launches' arguments, every dw / partial element
  written once (any grid), the fp32-dw option's layout;
* refusals with their reasons (groups, C % 8, K % 8, the im2col map's limits, a fused epilogue,
  op / dtype / layout, misaligned tensors); every ResNet-50 wgrad layer (N = 32, 256) and every
  problem of the ``outside`` suite claimed or refused with a reason;
* the ``.cu`` for sm_90a: its entries, no spills or stack, the setmaxnreg budget within ptxas's
  registers.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
import torch

from days import day19_wgrad_wgmma as d19
from days.day14_backward import split_k_slices
from helpers import compile as hc
from helpers.epilogue import Epilogue
from helpers.launch import prepare
from helpers.problem import Conv2dProblem
from helpers.reference import compare, reference
from helpers.suites import suite
from helpers.tma import MapBytes, TensorMap
from helpers.variants import Buffer, LaunchConfig, get

V = get("wgrad_wgmma")
HOPPER_SMEM = 227 * 1024
rng = np.random.default_rng(19)


def wgrad(dtype: str = "fp16", **kw) -> Conv2dProblem:
    return Conv2dProblem(op="wgrad", dtype=dtype, layout="NHWC", **kw)


# ---- the descriptor -------------------------------------------------------------------------------


def hopper_expression() -> str:
    """The return expression of 19_wgrad_wgmma.cu's ``sw128_mn_desc`` as Python (``uint64_t(v)`` -> ``(v)``)."""
    src = hc.kernel_path(d19.CU_FILE).read_text()
    expr = re.search(r"sw128_mn_desc\(const void\* tile, unsigned lbo\) \{.*?return (.*?);", src, re.S).group(1)
    return re.sub(r"uint64_t\(", "(", " ".join(expr.split()))


@pytest.mark.parametrize("addr, lbo", [(0, 8192), (1024, 8192), (0x9400, 8192), (227 * 1024 - 8192, 1024), (2048, 0)])
def test_the_header_descriptor_is_the_simulated_one(addr, lbo):
    got = eval(hopper_expression(), {"addr": addr, "lbo": lbo})  # noqa: S307 - the header's own expression
    assert got == d19.sw128_mn_desc(addr, lbo)
    f = d19.decode_desc(got)
    assert f == {"start": addr, "lbo": lbo, "sbo": 1024, "base_offset": 0, "layout": 1}


def test_the_swizzle_puts_chunk_j_of_row_r_at_j_xor_r():
    """The copy engine's 128-byte swizzle (helpers/tma.py: chunk j of row r at chunk j ^ (r % 8))."""
    smem = np.zeros(8192, dtype=np.uint16)
    box = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64)
    d19.tma_box_write(smem, 0, box)
    for r in range(64):
        for e in range(64):
            assert smem[(128 * r + 16 * ((e // 8) ^ (r % 8)) + 2 * (e % 8)) // 2] == box[r, e]
    with pytest.raises(ValueError, match="1024-aligned"):
        d19.tma_box_write(smem, 512, box)


def random_stage(tile: d19.WgradWgmmaTile) -> tuple[np.ndarray, np.ndarray]:
    """Distinct 16-bit values: a (64 pixels x bm filters), b (64 pixels x bn channels)."""
    vals = rng.permutation(2**16)[: 64 * (tile.bm + tile.bn)].astype(np.uint16)
    return vals[: 64 * tile.bm].reshape(64, tile.bm), vals[64 * tile.bm:].reshape(64, tile.bn)


@pytest.mark.parametrize("tile", d19.ENTRIES, ids=lambda t: t.name)
def test_mn_major_reads_give_the_logical_operands_of_every_slice(tile):
    """For every ring slot, consumer, m-tile and k16 slice: the descriptors of ``mma_step`` read A =
    dy[pixels 16kk..+15, filters of the m-tile]^T (64 x 16, M-major) and B = x[pixels 16kk..+15,
    all bn channels] (16 x bn, N-major), each 64-wide channel chunk from its own box (LBO)."""
    smem = np.zeros(tile.stages * tile.slot_bytes // 2, dtype=np.uint16)
    for s in range(tile.stages):
        slot = s * tile.slot_bytes
        assert slot % 1024 == 0
        a, b = random_stage(tile)
        d19.place_slot(smem, tile, slot, a, b)
        for g in range(tile.consumers):
            descs = d19.slot_descriptors(tile, slot, g)
            assert [(kk, j) for kk, j, _, _ in descs] == [(kk, j) for kk in range(4) for j in range(tile.mt)]
            for kk, j, da, db in descs:
                m0 = 64 * (tile.mt * g + j)
                want_a = a[16 * kk:16 * kk + 16, m0:m0 + 64].T  # A[m][k]: filters x pixels
                assert np.array_equal(d19.wgmma_read(smem, da, 64), want_a), (s, g, kk, j)
                got_b = d19.wgmma_read(smem, db, tile.bn)  # [n][k]
                assert np.array_equal(got_b.T, b[16 * kk:16 * kk + 16]), (s, g, kk)
                for chunk in range(tile.bn // 64):  # each 64-channel chunk: its own box, LBO apart
                    f = d19.decode_desc(db)
                    one = d19.sw128_mn_desc(f["start"] + chunk * f["lbo"], f["lbo"])
                    assert np.array_equal(d19.wgmma_read(smem, one, 64).T,
                                          b[16 * kk:16 * kk + 16, 64 * chunk:64 * chunk + 64])


@pytest.mark.parametrize("fault", ["K-major slice step (+32 bytes)", "LBO 1024 (atoms interleaved)",
                                   "LBO and SBO swapped", "SBO 128", "no swizzle"])
def test_planted_descriptor_faults_are_caught(fault):
    tile = d19.BY_NAME["128x256_c2_s4"]
    smem = np.zeros(tile.slot_bytes // 2, dtype=np.uint16)
    a, b = random_stage(tile)
    d19.place_slot(smem, tile, 0, a, b)
    db0 = d19.sw128_mn_desc(tile.bm * 128, d19.LBO_BYTES)
    kk = 1
    want = b[16 * kk:16 * kk + 16].T
    bad = {
        "K-major slice step (+32 bytes)": db0 + 2 * kk,
        "LBO 1024 (atoms interleaved)": d19.sw128_mn_desc(tile.bm * 128 + kk * 2048, 1024),
        "LBO and SBO swapped": d19.sw128_mn_desc(tile.bm * 128 + kk * 2048, 1024, sbo=8192),
        "SBO 128": d19.sw128_mn_desc(tile.bm * 128 + kk * 2048, 8192, sbo=128),
        "no swizzle": (db0 + (kk * 2048 >> 4)) & ~(3 << 62),
    }[fault]
    assert np.array_equal(d19.wgmma_read(smem, db0 + (kk * 2048 >> 4), tile.bn), want)  # the real one
    if fault == "no swizzle":
        with pytest.raises(ValueError, match="128-byte swizzle"):
            d19.wgmma_read(smem, bad, tile.bn)
    else:
        assert not np.array_equal(d19.wgmma_read(smem, bad, tile.bn), want)


def test_descriptor_fields_fit_their_14_bits():
    """The largest ring (every entry's last slot, its last box and slice) stays inside the 14-bit
    start field (256 KB of address), and LBO / SBO are multiples of 16."""
    for t in d19.ENTRIES:
        assert t.shared_bytes <= HOPPER_SMEM
        last = (t.stages - 1) * t.slot_bytes + (t.bm + t.bn) * 128 - 1
        assert last + 1024 < 2**18
        for _, _, da, db in d19.slot_descriptors(t, (t.stages - 1) * t.slot_bytes, t.consumers - 1):
            assert d19.decode_desc(da)["start"] < 2**18 and d19.decode_desc(db)["sbo"] == 1024


# ---- the whole kernel on the CPU ------------------------------------------------------------------

# Problems that break wgrad kernels (day 14's edges that wgrad claims, plus C and K off the tile,
# several channel and filter tiles, a 1x1): (spec, forced tile or None, splits, blocks or None).
MODEL_CASES = [
    (dict(N=2, C=16, H=10, W=9, K=24, R=1, S=1, stride=3), None, 1, None),  # stride > filter
    (dict(N=2, C=8, H=11, W=13, K=16, R=2, S=2, stride=3, padding=1), None, 2, None),
    (dict(N=3, C=16, H=13, W=11, K=8, R=3, S=3, stride=2, padding=1), None, 3, None),  # odd sizes, stride 2
    (dict(N=1, C=16, H=9, W=10, K=16, R=3, S=3, padding=2), "64x256_c1_s4", 1, None),  # padding >= R/2
    (dict(N=2, C=16, H=12, W=15, K=8, R=3, S=3, padding=(1, 2), dilation=(1, 2)), None, 2, 1),
    (dict(N=2, C=8, H=15, W=12, K=24, R=3, S=2, stride=(2, 1), padding=1, dilation=(2, 1)), None, 4, None),
    (dict(N=2, C=136, H=9, W=9, K=200, R=3, S=3, padding=1), "128x128_c2_s6", 2, 5),  # C, K past the tiles
    (dict(N=2, C=136, H=9, W=9, K=200, R=3, S=3, padding=1), "256x128_c2_s4", 1, 2),
    (dict(N=2, C=72, H=17, W=6, K=136, R=1, S=1), "128x256_c2_s4", 3, 1),  # 1x1, one block for every unit
    (dict(N=4, C=8, H=7, W=9, K=8, R=7, S=7, stride=2, padding=3), "64x128_c1_s6", 5, 3),  # a stem-like 7x7
]


def model_run(p: Conv2dProblem, cfg: d19.WgradWgmmaConfig, x, dy) -> tuple[np.ndarray, np.ndarray | None]:
    """dw (and the fp32 sum when the reduction runs) by the launches' CPU models, in KRSC order."""
    out = d19.main_model(p, x, dy, cfg)
    if not d19.uses_workspace(cfg):
        return out, None
    return d19.reduce_model(out, cfg.splits, p.torch_dtype)


def ref_krsc(p: Conv2dProblem, x, dy) -> np.ndarray:
    return reference(p, x, dy).permute(0, 2, 3, 1).reshape(-1).numpy()


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("spec, tile, splits, blocks", MODEL_CASES, ids=lambda v: str(v)[:60])
def test_the_model_of_the_launches_is_exact_on_integer_inputs(spec, tile, splits, blocks, dtype):
    p = wgrad(dtype, **spec)
    cfg = d19.choose(p, tile, splits, sms=blocks or 132)
    assert V.supports(p, smem_limit=HOPPER_SMEM) is None and d19.wgrad_wgmma_reason(p, cfg) is None
    assert cfg.splits == min(splits, d19.steps_of(p))
    x, dy = p.make_inputs(kind="int", seed=3)
    dw, dw32 = model_run(p, cfg, x, dy)
    want = ref_krsc(p, x, dy)
    assert not np.isnan(dw).any() and np.array_equal(dw, want)
    if dw32 is not None:
        assert np.array_equal(dw32, want)


@pytest.mark.parametrize("spec, tile, splits, blocks", MODEL_CASES[2:8:2], ids=lambda v: str(v)[:60])
def test_the_model_is_within_the_fp32_bound_on_normal_inputs(spec, tile, splits, blocks):
    p = wgrad("bf16", **spec)
    cfg = d19.choose(p, tile, splits, sms=blocks or 132)
    x, dy = p.make_inputs(seed=5)
    dw, _ = model_run(p, cfg, x, dy)
    out = torch.from_numpy(dw).to(p.torch_dtype).view(p.K, p.R, p.S, p.C)
    d = compare(p, x, dy, out)
    assert d["nonfinite"] == 0 and d["worst_err_over_bound"] <= 1, d


def test_a_skipped_k16_slice_is_caught(monkeypatch):
    """The planted fault: mma_step issues slices 0, 1, 2 only (one of four k16 slices dropped)."""
    p = wgrad(**MODEL_CASES[2][0])
    cfg = d19.choose(p, splits=2)
    x, dy = p.make_inputs(kind="int", seed=3)
    real = d19.slot_descriptors
    monkeypatch.setattr(d19, "slot_descriptors", lambda *a: [d for d in real(*a) if d[0] != 3])
    dw, _ = model_run(p, cfg, x, dy)
    assert not np.array_equal(dw, ref_krsc(p, x, dy))


def test_a_split_left_out_of_the_reduction_is_caught():
    p = wgrad(N=4, C=8, H=16, W=16, K=16, R=3, S=3, padding=1)  # 16 steps
    cfg = d19.choose(p, splits=4)
    assert cfg.splits == 4
    x, dy = p.make_inputs(kind="int", seed=3)
    parts = d19.main_model(p, x, dy, cfg)
    short, _ = d19.reduce_model(parts[: 3 * d19.dw_elements(p)], 3, p.torch_dtype)
    assert not np.array_equal(short, ref_krsc(p, x, dy))


def test_the_model_rounds_the_fp32_sum_once():
    """Normal inputs, 3 splits: dw is the fp32 sum (split order) rounded once to the dtype."""
    p = wgrad("fp16", **MODEL_CASES[6][0])
    cfg = d19.choose(p, "128x128_c2_s6", 3)
    x, dy = p.make_inputs(seed=1)
    parts = d19.main_model(p, x, dy, cfg)
    dw, dw32 = d19.reduce_model(parts, 3, p.torch_dtype)
    s = parts.reshape(3, -1).astype(np.float32)
    assert np.array_equal(dw32, ((s[0] + s[1]) + s[2]).astype(np.float64))
    assert np.array_equal(dw, torch.from_numpy(dw32.astype(np.float32)).half().double().numpy())


# ---- work, splits, workspace, launches --------------------------------------------------------------


@pytest.mark.parametrize("steps, splits", [(1, 1), (3, 2), (10, 3), (100, 7), (1000, 132), (17, 17)])
def test_split_ranges_are_day_14s_slices_in_steps(steps, splits):
    got = d19.split_ranges(steps, splits)
    assert got[0][0] == 0 and got[-1][1] == steps and all(a < b for a, b in got)
    assert all(got[i][1] == got[i + 1][0] for i in range(len(got) - 1))
    assert [(64 * a, 64 * b) for a, b in got] == [(a, b if b < steps * 64 else steps * 64)
                                                  for a, b in split_k_slices(64 * steps, splits, 64)]
    with pytest.raises(ValueError, match="no empty split"):
        d19.split_ranges(steps, steps + 1)


def test_the_split_rule():
    t = d19.BY_NAME["128x128_c2_s6"]
    big = wgrad(N=32, C=64, H=56, W=56, K=64, R=3, S=3, padding=1)  # 9 tiles of 64 x 64, 1568 steps
    assert d19.choose_tile(big).name == "64x64_c1_s8"  # K, C <= 64: no half-empty tile
    t64 = d19.BY_NAME["64x128_c1_s6"]
    assert d19.tile_count(big, t64) == 9
    # whole rounds: 15 splits make 135 units, two rounds on 132 SMs; 14 make 126, one round
    assert d19.split_cost(big, t64, 14) < d19.split_cost(big, t64, 15) and d19.choose_splits(big, t64) == 14
    # 78 SMs: 17 splits, two rounds of 93 steps (186), beat 8 splits, one round of 196
    assert d19.choose_splits(big, t64, sms=78) == 17 and d19.choose_splits(big, t64, sms=1) == 1
    # free traffic: the fewest steps on the busiest block (44 splits: 3 rounds of 36 = 108 < 14's 112);
    # dear traffic: no split
    assert d19.choose_splits(big, t64, balance=0.0) == 44 and d19.choose_splits(big, t64, balance=1e9) == 1
    few = wgrad(N=1, C=512, H=7, W=7, K=512, R=3, S=3, padding=1)  # 49 pixels: one step, one split
    assert d19.steps_of(few) == 1 and d19.choose_splits(few, t) == 1
    short = wgrad(N=2, C=64, H=28, W=28, K=64, R=1, S=1)  # 1568 pixels = 25 steps: at most 3 splits of >= 8
    assert d19.choose_splits(short, t, balance=0.0) == 25 // d19.MIN_SPLIT_STEPS == 3
    many = wgrad(N=32, C=1024, H=14, W=14, K=2048, R=1, S=1, stride=2)  # 64 tiles of 128 x 256, 25 steps
    t256 = d19.choose_tile(many)
    assert t256.name == "128x256_c2_s4" and d19.tile_count(many, t256) == 64
    # two splits halve the busiest block's steps (25 -> 13) but add 16.8 MB of fp32 partials: one wins
    assert d19.split_cost(many, t256, 2) > d19.split_cost(many, t256, 1) and d19.choose_splits(many, t256) == 1
    for p in (big, few, short, many):
        cfg = d19.choose(p, sms=132)
        units = d19.tile_count(p, cfg.tile) * cfg.splits
        assert cfg.blocks == min(units, 132) and 1 <= cfg.splits <= max(1, d19.steps_of(p) // d19.MIN_SPLIT_STEPS)
    with pytest.raises(ValueError, match="at least one SM"):
        d19.choose_splits(big, t, sms=0)


def test_the_sm_count_is_an_argument_with_132_by_default():
    p = wgrad(N=8, C=64, H=28, W=28, K=64, R=3, S=3, padding=1)
    assert d19.DEFAULT_SMS == 132 and d19.device_sms() == 132  # no GPU here
    assert d19.choose(p).splits == d19.choose(p, sms=132).splits != d19.choose(p, sms=16).splits
    v = d19.make_wgrad_wgmma("w16", sms=16)
    assert v.plan(p).config.blocks <= 16


@pytest.mark.parametrize("splits, dw32, want", [(1, False, 0), (4, False, 4), (1, True, 2), (3, True, 4)])
def test_workspace_sizes(splits, dw32, want):
    p = wgrad(N=8, C=72, H=9, W=10, K=136, R=3, S=3, padding=1)  # 12 steps
    v = d19.make_wgrad_wgmma("w", splits=splits, dw32=dw32)
    n = 136 * 9 * 72
    assert v.workspace_bytes(p) == 4 * n * want
    cfg = v.plan(p).config
    if dw32:
        assert d19.dw32_offset(p, cfg) == 4 * n * splits
        ws = torch.zeros(v.workspace_bytes(p), dtype=torch.uint8)
        view = d19.dw32_view(p, cfg, ws)
        assert view.shape == (136, 3, 3, 72) and view.dtype == torch.float32
        assert view.data_ptr() == ws.data_ptr() + 4 * n * splits
    else:
        with pytest.raises(ValueError, match="dw32=True"):
            d19.dw32_view(p, cfg, torch.zeros(8, dtype=torch.uint8))


def test_the_launches_and_their_arguments():
    p = wgrad(N=8, C=72, H=9, W=10, K=136, R=3, S=2, stride=(2, 1), padding=(1, 0), dilation=(1, 2))  # 5 steps
    (main,) = d19.make_wgrad_wgmma("w1", splits=1).launches(p)
    cfg = d19.choose(p, splits=1)
    assert (main.name, main.entry) == ("main", f"wgrad_wgmma_{cfg.tile.name}_fp16")
    assert main.config == LaunchConfig((cfg.blocks, 1, 1), (cfg.tile.threads, 1, 1), cfg.tile.shared_bytes)
    assert main.args[0] == TensorMap("dy", d19.dy_map(p)) and main.args[1] == TensorMap("x", d19.x_map(p))
    assert main.args[2] == Buffer("dw") and type(main.args[3]) is np.uintp and int(main.args[3]) == 0
    ints = [int(a) for a in main.args[4:]]
    assert all(type(a) is np.int32 for a in main.args[4:])
    tm, tn = -(-136 // cfg.tile.bm), -(-72 // cfg.tile.bn)
    assert ints == [136, 72, p.P, p.Q, 2, 1, 1, 0, 1, 2, 2, 6, d19.steps_of(p), tm, tn, 1, tm * tn * 6, 1]
    assert d19.dy_map(p).dims == (136, 8 * p.P * p.Q) and d19.dy_map(p).box == (64, 64)
    xm = d19.x_map(p)
    assert (xm.channels, xm.pixels, xm.lower, xm.element_strides) == (64, 64, (0, -1), (1, 1, 2, 1))
    main, red = d19.make_wgrad_wgmma("w3", splits=3, dw32=True).launches(p)
    assert main.args[3] == Buffer("workspace") and int(main.args[-1]) == 0 and int(main.args[-3]) == 3
    assert (red.name, red.entry) == ("reduce", "wgrad_wgmma_reduce_fp16")
    n = 136 * 6 * 72
    assert red.args[:3] == (Buffer("workspace"), Buffer("dw"), Buffer("workspace", 4 * 3 * n))
    assert type(red.args[3]) is np.int64 and int(red.args[3]) == n and int(red.args[4]) == 3
    _, red = d19.make_wgrad_wgmma("w3", splits=3).launches(p)
    assert int(red.args[2]) == 0 and type(red.args[2]) is np.uintp
    assert not any(isinstance(a, MapBytes) for a in main.args)


@pytest.mark.parametrize("spec, tile, splits, blocks", MODEL_CASES, ids=lambda v: str(v)[:60])
def test_every_element_written_once(spec, tile, splits, blocks):
    p = wgrad(**spec)
    cfg = d19.choose(p, tile, splits, sms=blocks or 132)
    writes = d19.main_writes(p, cfg)
    assert writes.shape == ((cfg.splits if d19.uses_workspace(cfg) else 1) * d19.dw_elements(p),)
    assert (writes == 1).all()
    for grid in (1, 2, 7):
        assert (d19.main_writes(p, cfg, LaunchConfig((grid, 1, 1), (cfg.tile.threads, 1, 1))) == 1).all()
    v = d19.make_wgrad_wgmma("w", tile, splits, sms=blocks)
    assert (v.covers(p) == 1).all() and v.covers(p).shape == (d19.dw_elements(p),)


@pytest.mark.parametrize("grid", [1, 3, 1000])
def test_the_reduction_writes_every_element_once(grid):
    p = wgrad(N=2, C=136, H=9, W=9, K=200, R=3, S=3, padding=1)
    assert (d19.reduce_writes(p, LaunchConfig((grid, 1, 1), (256, 1, 1))) == 1).all()
    assert d19.reduce_grid(p) == min(-(-200 * 9 * 136 // 4 // 256), 8 * 132)


def test_every_tile_is_offered_forced_and_on_one_block():
    forced = V.configs_fn()
    names = [v.name for v in forced]
    assert names == [f"wgrad_wgmma[{t.name}]" for t in d19.ENTRIES] + \
        [f"wgrad_wgmma[{t.name}]_k3_grid1" for t in d19.ENTRIES]
    p = wgrad(N=2, C=136, H=9, W=9, K=200, R=3, S=3, padding=1)
    for v in forced[len(d19.ENTRIES):]:
        cfg = v.plan(p).config
        assert cfg.blocks == 1 and cfg.splits == 3 and v.launches(p)[0].config.grid == (1, 1, 1)
    with pytest.raises(ValueError, match="no tile"):
        d19.make_wgrad_wgmma("x", "1x1_c1_s1")


def test_the_variant_is_registered_for_wgrad():
    assert (V.day, V.op, V.layouts, V.dtypes, V.accum) == (19, "wgrad", ("NHWC",), ("fp16", "bf16"), "fp32")
    assert V.cu_file == "19_wgrad_wgmma.cu" and V.build_reason((9, 0)) is None and V.target((9, 0)) == "sm_90a"
    assert "only on compute capability 9.0" in V.build_reason((10, 0)) and "9.0 or newer" in V.build_reason((8, 0))


# ---- refusals --------------------------------------------------------------------------------------

BASE = dict(N=2, C=24, H=9, W=10, K=16, R=3, S=3, padding=1)
REFUSED = [
    (dict(C=12), "C = 12, K = 16: the copy engine reads"),
    (dict(K=20), "K % 8 == 0"),
    (dict(C=16, groups=2), "needs groups=1; got 2"),
    (dict(stride=(9, 1)), "x tensor map: element strides"),
    (dict(N=1, C=8, H=300, W=8, K=8, R=3, S=1, padding=0, dilation=(128, 1)), "filter offset is 8 bits"),
    (dict(padding=(129, 1)), "x tensor map: the bounding box's lower corner"),
]


@pytest.mark.parametrize("change, words", REFUSED, ids=[w[:40] for _, w in REFUSED])
def test_refusals_name_the_value(change, words):
    assert V.supports(wgrad(**BASE), smem_limit=HOPPER_SMEM) is None
    reason = V.supports(wgrad(**{**BASE, **change}), smem_limit=HOPPER_SMEM)
    assert reason is not None and words in reason and reason.startswith("wgrad_wgmma: "), reason


def test_shared_memory_beyond_the_gpus_is_refused():
    reason = V.supports(wgrad(**BASE))  # 64x64, 8 stages; no GPU: the 48 KB every GPU allows, assumed
    assert "needs 132096 B of shared memory per block; the limit is 49152 B (assumed without a GPU" in reason


def test_other_operations_dtypes_layouts_and_epilogues_are_refused():
    p = wgrad(**BASE)
    assert "computes wgrad" in V.supports(replace(p, op="fprop", name=""))
    assert "takes dtype fp16/bf16" in V.supports(replace(p, dtype="fp32", name=""))
    assert "takes layout NHWC" in V.supports(replace(p, layout="NCHW", name=""))
    with pytest.raises(ValueError, match="wgrad_wgmma fuses no epilogue"):
        prepare(V, p, *p.make_inputs(), epilogue=Epilogue(relu=True))
    with pytest.raises(ValueError, match="fuses no epilogue"):
        d19.wgrad_wgmma_launches(p, Epilogue(alpha=2.0), V.plan(p).config)


def test_misaligned_tensors_are_refused(misaligned):
    p = wgrad(**BASE)
    plan = V.plan(p)
    tensors = {n: torch.zeros(p.tensor_shape(n), dtype=p.torch_dtype) for n in ("x", "dy", "dw")}
    assert plan.tensor_reason(tensors) is None
    for name in ("x", "dy", "dw"):
        reason = plan.tensor_reason({**tensors, name: misaligned(tensors[name])})
        assert reason is not None and f"{name}.data_ptr() is not 16-byte aligned" in reason


@pytest.mark.parametrize("name", ["resnet50", "outside"])
def test_every_suite_wgrad_problem_is_claimed_or_refused_with_a_reason(name):
    """ResNet-50's 19 layers at N = 32 and 256 and the ``outside`` suite (VGG-16, MobileNet's 1x1,
    U-Net, detector heads, ResNet-50 at N = 1 and 8) as wgrad: every one runs within Hopper's shared
    memory, with a split that leaves no split empty and fits the kernel's counters, but VGG-16's
    first layer (C = 3), which is refused for C % 8."""
    refused = []
    for p in suite(name, dtype="fp16", layout="NHWC", op="wgrad"):
        reason = V.supports(p, smem_limit=HOPPER_SMEM)
        if reason:
            refused.append((p.C, reason))
            continue
        cfg = V.plan(p).config
        assert 1 <= cfg.splits <= d19.steps_of(p) and cfg.tile.shared_bytes <= HOPPER_SMEM
        assert d19.workspace_bytes(p, cfg) == (4 * cfg.splits * d19.dw_elements(p) if cfg.splits > 1 else 0)
    if name == "resnet50":
        assert refused == []
    else:
        assert len(refused) == 1 and refused[0][0] == 3 and "C % 8 == 0" in refused[0][1], refused


# ---- the build ----------------------------------------------------------------------------------------


@pytest.mark.nvcc
def test_the_kernel_builds_for_sm90a_without_spills():
    reports = {r.entry: r for r in hc.nvcc_compile(d19.CU_FILE, arch="sm_90a")[0]}
    want = {t.entry(dt) for t in d19.ENTRIES for dt in ("fp16", "bf16")} | {
        "wgrad_wgmma_reduce_fp16", "wgrad_wgmma_reduce_bf16"}
    assert set(reports) == want
    for r in reports.values():
        assert r.arch == "sm_90a" and (r.spill_stores, r.spill_loads, r.stack_bytes) == (0, 0, 0), r
    for t in d19.ENTRIES:
        for dt in ("fp16", "bf16"):
            r = reports[t.entry(dt)]
            assert r.registers * t.threads >= d19.moved_registers(t), (t.name, r.registers)
            assert r.shared_bytes <= 16 * t.stages  # the barriers only: the ring is dynamic
            if t.consumers == 2:
                assert r.registers <= 168  # 65,536 / 384 threads, one block per SM
