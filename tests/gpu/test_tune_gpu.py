"""Day 15's tuner on a real GPU: every tile the search may pick, built alone, against the float64
reference on a problem that divides no tile; the parallel builds reused by `load_kernel`; a real
search whose winner passes the checks and is cached; the tuned variant running the cached choice."""

from __future__ import annotations

import pytest

from days.day13_igemm_production import space, tune_defines
from helpers import compile as hc
from helpers import gpu
from helpers import tune as ht
from helpers.check import check
from helpers.launch import run
from helpers.problem import Conv2dProblem
from helpers.reference import bitwise_equal
from helpers.variants import get

pytestmark = pytest.mark.gpu

# M = 2*13*11 = 286 pixels, GEMM-N = K = 200 filters, GEMM-K = 3*3*72: no tile divides any of them.
ODD = Conv2dProblem(N=2, C=72, H=13, W=11, K=200, R=3, S=3, padding=1, dtype="fp16", layout="NHWC")
TILES = space.tiles()


@pytest.fixture(scope="module")
def built():
    gpu.init()
    arch = get("igemm_production").target(gpu.device_info().cc)
    jobs = [("13_igemm_production.cu", tune_defines(t, "fp16")) for t in TILES]
    return hc.build_many(jobs, arch, entry_line=space.SPACE.merge)  # the tiles share nvcc runs, as in a search


@pytest.mark.parametrize("tile", TILES, ids=lambda t: t.name)
def test_every_tile_built_alone_passes_the_checks(tile, built):
    v = space.variant_for(space.config_name(tile, 1))
    reason = v.supports(ODD)
    if reason:  # this GPU's shared memory
        pytest.skip(reason)
    r = check(v, ODD)  # normal and integer inputs, NaN-poisoned output, float64 reference
    assert r.ok, r


def test_parallel_builds_are_what_load_kernel_uses(built):
    n = len(hc._modules)
    for t in TILES[:5]:
        k = space.variant_for(space.config_name(t, 0)).launches(ODD)[0]
        hc.load_kernel("13_igemm_production.cu", k.entry, dict(k.defines))
    assert len(hc._modules) == n, "load_kernel rebuilt a module build_many had loaded"


def test_a_real_search_picks_a_correct_winner_and_caches_it(tmp_path):
    p = Conv2dProblem(N=8, C=64, H=28, W=28, K=128, R=3, S=3, padding=1, dtype="fp16", layout="NHWC")
    cache = ht.TuneCache(tmp_path / "tune.json")
    sp = ht.space_of("igemm_production")
    row = ht.tune_problem(sp, p, cache, keep=4)
    assert row["cache"] == "miss" and row["ms"] > 0 and row["disagreed"] == 0 and row["faulted"] == 0
    search = ht.enumerate_search(sp, p, keep=4)  # the model's top 4, each block shape's favourite and the prior
    assert row["survivors"] == len(search.survivors) < row["candidates"] // 10 and row["candidates"] > 100
    v = sp.variant_for(row["config"], p)
    assert check(v, p).ok
    again = ht.tune_problem(sp, p, cache, keep=4)
    assert again["cache"] == "hit" and again["config"] == row["config"] and again["tune_s"] < 0.1
    tuned = ht.tuned("igemm_production", cache)
    x, w = p.make_inputs(device="cuda", seed=3)
    assert bitwise_equal(run(tuned, p, x, w), run(v, p, x, w))
    assert check(tuned, p).ok
