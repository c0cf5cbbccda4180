"""Day 15's tuner over days 20 and 21, on the CPU: the GEMM-tile spaces of ``winograd_f2`` and
``winograd_f4`` (one candidate per compiled tile, the rule as the one prior, one build for all,
names that round-trip), the block-tile spaces of the fused variants (a build each, the registered
tile as the prior), the models' CUDA-core GEMMs, and the rows of problems the variant refuses."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from days import day21_winograd_fused as w21
from days.day20_winograd import pipeline as wp
from days.day20_winograd import space as ws
from helpers import tune as ht
from helpers.problem import Conv2dProblem
from helpers.suites import suite
from helpers.tune import search as hts
from helpers.variants import get

WINO = ("winograd_f2", "winograd_f4")


def three_by_three(layout: str) -> list[Conv2dProblem]:
    """The 3 x 3 stride-1 problems of three suites in fp32 and ``layout``, plus two odd ones."""
    ps = [p for s in ("resnet50", "seed", "outside") for p in suite(s, dtype="fp32", layout=layout)
          if (p.R, p.S, p.stride, p.dilation) == (3, 3, (1, 1), (1, 1))]
    return ps + [Conv2dProblem(N=3, C=5, H=13, W=9, K=7, R=3, S=3, padding=(0, 2), layout=layout),
                 Conv2dProblem(N=1, C=64, H=7, W=7, K=1000, R=3, S=3, padding=1, layout=layout)]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("name", WINO)
def test_each_gemm_tile_is_a_candidate_and_the_rule_is_the_prior(name, layout, machine):
    sp, v = ht.space_of(name), get(name)
    m = int(name[-1])
    for p in three_by_three(layout):
        cands = sp.candidates(p, machine)
        assert [c.config for c in cands] == [f"{bm}x{bn}" for bm, bn in wp.GEMM_TILES]
        (prior,) = [c for c in cands if c.prior]
        assert ws.parse_config(prior.config) == v.plan(p).config == wp.default_tile(p, m)
        for c in cands:
            plan = c.variant.plan(p)
            assert plan.reason is None and plan.config == ws.parse_config(c.config)
            assert c.model_us > 0 and sp.variant_for(c.config, p) is c.variant and sp.variations(c.config, p) == []


def test_a_candidate_changes_only_the_gemm_launch_and_shares_the_build():
    """Every tile is an entry of the same module: the same file and defines, the GEMM's entry and grid differ."""
    p = Conv2dProblem(N=8, C=64, H=28, W=28, K=96, R=3, S=3, padding=1)
    rule = get("winograd_f4")
    signature = {(k.source(rule), tuple(sorted(k.build_defines(rule).items()))) for k in rule.plan(p).launches}
    for bm, bn in wp.GEMM_TILES:
        v = ws.space_variant(4, f"{bm}x{bn}")
        ks = v.plan(p).launches
        assert {(k.source(v), tuple(sorted(k.build_defines(v).items()))) for k in ks} == signature
        assert [k.name for k in ks] == ["filter", "input", "gemm", "output"]
        assert ks[2].entry == f"wino_gemm_{bm}x{bn}"
        assert [k.entry for k in ks if k.name != "gemm"] == [k.entry for k in rule.plan(p).launches if k.name != "gemm"]


def test_the_model_charges_every_tile_the_same_transforms_and_a_cuda_core_gemm(machine):
    p = Conv2dProblem(N=32, C=128, H=28, W=28, K=128, R=3, S=3, padding=1)
    transforms = ws.transform_bytes(p, 4) / (machine.dram_gbps * 1e3) + 3 * machine.launch_us
    for bm, bn in wp.GEMM_TILES:
        cfg = wp.WinoConfig(bm, bn)
        t = ws.gemm_tile(p, 4, cfg)
        assert (t.batch, t.element_bytes, t.cuda_cores) == (36, 4, True)
        assert ws.candidate_us(p, 4, cfg, machine) == pytest.approx(transforms + ht.gemm_tile_us(t, machine))
        # on tensor cores the same GEMM would be predicted faster: the model reads the FMA rate
        assert ht.gemm_tile_us(replace(t, cuda_cores=False), machine) < ht.gemm_tile_us(t, machine)
    with pytest.raises(ValueError):
        ws.parse_config("96x64")
    with pytest.raises(ValueError):
        ws.parse_config("wide")


