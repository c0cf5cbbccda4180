"""Day 15's tuner over the Hopper kernels, on the CPU: the search spaces of days 16, 18 and 19
(enumeration, the rule as the one prior, names that round-trip, variations that are launch
arguments only, pruning that keeps each schedule's favourite), and the cache key of a variant
built from two days' kernel files."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from days import day16_igemm_wgmma as d16
from days import day18_dgrad_wgmma as d18
from days import day19_wgrad_wgmma as d19
from helpers import compile as hc
from helpers import tune as ht
from helpers.problem import Conv2dProblem
from helpers.suites import suite
from helpers.variants import get

NHWC16 = {"dtype": "fp16", "layout": "NHWC"}
HOPPER = ("igemm_wgmma", "dgrad_wgmma", "wgrad_wgmma")
ENV = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.00", "cuda": "13.0", "nvcc": "release 13.0"}


def problems(op: str) -> list[Conv2dProblem]:
    return suite("resnet50", op=op, **NHWC16) + suite("outside", op=op, **NHWC16)[:12]


def launch_signature(v, p) -> list:
    """What a build depends on: each launch's kernel file, entry and defines."""
    return [(k.source(v), k.entry, k.build_defines(v)) for k in v.plan(p).launches]


@pytest.mark.parametrize("name", HOPPER)
def test_every_hopper_variant_has_a_space_whose_prior_is_the_rule(name, machine):
    """On ResNet-50 and outside shapes: one candidate per configuration, exactly one prior, the
    configuration the registered variant's rule runs; every candidate's plan is the problem's
    (no shape refusal where the rule has none) and runs its own configuration."""
    sp = ht.space_of(name)
    v = get(name)
    for p in problems(get(name).op):
        cands = sp.candidates(p, machine)
        if v.plan(p).reason:
            continue
        (prior,) = [c for c in cands if c.prior]
        assert len({c.config for c in cands}) == len(cands)
        rule = v.plan(p).config
        assert prior.variant.plan(p).config == rule, (p.name, prior.config)
        for c in cands:
            assert c.model_us > 0 and sp.variant_for(c.config, p) is c.variant


def test_igemm_wgmma_space_names_round_trip_and_vary_the_tile_order(machine):
    p = suite("resnet50", **NHWC16)[0]
    cands = ht.space_of("igemm_wgmma").candidates(p, machine)
    assert {c.family for c in cands} == set(d16.MODES)
    assert len(cands) == len(d16.ENTRIES)
    for c in cands:
        cfg = d16.parse_config(c.config)
        assert cfg.name == c.config and cfg.compiled in d16.ENTRIES
        (other,) = d16.space_variations(c.config, p)
        assert d16.parse_config(other).group_m != cfg.group_m
        # a variation is a launch argument: the same kernel file, entry and defines
        assert launch_signature(d16.space_variant(other), p) == launch_signature(c.variant, p)
    for bad in ("persistent_96x128_c2_s4", "warp_128x128_c2_s6", "persistent_128x128_c2"):
        with pytest.raises(ValueError):
            d16.parse_config(bad)


def test_pruning_times_each_schedules_favourite_and_the_prior(machine):
    for p in suite("resnet50", **NHWC16):
        cands = ht.space_of("igemm_wgmma").candidates(p, machine)
        kept = ht.prune(cands, 4)
        assert {c.family for c in kept} == set(d16.MODES)
        assert any(c.prior for c in kept)
        assert kept[0] == min(cands, key=lambda c: c.model_us)


def test_dgrad_wgmma_space_runs_day_16s_configuration_on_every_phase(machine):
    """Strided and unit-stride layers: each candidate's fprop launches are its configuration's
    entry; a problem without an fprop equivalent has no candidates."""
    sp = ht.space_of("dgrad_wgmma")
    ps = suite("resnet50", op="dgrad", **NHWC16)
    assert any(d18.strided(p) for p in ps) and any(not d18.strided(p) for p in ps)
    for p in ps:
        for c in sp.candidates(p, machine):
            cfg = d16.parse_config(c.config)
            fprops = [k for k in c.variant.plan(p).launches if k.name.startswith("fprop")]
            assert fprops and all(k.entry == cfg.entry(p.dtype) for k in fprops)
    refused = Conv2dProblem(N=1, C=16, H=9, W=9, K=16, R=3, S=3, stride=2, dilation=2, op="dgrad", **NHWC16)
    if d18.shape_reason(refused):
        assert sp.candidates(refused, machine) == []


def test_wgrad_wgmma_space_is_tiles_times_a_split_ladder(machine):
    sp = ht.space_of("wgrad_wgmma")
    for p in suite("resnet50", op="wgrad", **NHWC16):
        cands = sp.candidates(p, machine)
        assert {c.family for c in cands} == {t.name for t in d19.ENTRIES}
        rule = d19.choose(p, sms=machine.sms)
        for c in cands:
            tile, s = d19.parse_space_config(c.config)
            assert s in d19.ladder(p, tile, machine.sms)
            assert c.variant.plan(p).config.splits == min(s, d19.steps_of(p))
            assert c.variant.plan(p).config.tile == tile
        (prior,) = [c for c in cands if c.prior]
        assert prior.config == d19.space_config(rule.tile, rule.splits)
        for c in cands[:6]:
            for other in sp.variations(c.config, p):
                assert launch_signature(sp.variant_for(other, p), p)[0][:2] == launch_signature(c.variant, p)[0][:2]
    for bad in ("96x64_c1_s8_k4", "64x64_c1_s8_k0", "64x64_c1_s8"):
        with pytest.raises(ValueError, match="WGRAD_WGMMA_ENTRY tile"):
            d19.parse_space_config(bad)


def test_the_split_ladder_stops_at_the_first_split_of_two_units_per_sm():
    p = suite("resnet50", op="wgrad", **NHWC16)[2]  # C64 56x56 K64 3x3: 9 tiles of 64 x 64
    tile = d19.BY_NAME["64x64_c1_s8"]
    assert d19.ladder(p, tile, 132) == sorted({1, 2, 4, 8, 16, 32, d19.choose_splits(p, tile, 132)})


def test_dgrad_wgmma_cache_key_follows_day_16s_kernel_too(tmp_path, monkeypatch):
    """dgrad_wgmma builds its fprop from day 16's file (`helpers.tune.Space.sources`): an edit
    there misses the tuned cache, as an edit of its own file does."""
    kdir = tmp_path / "kernels"
    shutil.copytree(hc.KERNEL_DIR, kdir)
    monkeypatch.setattr(hc, "KERNEL_DIR", kdir)
    assert ht.space_of("dgrad_wgmma").sources == (d16.CU_FILE,)
    v, p = get("dgrad_wgmma"), suite("resnet50", op="dgrad", **NHWC16)[0]
    c = ht.TuneCache(tmp_path / "t.json", environment=ENV)
    entry = {"config": "persistent_128x128_c2_s6", "ms": 0.1, "rule_config": "persistent_128x128_c2_s6",
             "rule_ms": 0.1, "model_rank": 1}
    c.store(v, p, entry)
    assert c.lookup(v, p) is not None
    for f in (d16.CU_FILE, d18.CU_FILE):
        path = kdir / f
        text = path.read_text()
        path.write_text(text + "\n// edited\n")
        assert c.lookup(v, p) is None, f
        path.write_text(text)
        assert c.lookup(v, p) is not None
    # a variant of one file keeps its key as before: the hash of that file alone
    w = get("igemm_wgmma")
    assert f"|{hc.source_hash(d16.CU_FILE)[:16]}|igemm_wgmma|" in c.key(w, replace(p, op="fprop"))
