"""Day 15's tuner on the CPU: the cache (hit, miss, invalidation when a kernel's source changes),
pruning (the model's first choice and the prior always survive), day 13's search space, the
search logic with a stand-in GPU (early stopping, disagreeing outputs never chosen, variations,
the cache answering without timing, the exhaustive sweep), the tuned variant, builds of tiles
built alone, and the command line without a GPU."""

from __future__ import annotations

import math
import random
import shutil
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from conftest import model_machine

from days.day13_igemm_production import INSTANTIATED, TileDescription, choose, space, tune_defines
from days.day13_igemm_production import tiles as tiles_mod
from days.day14_backward.wgrad import tiles as wgrad_tiles
from helpers import compile as hc
from helpers import gpu
from helpers import tune as ht
from helpers.launch import prepare
from helpers.problem import Conv2dProblem
from helpers.suites import suite
from helpers.tune import search as hts
from helpers.variants import get

ENV = {"gpu": "NVIDIA H200", "driver": "580.00", "cuda": "13.0", "nvcc": "release 13.0"}
NHWC16 = {"dtype": "fp16", "layout": "NHWC"}
P1 = Conv2dProblem(N=8, C=64, H=28, W=28, K=128, R=3, S=3, padding=1, **NHWC16)
P2 = replace(P1, K=256, name="")


# ---- the cache ------------------------------------------------------------------------------------------------


def entry(config="128x64x32_w2x2_s4_b1_sw1", ms=0.1) -> dict:
    return {"config": config, "ms": ms, "rule_config": config, "rule_ms": ms, "model_rank": 1}


def test_cache_hit_miss_and_persistence(tmp_path):
    v = get("igemm_production")
    c = ht.TuneCache(tmp_path / "t.json", environment=ENV)
    assert c.lookup(v, P1) is None  # cold: a miss
    c.store(v, P1, entry())
    assert c.lookup(v, P1)["config"] == entry()["config"]
    assert c.lookup(v, P2) is None  # another problem
    assert c.lookup(v, replace(P1, name="a label only")) is not None  # the label is not part of the key
    assert c.lookup(get("dgrad"), P1) is None  # another variant
    again = ht.TuneCache(tmp_path / "t.json", environment=ENV)  # a new process reads the file
    assert again.lookup(v, P1) == c.lookup(v, P1)
    for k, other in (("gpu", "NVIDIA H100"), ("driver", "590.1"), ("cuda", "13.1"), ("nvcc", "release 13.1")):
        assert ht.TuneCache(tmp_path / "t.json", environment={**ENV, k: other}).lookup(v, P1) is None, k


def test_cache_misses_after_a_source_change(tmp_path, monkeypatch):
    """Editing the kernel file, or a header it includes (here through another header), changes the
    key: the entry is not used."""
    kdir = tmp_path / "kernels"
    shutil.copytree(hc.KERNEL_DIR, kdir)
    monkeypatch.setattr(hc, "KERNEL_DIR", kdir)
    v = get("igemm_production")
    c = ht.TuneCache(tmp_path / "t.json", environment=ENV)
    c.store(v, P1, entry())
    assert c.lookup(v, P1) is not None
    header = kdir / "tensor_core.cuh"
    assert '#include "igemm_mainloop.cuh"' in (kdir / v.cu_file).read_text()
    assert '#include "tensor_core.cuh"' in (kdir / "igemm_mainloop.cuh").read_text()
    header.write_text(header.read_text() + "\n// edited\n")
    assert c.lookup(v, P1) is None
    header.write_text(header.read_text().replace("\n// edited\n", ""))
    assert c.lookup(v, P1) is not None  # the same source again: the same key
    cu = kdir / v.cu_file
    cu.write_text(cu.read_text() + "\n")
    assert c.lookup(v, P1) is None


def test_tuned_lookups_hash_the_source_once_until_it_changes(tmp_path, monkeypatch):
    """The tuned variant asks its cache on every call (a cached plan checks tensors per call): the
    kernel's sources are hashed once, then only stat'ed (it re-read and hashed every file of the
    kernel per call: 543 us against the base variant's 9 us on the CPU); an edit is still seen."""
    import hashlib

    kdir = tmp_path / "kernels"
    shutil.copytree(hc.KERNEL_DIR, kdir)
    monkeypatch.setattr(hc, "KERNEL_DIR", kdir)
    hashed = []
    real = hashlib.sha256
    monkeypatch.setattr(hashlib, "sha256", lambda *a: hashed.append(1) or real(*a))
    c = ht.TuneCache(tmp_path / "t.json", environment=ENV)
    v = get("igemm_production")
    c.store(v, P1, entry())
    t = ht.tuned(v, c)
    for _ in range(20):
        assert t.plan(P1).config.alone and t.supports(P1) is None
    assert len(hashed) <= 1, f"{len(hashed)} hashes of the kernel's sources for 40 lookups"
    cu = kdir / v.cu_file
    cu.write_text(cu.read_text() + "\n// edited\n")
    assert c.lookup(v, P1) is None and len(hashed) == 2  # the edit: hashed again, a miss


STORE_SCRIPT = """
import sys
from dataclasses import replace
from helpers import tune as ht
from helpers.tune import search as hts
from helpers.variants import get
from test_tune import ENV, P1, entry
cache = ht.TuneCache(sys.argv[1], environment=ENV)
v, tag = get("igemm_production"), int(sys.argv[2])
for n in range(200):
    cache.store(v, replace(P1, N=1 + n, H=28 + tag, name=""), entry(ms=0.1 + tag))
"""