def test_a_batch_multiplies_the_blocks_and_the_bytes_of_one_gemm(machine):
    one = ht.GemmTile(m=4096, n=128, k=1024, bm=128, bn=128, bk=8, warp_m=32, warp_n=64, threads=256, stages=2,
                      shared_bytes=16_000, regs=128, element_bytes=4, cuda_cores=True)
    many = replace(one, batch=16)
    stacked = replace(one, m=one.m * 16)  # the same blocks and A, C bytes as one GEMM 16 times taller
    alone = ht.gemm_tile_us(one, machine) - machine.launch_us
    # 16 times the blocks: within a percent of the tall GEMM, which reads its B once instead of 16 times
    assert ht.gemm_tile_us(stacked, machine) <= ht.gemm_tile_us(many, machine)
    assert ht.gemm_tile_us(many, machine) == pytest.approx(ht.gemm_tile_us(stacked, machine), rel=1e-2)
    assert ht.gemm_tile_us(many, machine) - machine.launch_us > 2 * alone  # 32 blocks fill a quarter of 132 SMs


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("m", [2, 4])
def test_each_fused_tile_is_a_candidate_of_its_own_build_and_the_registered_tile_is_the_prior(m, layout, machine):
    sp, v = ht.space_of(f"winograd_f{m}_fused"), get(f"winograd_f{m}_fused")
    tiles = w21.space_tiles(m)
    assert w21.FUSED_TILES[m] in tiles and all(c.accumulators <= w21.SPACE_MAX_ACCUMULATORS for c in tiles)
    assert len(tiles) == {2: 41, 4: 5}[m]
    for p in three_by_three(layout):
        cands = sp.candidates(p, machine)
        assert [c.config for c in cands] == [t.name for t in tiles if w21.fused_reason(p, t) is None]
        (prior,) = [c for c in cands if c.prior]
        assert w21.parse_space_config(m, prior.config) == v.plan(p).config == w21.FUSED_TILES[m]
        for c in cands:
            plan = c.variant.plan(p)
            assert plan.reason is None and plan.config == w21.parse_space_config(m, c.config)
            assert c.variant.defines == w21.fused_defines(plan.config)  # its own build: the tile is a -D define
            assert c.model_us > 0 and c.family == "x".join(c.config.split("x")[:2])
            assert sp.variant_for(c.config, p) is c.variant and sp.variations(c.config, p) == []


def test_the_fused_model_charges_the_filter_transform_and_a_cuda_core_main_kernel(machine):
    p = Conv2dProblem(N=32, C=128, H=28, W=28, K=128, R=3, S=3, padding=1)
    for cfg in w21.space_tiles(4):
        t, fg = w21.main_gemm_tile(p, cfg), w21.FusedGeometry.of(p, cfg)
        assert (t.cuda_cores, t.element_bytes, t.batch, t.steps) == (True, 4, 1, fg.chunks)
        assert (t.m, t.n, t.k) == (fg.g.T, p.K, cfg.npos * p.C)  # 2·m·n·k: the n² GEMMs' FLOPs
        filt = 4 * (p.K * p.C * 9 + fg.ub_elements) / (machine.dram_gbps * 1e3) + machine.launch_us
        assert w21.space_candidate_us(p, cfg, machine) == pytest.approx(filt + ht.gemm_tile_us(t, machine))
    for bad in ("16x32", "16x32x4x1", "12x32x4", "16x30x4"):
        with pytest.raises(ValueError):
            w21.parse_space_config(4, bad)


def test_the_fused_tiles_past_the_accumulator_cap_are_left_out():
    """The cap is what ptxas showed: 128 accumulators spill on every tile (see SPACE_MAX_ACCUMULATORS)."""
    over = [w21.FusedConfig(2, 32, 64, 4), w21.FusedConfig(4, 32, 32, 4), w21.FusedConfig(4, 16, 64, 2)]
    for cfg in over:
        assert cfg.accumulators > w21.SPACE_MAX_ACCUMULATORS and cfg not in w21.space_tiles(cfg.m)


def test_a_problem_the_variant_refuses_is_an_unsupported_row_not_a_fault(monkeypatch):
    """An fprop suite's 1 x 1 and strided layers: status "unsupported: <the variant's reason>",
    no search; the untimed pick answers the 3 x 3 layers."""
    picked = []
    monkeypatch.setattr(hts, "pick", lambda space, p, cache: picked.append(p.name) or {
        "problem": p.name, "variant": space.variant, "status": "ok"})
    problems = [p for p in suite("resnet50", dtype="fp32", layout="NCHW") if p.N == 32]
    df = ht.tune("winograd_f4", problems, timed=False)
    assert isinstance(df, pd.DataFrame) and len(df) == len(problems)
    refused = df[df.status.str.startswith("unsupported")]
    assert len(refused) + len(picked) == len(problems) and len(picked) == 4
    assert refused.status.str.contains("3 x 3 filter|stride 1").all()


def test_a_run_whose_every_problem_is_refused_summarises_to_nothing_tuned():
    """The depthwise suite through a Winograd space: every row unsupported, a summary without a crash."""
    from benchmarks.tune import summary

    df = ht.tune("winograd_f2", suite("depthwise"), timed=False)
    assert df.status.str.startswith("unsupported").all()
    assert summary(df) == {"problems": len(df), "tuned": 0, "tune_s": 0.0}
