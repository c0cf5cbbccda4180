"""Day 22's split-K fprop on the CPU: the work units cover every GEMM-K step of every tile once on
any grid, every partial and every output element is written once, the split run's arithmetic (by
the kernel's ranges, summed in split order) matches the float64 reference and a skipped step is
caught, the refusals, the rule, and the launches (tests/gpu/test_split_k_gpu.py runs the kernels)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from days import day16_igemm_wgmma as d16
from days import day22_split_k as d22
from helpers.epilogue import PLAIN
from helpers.problem import Conv2dProblem
from helpers.suites import resnet50
from helpers.variants import LaunchConfig, get


def _nhwc(**kw) -> Conv2dProblem:
    return Conv2dProblem(layout="NHWC", dtype="fp16", **kw)


PROBLEMS = [
    _nhwc(N=2, C=72, H=24, W=25, K=136, R=3, S=3, padding=1, dilation=(2, 1)),
    _nhwc(N=3, C=40, H=9, W=11, K=34, R=2, S=3, padding=(1, 0), stride=2, dilation=(1, 2)),
    _nhwc(N=2, C=136, H=12, W=12, K=257, R=3, S=3, padding=1, stride=(2, 1)),
]


def test_the_entries_are_day_16s_persistent_tiles():
    assert [t.name for t in d22.ENTRIES] == ["persistent_128x256_c2_s4", "persistent_256x128_c2_s4",
                                             "persistent_128x128_c2_s6", "persistent_128x64_c2_s8"]
    assert all(t in d16.ENTRIES for t in d22.ENTRIES)


@pytest.mark.parametrize("p", PROBLEMS, ids=lambda p: p.name)
@pytest.mark.parametrize("tile", d22.ENTRIES, ids=lambda t: t.name)
@pytest.mark.parametrize("splits", [1, 2, 5, 7])
@pytest.mark.parametrize("blocks", [1, 3, 132])
def test_items_cover_every_step_of_every_tile_once(p, tile, splits, blocks):
    cfg = d22.SplitConfig(replace(tile, group_m=3), splits)
    assert np.all(d22.step_visits(p, cfg, blocks) == 1)
    assert np.all(d22.partial_writes(p, cfg, blocks) == 1)


@pytest.mark.parametrize("K", [64, 33])
@pytest.mark.parametrize("blocks", [1, 5, 2000])
def test_the_reduction_writes_every_element_once(K, blocks):
    p = _nhwc(N=2, C=16, H=9, W=7, K=K, R=3, S=3, padding=1)
    launch = LaunchConfig(grid=(blocks, 1, 1), block=(d22.REDUCE_THREADS, 1, 1))
    assert np.all(d22.reduce_writes(p, launch) == 1)
    assert np.all(d22.reduce_writes(p) == 1)


@pytest.mark.parametrize("p", PROBLEMS[:2], ids=lambda p: p.name)
@pytest.mark.parametrize("splits", [1, 3, 4])
def test_the_split_arithmetic_matches_the_reference_and_a_skipped_step_is_caught(p, splits):
    torch.manual_seed(0)
    x, w = torch.randn(*p.x_shape), torch.randn(*p.w_shape)
    cfg = d22.SplitConfig(d22.ENTRIES[2], splits)
    ref = F.conv2d(x.double().permute(0, 3, 1, 2), w.double().permute(0, 3, 1, 2), stride=p.stride,
                   padding=p.padding, dilation=p.dilation).permute(0, 2, 3, 1).reshape(-1, p.K)
    parts, y = d22.reduce_model(p, x, w, cfg)
    assert parts.shape == (splits, p.gemm.m, p.K)
    bound = 1e-5 * (x.double().abs().max() * w.double().abs().max() * p.C * p.R * p.S)
    assert (y.double() - ref).abs().max() < bound
    _, bad = d22.reduce_model(p, x, w, cfg, skip=(splits - 1, d22.steps_of(p) - 1))
    assert (bad.double() - ref).abs().max() > 100 * bound


def test_splits_past_the_steps_are_refused():
    p = _nhwc(N=1, C=64, H=8, W=8, K=128, R=1, S=1)  # one GEMM-K step
    assert "at least one step" in d22.split_reason(p, d22.SplitConfig(d22.ENTRIES[0], 2))
    assert d22.split_reason(p, d22.SplitConfig(d22.ENTRIES[0], 1)) is None
    q = _nhwc(N=1, C=3, H=8, W=8, K=128, R=3, S=3, padding=1)
    assert "C % 8" in d22.split_reason(q, d22.SplitConfig(d22.ENTRIES[0], 2))


@pytest.mark.parametrize("tile", ["cluster_256x128_c2_s4", "cluster_a_256x128_c2_s4", "persistent_256x64_c2_s4",
                                  "one_wg_128x128_c1_s4"])
def test_a_tile_the_split_kernel_does_not_instantiate_is_refused(tile):
    """A cluster tile's maps copy half boxes (the kernel's full barrier would wait for bytes that never come);
    other day-16 tiles have no split entry: refused before a launch, for fprop and dgrad alike."""
    p = _nhwc(N=32, C=512, H=7, W=7, K=512, R=3, S=3, padding=1)
    cfg = d22.SplitConfig(d16.BY_NAME[tile], 2)
    assert "SPLIT_ENTRY" in d22.split_reason(p, cfg)
    assert "SPLIT_ENTRY" in d22.dgrad_split_reason(replace(p, op="dgrad", name=""), cfg)


def test_the_rule_splits_only_under_filled_layers_and_keeps_day_16_elsewhere():
    layers = [replace(p, dtype="fp16", layout="NHWC", name="") for p in resnet50((32, 256))]
    picks = {p: d22.choose(p, sms=132) for p in layers}
    split = [p for p, c in picks.items() if isinstance(c, d22.SplitConfig)]
    assert split and all(p.N == 32 for p in split)
    for p in split:  # day 16's tiles leave SMs idle there
        assert d16.tile_count(p, d16.choose(p)) < 132
    for p, c in picks.items():
        if not isinstance(c, d22.SplitConfig):
            assert c == d16.choose(p)


def test_a_split_plan_is_main_then_reduce_with_the_partials_as_workspace():
    p = _nhwc(N=32, C=512, H=7, W=7, K=512, R=3, S=3, padding=1)
    cfg = d22.SplitConfig(d22.ENTRIES[0], 5)
    v = d22.make_split_k("t", cfg)
    ks = v.launches(p)
    assert [k.name for k in ks] == ["main", "reduce"]
    assert ks[0].entry == "igemm_split_k_128x256_c2_s4_fp16" and ks[1].entry == "split_k_reduce_fp16"
    assert v.workspace_bytes(p) == 4 * 5 * p.gemm.m * p.K
    assert ks[0].config.grid[0] == min(132, d22.tile_count(p, cfg.tile) * 5)
    assert np.all(v.covers(p) == 1)


def test_the_registered_variant_runs_day_16s_launch_where_it_does_not_split():
    p = _nhwc(N=256, C=256, H=14, W=14, K=256, R=3, S=3, padding=1)
    v = get("igemm_split_k")
    (k,) = v.launches(p)
    assert k.entry == d16.choose(p).entry("fp16") and v.workspace_bytes(p) == 0
    assert v.plan(p, PLAIN).refusal(smem_limit=2**31) is None


def block_item_steps(p: Conv2dProblem, cfg: d22.SplitConfig, block: int, blocks: int) -> list[int]:
    """The GEMM-K steps of each unit block ``block`` of a ``blocks``-wide grid takes, in order."""
    it = d22.split_units(p, cfg)
    mine = it["w"][block::blocks]
    return list(it["hi"][mine] - it["lo"][mine])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("stages, splits", [(4, 4), (6, 5), (8, 7)])
def test_the_ring_runs_on_across_items_of_different_lengths(seed, stages, splits):
    """One block's producer and two consumers over units whose step counts differ (18 steps in 4,
    5 or 7 splits), replayed under random interleavings with day 16's model of the ring: no copy
    into a slot still read, no read of a step not landed, no deadlock."""
    p = _nhwc(N=2, C=72, H=24, W=25, K=136, R=3, S=3, padding=1, dilation=(2, 1))
    assert d22.steps_of(p) == 18
    cfg = d22.SplitConfig(d22.ENTRIES[2], splits)
    steps = block_item_steps(p, cfg, 0, 2)
    assert len(set(steps)) > 1 and len(steps) > 2
    assert d16.replay_ring("persistent", stages, steps, tiles=len(steps), seed=seed, slow_copies=0.3) > 0


@pytest.mark.parametrize("bug", ["early arrive", "full parity", "empty parity", "empty count"])
def test_a_broken_ring_is_caught_on_split_units(bug):
    p = _nhwc(N=2, C=72, H=24, W=25, K=136, R=3, S=3, padding=1, dilation=(2, 1))
    steps = block_item_steps(p, d22.SplitConfig(d22.ENTRIES[2], 5), 0, 2)
    caught = 0
    for seed in range(20):
        try:
            d16.replay_ring("persistent", 6, steps, tiles=len(steps), seed=seed, bug=bug, slow_copies=0.3)
        except d16.RingHazard:
            caught += 1
    assert caught > 0, f"{bug}: no interleaving of 20 caught it"


def test_steps_per_tile_need_one_count_per_tile():
    with pytest.raises(ValueError, match="one count"):
        d16.replay_ring("persistent", 4, [3, 2], tiles=3)
    with pytest.raises(ValueError, match="one count"):
        d16.replay_ring("pingpong", 4, [3, 2], tiles=2)


def test_the_space_holds_day_16s_entries_and_the_splits_and_names_round_trip():
    from helpers.tune import space_of
    from helpers.tune.probe import committed

    machine = committed("nvidia-h200")
    p = _nhwc(N=32, C=2048, H=7, W=7, K=512, R=1, S=1)
    cands = space_of("igemm_split_k").candidates(p, machine)
    assert sum(c.prior for c in cands) == 1
    assert {c.family for c in cands} >= {"persistent", "split", "pingpong"}
    splits = [c for c in cands if c.family == "split"]
    assert len(splits) == len(d22.ENTRIES) * (min(d22.MAX_SPLITS, d22.steps_of(p) // d22.MIN_SPLIT_STEPS) - 1)
    for c in cands:
        assert d22.parse_split_config(c.config).name == c.config and c.model_us > 0
        assert c.variant.name == f"igemm_split_k[{c.config}]"
    assert d22.space_variations(splits[0].config, p)[0].endswith(f"_k{d22.parse_split_config(splits[0].config).splits}")
    with pytest.raises(ValueError):
        d22.parse_split_config("persistent_128x256_c2_s4_k1")
    with pytest.raises(ValueError):
        d22.parse_split_config("pingpong_128x128_c2_s6_k2")


def test_dgrad_splits_the_fprop_over_dy_after_day_18s_rotation():
    p = _nhwc(N=32, C=512, H=7, W=7, K=512, R=3, S=3, padding=1, op="dgrad")
    v = get("dgrad_split_k")
    cfg = d22.dgrad_choose(p, sms=132)
    assert isinstance(cfg, d22.SplitConfig)
    ks = v.launches(p)
    assert [k.name for k in ks] == ["rotate", "main", "reduce"]
    assert ks[0].cu_file == "18_dgrad_wgmma.cu" and ks[1].cu_file is None
    at = d22.dgrad_filter_bytes(p)
    assert at % 128 == 0 and at >= p.K * p.R * p.S * p.C * 2
    maps = {a.name: a.offset for a in ks[1].args if hasattr(a, "desc")}
    assert maps == {"dy": 0, "workspace": 0}
    bufs = [a for a in ks[1].args + ks[2].args if hasattr(a, "name") and not hasattr(a, "desc")]
    assert {(b.name, b.offset) for b in bufs} == {("workspace", at), ("dx", 0)}
    assert v.workspace_bytes(p) == at + 4 * cfg.splits * p.N * p.H * p.W * p.C
    assert np.all(v.covers(p) == 1)


def test_dgrad_keeps_day_18_where_it_does_not_split():
    v, d18v = get("dgrad_split_k"), get("dgrad_wgmma")
    for spec in (dict(N=4, C=64, H=28, W=28, K=128, R=1, S=1, stride=2),  # strided: day 18's phases
                 dict(N=256, C=256, H=14, W=14, K=256, R=3, S=3, padding=1)):  # filled: day 18's fprop
        p = _nhwc(**spec, op="dgrad")
        assert [k.entry for k in v.launches(p)] == [k.entry for k in d18v.launches(p)]
        assert {k.source(v) for k in v.launches(p)} <= {"18_dgrad_wgmma.cu", "16_igemm_wgmma.cu"}
        assert v.workspace_bytes(p) == d18v.workspace_bytes(p)
    p = _nhwc(N=4, C=64, H=28, W=28, K=128, R=1, S=1, stride=2, op="dgrad")
    assert "strided" in d22.dgrad_split_reason(p, d22.SplitConfig(d22.ENTRIES[0], 2))