def test_concurrent_stores_keep_every_entry(tmp_path):
    """Two processes storing 200 entries each into one cache file keep all 400, without errors
    (one fixed temporary name and no merge kept 212-310 and raised FileNotFoundError)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parent), str(here)])}
    path = tmp_path / "t.json"
    procs = [subprocess.Popen([sys.executable, "-c", STORE_SCRIPT, str(path), str(tag)], env=env,
                              stderr=subprocess.PIPE, text=True) for tag in (0, 1)]
    errors = [p.communicate(timeout=240)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert len(ht.TuneCache(path, environment=ENV).entries) == 400
    assert not list(tmp_path.glob("*.tmp"))  # no temporary file left behind


def test_store_keeps_the_files_permissions(tmp_path):
    """The temporary file the store writes through is made 0600; the cache keeps the mode it had
    (a shared cache stays readable to others) or, new, gets the umask's."""
    import os

    umask = os.umask(0)
    os.umask(umask)
    path = tmp_path / "t.json"
    cache = ht.TuneCache(path, environment=ENV)
    cache.store(get("igemm_production"), P1, entry())
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    path.chmod(0o640)
    cache.store(get("igemm_production"), P2, entry())
    assert path.stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize("text, words", [
    ("{not json", "unreadable"),
    ("[" * 100_000 + "]" * 100_000, "unreadable"),  # nested past the parser's recursion limit
    ("[1, 2]", "JSON list"),
    (None, "1 malformed entries"),
])
def test_a_damaged_cache_falls_back_to_the_rule_with_one_warning(tmp_path, text, words):
    """A file that is not JSON, not an object, or an entry without what a hit needs: one
    TuneCacheWarning naming the file, the rule's choice runs (no JSONDecodeError, KeyError or
    AttributeError), and the next store rewrites the file whole."""
    import json
    import warnings

    path = tmp_path / "t.json"
    base = get("igemm_production")
    if text is None:
        good = ht.TuneCache(path, environment=ENV)
        good.store(base, P2, entry("128x256x32_w2x4_s3_b1_sw2"))
        data = json.loads(path.read_text())
        data[good.key(base, P1)] = {"config": "128x256x32_w2x4_s3_b1_sw2"}  # no time, no rule: malformed
        text = json.dumps(data)
    path.write_text(text)
    with pytest.warns(ht.TuneCacheWarning, match=words) as seen:
        cache = ht.TuneCache(path, environment=ENV)
    assert len(seen) == 1 and str(path) in str(seen[0].message)
    v = ht.tuned(base, cache)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no more warnings: the bad entry is simply not there
        assert v.launches(P1)[0].entry == base.launches(P1)[0].entry
    cache.store(base, P1, entry())
    assert ht.TuneCache(path, environment=ENV).lookup(base, P1)["config"] == entry()["config"]


def test_an_unknown_or_failing_cached_choice_runs_the_rule_with_a_warning(tmp_path, monkeypatch):
    """A cached configuration the space cannot build (a ValueError from `tuned.supports` before)
    runs the rule with a warning naming the file. With a GPU, a cached choice is checked with
    `helpers.check.check` once per (problem, choice), by the variant's review when `prepare`
    first runs it, after the tensor checks (planning it, `supports` included, launches nothing);
    one that fails runs the rule, one whose check raises runs the rule for that call and is checked
    again on the next."""
    base = get("igemm_production")
    cache = ht.TuneCache(tmp_path / "t.json", environment=ENV)
    cache.store(base, P1, entry("no_such_tile_sw9"))
    v = ht.tuned(base, cache)
    with pytest.warns(ht.TuneCacheWarning, match=r"t\.json.*'no_such_tile_sw9'"):
        assert v.supports(P1, smem_limit=227 * 1024) is None
    assert v.launches(P1)[0].entry == base.launches(P1)[0].entry

    cfg, tuned_entry = "128x256x32_w2x4_s3_b1_sw2", "igemm_production_128x256x32_w2x4_s3_b1_optimized_fp16"
    rule_entry = base.launches(P2)[0].entry
    cache.store(base, P2, entry(cfg))
    checked = []
    monkeypatch.setattr(gpu, "has_gpu", lambda: True)
    for verdict in ("pass", "fail", "raise"):
        def check(plan, verdict=verdict):
            checked.append(plan.variant.name)
            if verdict == "raise" and len(checked) == 1:
                raise RuntimeError("CUDA out of memory (planted)")
            return SimpleNamespace(ok=verdict != "fail", reason="planted")

        monkeypatch.setattr(hts, "check", check)
        checked.clear()
        v = ht.tuned(base, cache)
        plan = v.plan(P2)
        assert v.supports(P2, smem_limit=227 * 1024) is None and plan.launches[0].entry == tuned_entry
        assert not checked  # planning launches nothing
        with pytest.raises(ValueError, match="kernels need CUDA tensors"):
            prepare(v, P2, *P2.make_inputs())  # bad tensors: refused before the review's check
        assert not checked

        def review(v=v):
            return v.plan(P2, config=v.review_fn(P2, v.plan(P2).config)).launches[0].entry

        if verdict == "pass":
            assert [review() for _ in range(3)] == [tuned_entry] * 3
            assert len(checked) == 1 and cfg in checked[0]  # once per problem and choice
        elif verdict == "fail":
            with pytest.warns(ht.TuneCacheWarning, match="failed the check"):
                assert review() == rule_entry
            assert review() == rule_entry and v.launches(P2)[0].entry == rule_entry and len(checked) == 1
        else:
            with pytest.warns(ht.TuneCacheWarning, match="raised RuntimeError"):
                assert review() == rule_entry  # the rule, for that call
            assert review() == tuned_entry and len(checked) == 2  # checked again: passes now


def test_a_winner_that_fails_the_full_check_is_replaced_and_a_wrong_rule_is_reported(monkeypatch, tmp_path):
    """Before it is cached the winner passes `check_winner` (`helpers.check.check`, whose integer
    run sees what a long bf16 rounding bound cannot); the next fastest takes the place of one that
    fails. A rule (prior) whose output fails the check makes the row's status say so."""
    sp, names = toy_space()
    ms = {names[0]: 1.0, names[1]: 0.5, names[2]: 0.6, names[3]: 0.9}
    FakeGPU(monkeypatch, ms, inexact=[names[1]])
    row = ht.tune_problem(sp, P1, ht.TuneCache(tmp_path / "a.json", environment=ENV), keep=6)
    assert row["config"] == names[2] and row["disagreed"] == 1 and row["status"] == "ok"
    FakeGPU(monkeypatch, ms, wrong=[names[3]])  # the prior
    row = ht.tune_problem(sp, P1, None, keep=6)
    assert row["status"].startswith("rule failed the check") and math.isnan(row["rule_ms"])
    FakeGPU(monkeypatch, ms, wrong=names)
    with pytest.raises(RuntimeError, match="no configuration of igemm_production on .* passed the check"):
        ht.tune_problem(sp, P1, None, keep=6)


