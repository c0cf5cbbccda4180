"""Day 22's split-K fprop on a GPU (sm_90a: an H100 or H200; tests/test_split_k.py is the CPU half).

* every split entry at 2, 3 and 5 splits (the last range longer than the others where steps do not
  divide) on day 16's check problems, fp16 and bf16, normal and integer (bit-exact) inputs;
* a grid of one block, so one block walks every unit of every split and the ring runs on across them;
* the fused epilogue in the reduction (bias, alpha, beta, in-place Cin, ReLU);
* a NaN-poisoned workspace: every partial is written before the reduction reads it;
* the rule's variant on ResNet-50's N = 32 layers it splits;
* dgrad: day 18's unit-stride problems with the split forced, and the rule on ResNet-50's layers.

Every `check` poisons the output with NaN, compares with the float64 reference within the
fp32-accumulation bound and repeats the launch to compare bitwise (the reduction's fixed order).
Skipped (tests/conftest.py) without a CUDA device or pycuda; the whole file on GPUs other than 9.0.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import assert_check_ok

from days.day16_igemm_wgmma import CHECK_PROBLEMS, HOPPER_CC, MULTI_TILE_PROBLEMS
from days.day22_split_k import ENTRIES, SplitConfig, choose, dgrad_choose, make_dgrad_split_k, make_split_k, steps_of
from helpers import gpu
from helpers.check import check, check_epilogue
from helpers.epilogue import Epilogue
from helpers.launch import prepare, run
from helpers.problem import Conv2dProblem
from helpers.suites import resnet50
from helpers.variants import get

pytestmark = pytest.mark.gpu

DTYPES = ("fp16", "bf16")
SPLITS = (2, 3, 5)
FORCED = {f"{t.name}_k{s}": make_split_k(f"igemm_split_k[{t.name}_k{s}]", SplitConfig(t, s))
          for t in ENTRIES for s in SPLITS}


@pytest.fixture(scope="module", autouse=True)
def context():
    ctx = gpu.init()
    cc = gpu.device_info().cc
    if cc != HOPPER_CC:
        pytest.skip(f"wgmma and the copy engine's im2col mode need sm_90a (compute capability 9.0); this GPU is {cc}")
    return ctx


CASES = [pytest.param(name, replace(p, dtype=dt, name=""), kind, id=f"{name}-{dt}-{p.name}-{kind}")
         for name in FORCED for p in CHECK_PROBLEMS + MULTI_TILE_PROBLEMS for dt in DTYPES
         for kind in ("normal", "int")]


@pytest.mark.parametrize("name, p, kind", CASES)
def test_every_split_entry(name, p, kind):
    v = FORCED[name]
    if v.supports(p, smem_limit=2**31) is not None:
        pytest.skip(v.supports(p, smem_limit=2**31))
    assert_check_ok(check(v, p, kind=kind), p, kind)


@pytest.mark.parametrize("tile", ENTRIES, ids=lambda t: t.name)
def test_one_block_walks_every_item(tile):
    """The main launch on a grid of one block: it takes every unit of every split in turn, so its
    ring's phases run on across units and splits."""
    p = MULTI_TILE_PROBLEMS[1]
    v = make_split_k(f"igemm_split_k[{tile.name}_k3]", SplitConfig(tile, 3))
    one = replace(v, name=f"{v.name}_grid1", launches_fn=lambda q, ep, cfg: [
        replace(k, config=replace(k.config, grid=(1, 1, 1))) if k.name == "main" else k
        for k in v.launches_fn(q, ep, cfg)])
    for kind in ("normal", "int"):
        assert_check_ok(check(one, p, kind=kind), p, kind)


EPILOGUES = [
    ("scale-relu", Epilogue(alpha=0.5, beta=2.0, relu=True), {}),
    ("in-place-residual-relu", Epilogue(alpha=1.0, beta=1.0, relu=True), {"in_place": True}),
    ("int-relu", Epilogue(alpha=2.0, beta=-1.0, relu=True), {"kind": "int"}),
    ("bias-only", Epilogue(), {"with_cin": False}),
]


@pytest.mark.parametrize("K", [72, 33])
@pytest.mark.parametrize("case, ep, kw", [pytest.param(*c, id=c[0]) for c in EPILOGUES])
def test_epilogue_in_the_reduction(K, case, ep, kw):
    p = replace(CHECK_PROBLEMS[1], K=K, name="")
    v = FORCED[f"{ENTRIES[2].name}_k3"]
    assert_check_ok(check_epilogue(v, p, ep, **kw), p, kw.get("kind", "normal"))


def test_nan_poisoned_workspace_is_never_read_before_written():
    p = CHECK_PROBLEMS[1]
    v = FORCED[f"{ENTRIES[2].name}_k5"]
    x, w = p.make_inputs(device="cuda")
    clean = run(v, p, x, w).clone()
    prepared, out = prepare(v, p, x, w)
    assert prepared.workspace is not None
    prepared.workspace.fill_(255)  # 0xFFFFFFFF: a NaN in every fp32 partial
    out.fill_(float("nan"))
    prepared()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), clean.view(torch.int16))


def _split_layers():
    for p in resnet50((32,)):
        q = replace(p, dtype="fp16", layout="NHWC", name="")
        if isinstance(choose(q), SplitConfig):
            yield pytest.param(q, id=q.name)


@pytest.mark.parametrize("p", list(_split_layers()))
def test_the_rule_on_resnet50_layers_it_splits(p):
    assert steps_of(p) >= 2
    assert_check_ok(check(get("igemm_split_k"), p, kind="int"), p, "int")


# dgrad: day 18's unit-stride problems with the split forced (C odd: the rotate kernel loads w
# element by element; C = 300: several n-tiles of the fprop over dy; both dilations; padding' 0 and 2)
DGRAD = {
    "C = 33, dilation (2, 1)": dict(N=2, C=33, H=15, W=12, K=24, R=3, S=2, padding=(0, 1), dilation=(2, 1)),
    "1x1, C past the tiles": dict(N=4, C=300, H=14, W=14, K=128, R=1, S=1),
    "5x4, padding R - 1 (padding' 0)": dict(N=2, C=72, H=17, W=13, K=136, R=5, S=4, padding=(4, 3)),
    "3x3 padding 0 (padding' 2)": dict(N=2, C=64, H=20, W=18, K=64, R=3, S=3),
    "dilation (1, 2)": dict(N=2, C=16, H=12, W=15, K=72, R=3, S=3, padding=(1, 2), dilation=(1, 2)),
}


@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("kind", ["normal", "int"])
@pytest.mark.parametrize("case", list(DGRAD))
def test_dgrad_with_the_split(case, kind, splits):
    p = Conv2dProblem(**DGRAD[case], dtype="fp16", layout="NHWC", op="dgrad")
    v = make_dgrad_split_k(f"dgrad_split_k[k{splits}]", SplitConfig(ENTRIES[2], splits))
    reason = v.supports(p, smem_limit=2**31)
    if reason:
        pytest.skip(reason)
    assert_check_ok(check(v, p, kind=kind), p, kind)


def test_dgrad_rule_on_resnet50_layers_it_splits():
    layers = [replace(p, dtype="fp16", layout="NHWC", op="dgrad", name="") for p in resnet50((32,))]
    split = [p for p in layers if isinstance(dgrad_choose(p), SplitConfig)]
    assert split
    for p in split:
        assert_check_ok(check(get("dgrad_split_k"), p, kind="int"), p, "int")