def test_source_hash_is_answered_without_a_stat_until_its_recheck_time(tmp_path, monkeypatch):
    """Within `SOURCE_RECHECK_S` of its last check a hash is a lookup (no ``stat``: a training
    step asks on every call); after it, an edit is seen."""
    kdir = tmp_path / "kernels"
    shutil.copytree(hc.KERNEL_DIR, kdir)
    monkeypatch.setattr(hc, "KERNEL_DIR", kdir)
    clock = [100.0]
    monkeypatch.setattr(hc.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(hc, "SOURCE_RECHECK_S", 0.5)
    first = hc.source_hash("14_dgrad.cu")
    stats = []
    real_stat = hc.os.stat
    monkeypatch.setattr(hc.os, "stat", lambda path, *a, **k: stats.append(path) or real_stat(path, *a, **k))
    cu = kdir / "14_dgrad.cu"
    cu.write_text(cu.read_text() + "\n// edited\n")
    clock[0] += 0.4
    assert hc.source_hash("14_dgrad.cu") == first and stats == []
    clock[0] += 0.2
    assert hc.source_hash("14_dgrad.cu") != first and stats


def test_source_hash_follows_includes():
    """14_dgrad.cu and 13_igemm_production.cu include igemm_mainloop.cuh: their hashes differ, and each is stable."""
    assert hc.source_hash("14_dgrad.cu") == hc.source_hash("14_dgrad.cu")
    assert hc.source_hash("14_dgrad.cu") != hc.source_hash("13_igemm_production.cu")


# ---- pruning and the model ----------------------------------------------------------------------------------


def random_problems(n=40, seed=15):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r = rng.choice((1, 3, 5))
        h = rng.choice((7, 14, 28, 56, 112))
        out.append(Conv2dProblem(N=rng.choice((1, 4, 32, 128)), C=8 * rng.randint(1, 64), H=h, W=h,
                                 K=8 * rng.randint(1, 128), R=r, S=r, padding=r // 2, stride=rng.choice((1, 2)),
                                 **NHWC16))
    return out


@pytest.mark.parametrize("keep", [1, 4, 8])
def test_pruning_never_drops_the_models_first_choice_the_families_favourites_or_the_prior(keep, machine):
    for p in random_problems():
        cands = space.candidates(p, machine)
        kept = ht.prune(cands, keep)
        first = min(cands, key=lambda c: c.model_us)
        assert kept[0].config == first.config and kept[0].model_us == first.model_us
        assert sum(c.prior for c in cands) == 1 and any(c.prior for c in kept)
        families = {c.family for c in cands}
        assert len(kept) <= keep + len(families) + 1
        best_of = {f: min((c for c in cands if c.family == f), key=lambda c: c.model_us).config for f in families}
        assert set(best_of.values()) <= {c.config for c in kept}  # each block shape's favourite is timed
        top = sorted(cands, key=lambda c: c.model_us)[:keep]
        assert {c.config for c in top} <= {c.config for c in kept}
        assert [c.model_us for c in kept] == sorted(c.model_us for c in kept)


def test_the_model_counts_waves_and_prefers_bigger_warp_tiles(machine):
    """Sanity of `gemm_tile_us` on the tensor-core term (the machine's DRAM and L2 made 100 times
    faster, so that they cannot hide it): one block past a full wave (the resident blocks on every
    SM) costs a second round; a smaller warp tile is less efficient."""
    mc = replace(machine, dram_gbps=100 * machine.dram_gbps, l2_gbps=100 * machine.l2_gbps)
    t = ht.GemmTile(m=128, n=128, k=1152, bm=128, bn=128, bk=64, warp_m=64, warp_n=64, threads=128, stages=3,
                    shared_bytes=98304, regs=255)
    # 96 KB (plus the reservation) per block; 255 registers x 128 threads: 32 Ki registers per block
    occ = min(mc.smem_per_sm // (98304 + mc.smem_reserved_per_block), mc.regs_per_sm // 32768,
              mc.threads_per_sm // 128, mc.blocks_per_sm)
    assert ht.occupancy(t, mc) == occ >= 1
    wave = occ * mc.sms * 128  # GEMM-M of exactly one full wave of 128 x 128 tiles
    one_wave, two_waves = ht.gemm_tile_us(replace(t, m=wave), mc), ht.gemm_tile_us(replace(t, m=wave + 128), mc)
    assert two_waves - mc.launch_us > 1.5 * (one_wave - mc.launch_us)
    small_warps = replace(t, m=wave, warp_m=32, warp_n=32, threads=512, regs=128)
    assert ht.gemm_tile_us(small_warps, mc) > one_wave


# ---- day 13's space -----------------------------------------------------------------------------------------


def test_space_tiles_are_valid_and_include_the_instantiated_ones():
    tiles = space.tiles()
    assert all(t.reason(instantiated=False) is None for t in tiles)
    names = {t.name for t in tiles}
    opt = {n for n, its in INSTANTIATED.items() if "optimized" in its}
    assert opt <= names and len(tiles) > 4 * len(opt)


def test_config_names_round_trip_and_variations_are_the_other_swizzles():
    t = TileDescription.parse("128x64x32_w2x2_s4_b1")
    assert space.parse_config(space.config_name(t, 2)) == (t, 2)
    with pytest.raises(ValueError, match="configuration looks like"):
        space.parse_config("128x64x32_w2x2_s4_b1")
    p = replace(P1, K=512, name="")  # 8 filter tiles of 64: swizzles 0..3
    assert space.variations("128x64x32_w2x2_s4_b1_sw1", p) == [f"128x64x32_w2x2_s4_b1_sw{s}" for s in (0, 2, 3)]
    assert space.variations("128x128x64_w2x2_s3_b1_sw0", replace(P1, K=128, name="")) == []  # one filter tile


def test_space_prior_is_the_rule_and_other_iterators_keep_the_rule(machine):
    for p in suite("resnet50", **NHWC16):
        prior = [c for c in space.candidates(p, machine) if c.prior]
        assert len(prior) == 1 and prior[0].config.startswith(choose(p).tile.name)
    odd = Conv2dProblem(N=2, C=3, H=32, W=32, K=64, R=3, S=3, padding=1, **NHWC16)  # C = 3: few_channels
    (only,) = space.candidates(odd, machine)
    assert only.prior and only.config.startswith("rule:") and only.variant is get("igemm_production")


def test_a_tile_built_alone_launches_its_entry_with_its_defines():
    t = TileDescription.parse("128x256x32_w2x4_s3_b1")
    assert t.name not in INSTANTIATED and t.reason() is not None and t.reason(instantiated=False) is None
    v = space.variant_for(space.config_name(t, 1))
    (k,) = v.launches(P1)
    assert k.entry == f"igemm_production_{t.name}_optimized_fp16"
    assert k.build_defines(v) == tune_defines(t, "fp16")
    assert v.supports(P1, smem_limit=227 * 1024) is None
    assert get("igemm_production").launches(P1)[0].defines == ()  # the registered variant builds the file's entries


@pytest.mark.nvcc
def test_a_tile_built_alone_compiles_to_its_one_entry_without_spills():
    t = TileDescription.parse("128x256x32_w2x4_s3_b1")
    reports, log = hc.nvcc_compile("13_igemm_production.cu", arch="sm_90", defines=tune_defines(t, "bf16"))
    assert [r.entry for r in reports] == [f"igemm_production_{t.name}_optimized_bf16"], log
    assert reports[0].spill_stores == 0 and reports[0].spill_loads == 0


@pytest.mark.nvcc
def test_tiles_merged_into_one_build_compile_each_entry_as_built_alone(tmp_path, monkeypatch):
    """Three tiles in one nvcc run (`helpers.compile.merge_jobs` with day 13's `tune_entry_line`):
    the build holds exactly their three entries, each with the registers and spills of its build alone."""
    tiles = [TileDescription.parse(n) for n in ("128x256x32_w2x4_s3_b1", "64x64x32_w2x2_s4_b1", "128x64x64_w2x2_s3_b2")]
    jobs = [("13_igemm_production.cu", tune_defines(t, dt)) for t, dt in zip(tiles, ("fp16", "bf16", "fp16"))]
    ((cu_file, defines, appended, members),) = hc.merge_jobs(jobs, space.SPACE.merge, groups=1)
    assert members == [0, 1, 2] and defines == jobs[0][1] and appended.count("PIPE_TUNE_ENTRY(") == 2
    merged = tmp_path / "merged.cu"
    merged.write_text(hc.kernel_path(cu_file).read_text() + appended)
    monkeypatch.setattr(hc, "kernel_path", lambda f: merged if f == "merged.cu" else hc.KERNEL_DIR / f)
    got, log = hc.nvcc_compile("merged.cu", arch="sm_80", defines=defines)
    alone = [hc.nvcc_compile(f, arch="sm_80", defines=d)[0][0] for f, d in jobs]
    assert sorted(got, key=lambda r: r.entry) == sorted(alone, key=lambda r: r.entry), log


def test_merge_jobs_shares_builds_only_between_jobs_that_can():
    def line(cu_file, defines):  # jobs of a.cu with a tile T share builds
        return f"ENTRY({defines['T']})" if cu_file == "a.cu" and "T" in defines else None

    jobs = [("a.cu", {"T": 1}), ("b.cu", {"T": 2}), ("a.cu", {"T": 3}), ("a.cu", {"Y": 2}), ("a.cu", {"T": 5}),
            ("a.cu", None), ("a.cu", {"T": 7})]
    builds = hc.merge_jobs(jobs, line, groups=2)
    assert sorted(builds, key=lambda b: b[3]) == [
        ("a.cu", {"T": 1}, "ENTRY(3)\n", [0, 2]),  # two runs, in order: the first job's defines, the rest appended
        ("b.cu", {"T": 2}, "", [1]),  # another file
        ("a.cu", {"Y": 2}, "", [3]),  # not a tile: a build of its own
        ("a.cu", {"T": 5}, "ENTRY(7)\n", [4, 6]),
        ("a.cu", {}, "", [5]),
    ]
    assert sorted(i for *_, m in hc.merge_jobs(jobs, line, groups=64) for i in m) == list(range(len(jobs)))
    assert [m for *_, m in hc.merge_jobs(jobs, None, groups=2)] == [[i] for i in range(len(jobs))]


def test_day13s_entry_line_is_its_tiles_macro_and_nothing_else():
    t = TileDescription.parse("128x256x32_w2x4_s3_b1")
    line = tiles_mod.tune_entry_line("13_igemm_production.cu", tune_defines(t, "bf16"))
    assert line == "PIPE_TUNE_ENTRY(128, 256, 32, 2, 4, 3, 1, OPTIMIZED, optimized, true, bf16)"
    assert tiles_mod.tune_entry_line("13_igemm_production.cu", {}) is None  # the file's own entries
    assert tiles_mod.tune_entry_line("14_dgrad.cu", tune_defines(t, "fp16")) is None
    assert "define PIPE_TUNE_ENTRY(" in hc.kernel_path("13_igemm_production.cu").read_text()


# ---- the search with a stand-in GPU -------------------------------------------------------------------------


def _config(variant) -> str:
    """The configuration a search candidate's variant name carries (``igemm_production[<config>]``)."""
    return variant.name[variant.name.index("[") + 1 : -1] if "[" in variant.name else "rule"


def stand_in_device(monkeypatch) -> None:
    """A stand-in sm_90 device for `helpers.gpu.device_info` (what the search asks of it: the
    compute capability and the shared memory a block may opt into), the CPU tests' machine
    (`conftest.model_machine`) as the measured one, and builds that take 0.5 s and do nothing."""
    monkeypatch.setattr(hts, "build_many", lambda jobs, arch, workers=None, entry_line=None: 0.5)
    monkeypatch.setattr(hts, "is_built", lambda cu_file, defines, arch: False)
    info = SimpleNamespace(smem_per_block_optin=227 * 1024, cc=(9, 0))
    monkeypatch.setattr(gpu, "device_info", lambda device=0: info)
    mc = model_machine()
    monkeypatch.setattr(hts, "machine_for", lambda info=None, path=None: mc)


class FakeGPU:
    """`_time_ms` from a table {config: ms} (one call per timing round, counted), outputs that
    pass the check unless the config is in ``wrong``; builds, the reference and the device stubbed."""

    def __init__(self, monkeypatch, ms: dict, wrong=(), inexact=()):
        self.ms, self.wrong, self.calls = ms, set(wrong), []
        monkeypatch.setattr(hts, "_time_ms", self.time_ms)
        monkeypatch.setattr(hts, "_inputs", lambda p: ())
        self.checked = []
        verdict = SimpleNamespace(reason=lambda v, out: self.checked.append(_config(v)) or (
            None if bool((out == 1).all()) else "planted wrong output"))
        monkeypatch.setattr(ht.Reference, "of", classmethod(lambda cls, p, inputs: verdict))
        monkeypatch.setattr(hts, "check_winner", lambda plan: "planted: integer inputs but not bit-exact"
                            if _config(plan.variant) in set(inexact) else None)
        stand_in_device(monkeypatch)

    def time_ms(self, plan, inputs, reps, target_ms=0.0):
        cfg = _config(plan.variant)
        self.calls.append((cfg, reps))
        out = torch.full((4,), 2.0 if cfg in self.wrong else 1.0)
        return self.ms.get(cfg, 1.0), out


def toy_space(n: int = 6) -> tuple[ht.Space, list[str]]:
    """Six tiles of day 13 with made-up model times (the first ranked best), the fourth the prior."""
    tiles = [t for t in space.tiles() if t.bk == 32][:n]
    names = [space.config_name(t, 0) for t in tiles]

    def candidates(p, machine):
        return [ht.Candidate(c, space.variant_for(c), 10.0 + i, prior=i == 3) for i, c in enumerate(names)]

    def variations(cfg, p):
        return [cfg.replace("_sw0", "_sw1")] if cfg.endswith("_sw0") else []

    return ht.Space("igemm_production", candidates, variations, lambda cfg, p: space.variant_for(cfg)), names


def test_search_stops_early_never_picks_a_wrong_output_and_tries_variations(monkeypatch, tmp_path):
    sp, names = toy_space()
    ms = {names[0]: 1.0, names[1]: 0.5, names[2]: 0.52, names[3]: 0.9, names[4]: 0.3, names[5]: 0.8,
          names[1].replace("_sw0", "_sw1"): 0.45}
    fake = FakeGPU(monkeypatch, ms, wrong=[names[4]])  # the fastest gives a wrong output
    cache = ht.TuneCache(tmp_path / "t.json", environment=ENV)
    row = ht.tune_problem(sp, P1, cache, keep=6)
    assert row["config"] == names[1].replace("_sw0", "_sw1")  # 0.45: the winner's variation beat it
    assert row["rule_config"] == names[3] and row["rule_ms"] == 0.9
    assert row["disagreed"] == 1 and row["cache"] == "miss" and row["compile_s"] == 0.5
    more = {cfg for cfg, reps in fake.calls if reps == ht.CLOSE_REPS}
    assert names[1] in more and names[2] in more  # within LOSER of the best: timed again
    assert names[0] not in more and names[3] not in more and names[5] not in more  # clear losers: stopped early
    assert names[4] not in more
    assert fake.checked == [cfg for cfg, _ in fake.calls]  # every timing round's output was checked
    n = len(fake.calls)
    hit = ht.tune_problem(sp, P1, cache, keep=6)
    assert len(fake.calls) == n and hit["cache"] == "hit" and hit["config"] == row["config"]  # no timing at all


SMALL = Conv2dProblem(N=2, C=16, H=10, W=9, K=24, R=3, S=3, padding=1, **NHWC16)


class OneBlock:
    """A stand-in GPU whose candidates compute the real output (the float64 reference rounded to
    fp16) into one reused block of memory, as a caching allocator hands the block the previous
    output just freed to the next; a candidate in ``half`` writes only the first half of it."""

    def __init__(self, monkeypatch, p: Conv2dProblem, ms: dict, half=()):
        from helpers.reference import reference

        self.inputs = p.make_inputs(kind="normal", seed=1)
        y = p.from_logical(reference(p, *self.inputs).to(p.torch_dtype)).reshape(-1)
        block = torch.zeros(p.output_shape, dtype=p.torch_dtype)

        def prepare(plan, *inputs):
            cfg = _config(plan.variant)

            def plan():
                n = y.numel() // 2 if cfg in half else y.numel()
                block.view(-1)[:n] = y[:n]

            plan.cfg = cfg
            return plan, block

        stand_in_device(monkeypatch)
        monkeypatch.setattr(hts, "prepare", prepare)
        monkeypatch.setattr(hts, "time_gpu", lambda plan, warmup=1, reps=None, target_ms=0.0: plan() or
                            SimpleNamespace(ms_p50=ms.get(plan.cfg, 1.0)))
        monkeypatch.setattr(hts, "_inputs", lambda problem: self.inputs)
        monkeypatch.setattr(hts, "check_winner", lambda plan: None)  # the reference check is under test


def test_a_candidate_that_writes_half_its_output_is_never_chosen(monkeypatch, tmp_path):
    """Every candidate's output is poisoned with NaN before it runs and checked against the float64
    reference with the harness's bound: the fastest candidate, which writes half its grid, fails
    (its other half was the previous candidate's output, which "agreed" with the prior's before)
    and is counted as disagreeing; the search picks the fastest correct one, also exhaustively."""
    sp, names = toy_space()
    ms = {names[0]: 1.0, names[1]: 0.5, names[2]: 0.3, names[3]: 0.9}
    OneBlock(monkeypatch, SMALL, ms, half=[names[2]])
    row = ht.tune_problem(sp, SMALL, ht.TuneCache(tmp_path / "t.json", environment=ENV), keep=6, exhaustive=True)
    assert row["config"] == names[1] and row["disagreed"] == 1
    assert row["best_config"] == names[1] and math.isnan(row["sweep"][names[2]][1])


def test_the_reference_sees_a_dropped_tap_and_a_nan():
    """`Reference.reason` is the harness's verdict: the rounded float64 output passes, the output of
    the same convolution with one filter tap dropped fails (relative L2), and a NaN fails."""
    from helpers.reference import reference

    v = get("igemm_production")
    x, w = SMALL.make_inputs(kind="normal", seed=1)
    y = SMALL.from_logical(reference(SMALL, x, w).to(torch.float16))
    ref = ht.Reference.of(SMALL, (x, w))
    assert ref.expected is not None and ref.reason(v, y) is None
    w_dropped = w.clone()
    w_dropped[:, 1, 2, :] = 0  # KRSC: tap (r, s) = (1, 2) of every filter
    y_dropped = SMALL.from_logical(reference(SMALL, x, w_dropped).to(torch.float16))
    assert "relative L2 error" in ref.reason(v, y_dropped)
    y_nan = y.clone()
    y_nan.view(-1)[7] = float("nan")
    assert "NaN/Inf" in ref.reason(v, y_nan)


def test_pruned_search_keeps_the_prior_and_exhaustive_finds_what_pruning_missed(monkeypatch):
    sp, names = toy_space()
    ms = {names[5]: 0.2}  # the model ranks it last: pruned away at keep = 2
    fake = FakeGPU(monkeypatch, ms)
    row = ht.tune_problem(sp, P1, None, keep=2)
    timed = {cfg for cfg, _ in fake.calls}
    assert names[3] in timed and names[5] not in timed  # the prior (rank 4) survives; rank 6 does not
    assert row["survivors"] == 3 and row["candidates"] == 6 and row["model_rank"] == 4  # all tie: the prior wins
    full = ht.tune_problem(sp, P1, None, keep=2, exhaustive=True)
    assert full["best_config"] == names[5] and full["best_ms"] == 0.2
    assert math.isclose(full["ms"], row["ms"])


def test_tune_runs_every_problem_and_records_a_fault(monkeypatch, tmp_path):
    sp, names = toy_space()
    FakeGPU(monkeypatch, {names[1]: 0.5})
    monkeypatch.setitem(ht.SPACES, "igemm_production", sp)
    bad = Conv2dProblem(N=1, C=8, H=8, W=8, K=8, R=3, S=3, padding=1, dtype="fp32", layout="NCHW")  # adapted
    df = ht.tune("igemm_production", [P1, P2, bad], ht.TuneCache(tmp_path / "t.json", environment=ENV),
                 progress=False)
    assert list(df.status) == ["ok", "ok", "ok"] and list(df.config[:2]) == [names[1]] * 2
    assert df.tune_s.sum() > 0 and df.compile_s.sum() == pytest.approx(0.5)

    def broken(p, machine):
        raise RuntimeError("boom")

    monkeypatch.setitem(ht.SPACES, "igemm_production", replace(sp, candidates=broken))
    df = ht.tune("igemm_production", [P1], None, progress=False)
    assert df.status[0] == "error: RuntimeError: boom"


def test_tuned_variant_runs_the_cached_choice_else_the_rule(tmp_path):
    cache = ht.TuneCache(tmp_path / "t.json", environment=ENV)
    base = get("igemm_production")
    cfg = "128x256x32_w2x4_s3_b1_sw2"
    cache.store(base, P1, entry(cfg))
    v = ht.tuned("igemm_production", cache)
    assert v.name == "igemm_production_tuned"
    (k,) = v.launches(P1)
    assert k.entry == "igemm_production_128x256x32_w2x4_s3_b1_optimized_fp16" and k.args[-1] == 2
    assert dict(k.defines) == tune_defines(TileDescription.parse("128x256x32_w2x4_s3_b1"), "fp16")
    assert v.launches(P2)[0].entry == base.launches(P2)[0].entry  # not in the cache: the rule's
    assert v.supports(P1, smem_limit=227 * 1024) is None


def test_spaces_are_registered_and_unknown_variants_refused():
    assert ht.space_of("igemm_production").variant == "igemm_production"
    with pytest.raises(KeyError, match="has no search space; tunable:"):
        ht.space_of("naive")


def test_cli_without_a_gpu_and_with_a_bad_variant(monkeypatch, capsys):
    from benchmarks import tune as cli

    assert cli.main(["--variants", "no_such_variant"]) == 2
    assert "no variant 'no_such_variant'" in capsys.readouterr().err
    monkeypatch.setattr(gpu, "has_gpu", lambda: False)
    assert cli.main(["--suite", "resnet50"]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err


def test_cli_writes_the_tuning_the_sweep_and_cudnns_columns(monkeypatch, tmp_path):
    """The command's flow with the tuner and cuDNN stood in: one CSV row per problem with the
    x cuDNN columns and the versions, the sweep in its own CSV, exit 0; a cuDNN fault is a column."""
    import pandas as pd

    from benchmarks import tune as cli

    problems = suite("resnet50", **NHWC16)[:3]
    seen = {}

    def fake_tune(variant, probs, cache, keep, exhaustive, budget_s, progress, timed):
        seen.update(variant=variant, n=len(probs), exhaustive=exhaustive, keep=keep)
        assert timed
        return pd.DataFrame([{"problem": p.name, "variant": variant, "config": "c", "ms": 0.1, "rule_ms": 0.12,
                              "tune_s": 0.5, "best_ms": 0.09, "status": "ok",
                              "sweep": {"c": (10.0, 0.1), "d": (12.0, 0.09)}} for p in probs])

    def fake_cudnn(p):
        if p.K == 64:
            raise RuntimeError("no algorithm")
        return {"cudnn_ms": 0.08, "cudnn_first_s": 0.2, "cudnn_kernels": "sm90_xmma_fprop"}

    monkeypatch.setattr(gpu, "has_gpu", lambda: True)
    monkeypatch.setattr(gpu, "versions", lambda: {"gpu": "NVIDIA H200", "driver": "580", "cuda": "13.0"})
    monkeypatch.setattr(ht, "tune", fake_tune)
    monkeypatch.setattr(cli, "cudnn_columns", fake_cudnn)
    fp32 = [replace(p, dtype="fp32", layout="NCHW", name="") for p in problems]
    monkeypatch.setattr("helpers.suites.SUITES", {"resnet50": lambda: fp32})
    rc = cli.main(["--suite", "resnet50", "--variants", "igemm_production", "--exhaustive", "--cold", "--out",
                   str(tmp_path), "--no-progress"])
    assert rc == 0 and seen == {"variant": "igemm_production", "n": 3, "exhaustive": True, "keep": ht.KEEP}
    df = pd.read_csv(tmp_path / "tune_resnet50_igemm_production_fp16_NHWC.csv")
    for col in ("problem", "variant", "config", "ms", "best_ms", "tune_s", "x_cudnn", "rule_x_cudnn", "gpu", "date"):
        assert col in df, col
    assert df.x_cudnn.iloc[0] == pytest.approx(0.8) and df.cudnn_error.notna().sum() == 2  # the K = 64 layers
    sw = pd.read_csv(tmp_path / "tune_resnet50_igemm_production_fp16_NHWC_sweep.csv")
    assert len(sw) == 6 and set(sw.columns) == {"problem", "config", "model_us", "ms"}
    assert list(df.top1_ms) == [0.1] * 3 and list(df.top3_ms) == [0.09] * 3  # "c" is the model's first
    assert list(df.sweep_best_ms) == [0.09] * 3 and "sweep_variations" not in df
    assert cli.main(["--no-time", "--exhaustive"]) == 2


def test_top_k_is_the_models_first_picks_measured():
    """top-1: the configuration of the lowest prediction, timed or not; top-3: the best of the
    first three; a pick that failed the check (NaN) is missing, not fast; ties keep the sweep's order."""
    from benchmarks.tune import summary, top_k_ms

    sweep = {"a": (5.0, 0.30), "a_var": (5.0, 0.20), "b": (4.0, float("nan")), "c": (9.0, 0.10), "d": (6.0, 0.25)}
    assert top_k_ms(sweep, 1) != top_k_ms(sweep, 1)  # "b", the model's pick, failed: NaN
    assert top_k_ms(sweep, 2) == 0.30 and top_k_ms(sweep, 3) == 0.20 and top_k_ms(sweep, 5) == 0.10
    # a variation is not one of the model's picks: the third is then "d"
    assert top_k_ms(sweep, 3, {"a_var"}) == 0.25 and top_k_ms(sweep, 4, {"a_var"}) == 0.10
    with pytest.raises(ValueError):
        top_k_ms(sweep, 0)
    import pandas as pd

    from benchmarks.tune import add_top_k

    rows = add_top_k(pd.DataFrame({"sweep": [sweep], "sweep_variations": [frozenset({"a_var"})]}))
    assert (rows.top1_ms.isna()[0], rows.top3_ms[0], rows.sweep_best_ms[0]) == (True, 0.25, 0.10)
    # against the sweep's own short times, not the final re-timing (best_ms), which runs a few % slower
    df = pd.DataFrame({"status": ["ok", "ok"], "tune_s": [1.0, 1.0], "ms": [0.1, 0.2], "best_ms": [0.5, 0.5],
                       "sweep_best_ms": [0.1, 0.2], "top1_ms": [0.1, math.nan], "top3_ms": [0.1, 0.25]})
    s = summary(df)
    assert s["top1_over_best"] == pytest.approx(1.0) and s["top1_failed"] == 1
    assert s["top3_over_best"] == pytest.approx((0.8) ** 0.5)


def test_bench_cli_adds_tuned_flavours_after_tunable_variants(tmp_path):
    """``python -m benchmarks --tuned CACHE``: each variant with a search space is followed by its
    tuned flavour reading that cache; the others are left alone."""
    from benchmarks.__main__ import parse_args, with_tuned

    cache = tmp_path / "t.json"
    ht.TuneCache(cache, environment=ENV)  # an empty cache file need not exist yet
    vs = with_tuned([get("igemm_mma"), get("igemm_production")], str(cache))
    assert [v.name for v in vs] == ["igemm_mma", "igemm_production", "igemm_production_tuned"]
    assert str(cache) in vs[-1].summary
    assert parse_args(["--tuned"]).tuned == "default" and parse_args([]).tuned is None
    assert parse_args(["--tuned", str(cache)]).tuned == str(cache)


def test_wgrad_space_has_the_rule_as_prior_and_splits_as_launch_arguments(machine):
    from days.day14_backward import choose_wgrad
    from days.day14_backward import space as wsp

    sp = ht.space_of("wgrad")
    for p in suite("resnet50", op="wgrad", **NHWC16):
        cands = sp.candidates(p, machine)
        (prior,) = [c for c in cands if c.prior]
        rule = choose_wgrad(p)
        assert prior.config == wsp.config_name(rule.tile, rule.splits)
        assert {c.family for c in cands} == set(wsp.tiles())  # every WGRAD_ENTRY tile
        for c in cands:
            tile, s = wsp.parse_config(c.config)
            assert 1 <= s <= wsp.max_splits(p, tile) or s == rule.splits
    p = suite("resnet50", op="wgrad", **NHWC16)[0]
    v = sp.variant_for("128x64x32_w2x2_s4_k16", p)
    main, reduce = v.launches(p)
    assert main.config.grid[2] == 16 and reduce.name == "reduce" and main.defines == ()  # one module for every tile
    assert sp.variations("128x64x32_w2x2_s4_k16", p) == ["128x64x32_w2x2_s4_k11", "128x64x32_w2x2_s4_k23"]
    with pytest.raises(ValueError, match="WGRAD_ENTRY tile"):
        wsp.parse_config("96x64x32_w2x2_s4_k4")


def test_tune_runs_a_backward_space_on_an_fprop_suite(monkeypatch, tmp_path):
    """`tune` turns the suite's fprop problems into the variant's own operation (wgrad here)."""
    FakeGPU(monkeypatch, {})
    seen = []
    real = ht.measure

    def measure(space, search, cache=None):
        seen.append(search.problem.op)
        return real(space, search, cache)

    monkeypatch.setattr(hts, "measure", measure)
    df = ht.tune("wgrad", suite("resnet50", **NHWC16)[:2], None, progress=False)
    assert list(df.status) == ["ok", "ok"] and seen == ["wgrad", "wgrad"]
    assert all(cfg.rsplit("_k", 1)[0] in wgrad_tiles() for cfg in df.config)


def test_dgrad_space_is_the_entries_of_the_problems_iterator_with_the_rule_as_prior(machine):
    from days.day14_backward import dgrad as dg

    sp = ht.space_of("dgrad")
    for p in suite("resnet50", op="dgrad", **NHWC16) + [replace(P1, op="dgrad", K=12, name="")]:
        rule = dg.choose_config(p)
        cands = sp.candidates(p, machine)
        (prior,) = [c for c in cands if c.prior]
        assert prior.config == space.config_name(rule.tile, rule.swizzle)
        assert {c.family for c in cands} == {n for n, its in dg.instantiated().items() if rule.iterator in its}
        for c in cands:
            (k, *_) = [k for k in c.variant.launches(p) if k.name.startswith("phase")]
            assert k.entry.endswith(f"{space.parse_config(c.config)[0].name}_{rule.iterator}_fp16")
    assert "no entry for tile 256x64x32_w4x2_s4_b1" in dg.make_dgrad("x", tile="256x64x32_w4x2_s4_b1").supports(
        replace(P1, op="dgrad", name=""), smem_limit=227 * 1024)
    with pytest.raises(ValueError, match="swizzle = 7"):
        dg.make_dgrad("x", swizzle=7)


@pytest.mark.parametrize("keep", ["0", "-3", "two"])
def test_keep_below_one_is_refused(keep, capsys, machine):
    """``--keep 0`` was taken as the default 8 silently (``args.keep or KEEP``); 0, a negative
    count or no integer is an argument error now, and `prune` refuses keep < 1."""
    from benchmarks.tune import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(["--keep", keep])
    assert e.value.code == 2 and "--keep" in capsys.readouterr().err
    assert parse_args(["--keep", "1"]).keep == 1 and parse_args([]).keep is None
    with pytest.raises(ValueError, match="at least 1"):
        ht.prune(space.candidates(P1, machine), 0)


def test_a_choice_this_process_tuned_is_not_checked_again(monkeypatch, tmp_path):
    """`measure` passes its winner through `check_winner` before storing it: the tuned variant
    reading the same cache object trusts that choice without a second `helpers.check.check`; a
    fresh cache object (another process) checks it once."""
    sp, names = toy_space()
    FakeGPU(monkeypatch, {names[1]: 0.5})
    monkeypatch.setitem(ht.SPACES, "igemm_production", sp)
    cache = ht.TuneCache(tmp_path / "t.json", environment=ENV)
    row = ht.tune_problem(sp, P1, cache, keep=6)
    checked = []
    monkeypatch.setattr(hts, "check", lambda plan: checked.append(plan.variant.name) or SimpleNamespace(ok=True,
                                                                                                     reason=""))
    monkeypatch.setattr(gpu, "has_gpu", lambda: True)
    t = ht.tuned("igemm_production", cache)
    t.review_fn(P1, t.plan(P1).config)
    assert cache.checked(get("igemm_production"), P1, row["config"]) and checked == []
    t = ht.tuned("igemm_production", ht.TuneCache(tmp_path / "t.json", environment=ENV))
    monkeypatch.setattr(gpu, "capturing", lambda: True)  # a CUDA graph is being captured: no check may run
    assert t.review_fn(P1, t.plan(P1).config) == get("igemm_production").config_fn(P1) and checked == []
    monkeypatch.setattr(gpu, "capturing", lambda: False)
    t.review_fn(P1, t.plan(P1).config)
    assert len(checked) == 1 and row["config"] in checked[0]


def test_the_default_run_tunes_only_the_spaces_this_gpu_builds(monkeypatch, tmp_path):
    """``python -m benchmarks.tune`` with no --variants: on an sm_80 GPU the Hopper spaces (days 16,
    18, 19: sm_90a only) are left out, not written as rows of refusals; on sm_90 every space runs."""
    import pandas as pd

    from benchmarks import tune as cli

    seen = []
    monkeypatch.setattr(gpu, "has_gpu", lambda: True)
    monkeypatch.setattr(gpu, "versions", lambda: {"gpu": "NVIDIA A100", "driver": "580", "cuda": "13.0"})
    monkeypatch.setattr(ht, "tune", lambda variant, probs, *a, **k: seen.append(variant) or pd.DataFrame(
        [{"problem": "p", "variant": variant, "status": "ok", "tune_s": 0.0}]))
    for cc, hopper in (((8, 0), False), ((9, 0), True)):
        seen.clear()
        monkeypatch.setattr(gpu, "device_info", lambda device=None, cc=cc: SimpleNamespace(cc=cc))
        assert cli.main(["--no-cudnn", "--out", str(tmp_path), "--no-progress"]) == 0
        assert {"igemm_production", "dgrad", "wgrad"} <= set(seen)
        assert ({"igemm_wgmma", "dgrad_wgmma", "wgrad_wgmma"} <= set(seen)) == hopper, (cc, seen)


def test_the_zero_timing_pick_builds_and_times_nothing_and_a_timed_search_replaces_it(monkeypatch, tmp_path):
    """``tune(..., timed=False)`` (``--no-time``): the model's first choice per problem, no build,
    no timing, cached as not timed; the tuned variant runs it (checked on first use); a later timed
    search does not take it as an answer but searches and replaces it."""
    sp, names = toy_space()
    monkeypatch.setitem(ht.SPACES, "igemm_production", sp)
    gpu_ = FakeGPU(monkeypatch, {names[2]: 0.5})
    built = []
    monkeypatch.setattr(hts, "build_many", lambda jobs, arch, workers=None, entry_line=None: built.append(jobs) or 0.5)
    cache = ht.TuneCache(tmp_path / "t.json", environment=ENV)
    df = ht.tune("igemm_production", [P1, P2], cache, progress=False, timed=False)
    assert list(df.config) == [names[0]] * 2 and list(df.rule_config) == [names[3]] * 2  # the model's first; the prior
    assert list(df.status) == ["ok", "ok"] and df.ms.isna().all() and built == [] and gpu_.calls == []
    entry = cache.lookup(get("igemm_production"), P1)
    assert entry["config"] == names[0] and entry["timed"] is False and not cache.checked(get("igemm_production"), P1,
                                                                                         names[0])
    again = ht.tune("igemm_production", [P1], cache, progress=False, timed=False)
    assert again.cache[0] == "hit"
    v = ht.tuned("igemm_production", cache)
    assert _config(space.variant_for(names[0])) in names[0] and v.plan(P2).config == space.variant_for(
        names[0]).plan(P2).config  # the tuned flavour runs the pick (checked by its review on first use)
    timed = ht.tune("igemm_production", [P1], cache, progress=False)
    assert timed.cache[0] == "miss" and timed.config[0] == names[2] and gpu_.calls  # searched, not the pick
    assert cache.lookup(get("igemm_production"), P1)["config"] == names[2]
    with pytest.raises(ValueError, match="untimed"):
        ht.tune("igemm_production", [P1], cache, progress=False, timed=False, exhaustive=True)
