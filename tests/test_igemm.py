"""Day 09 on the CPU: tile descriptions, the tile rule, refusals, the pointer-alignment check.

The coverage model of both kernels on every claimed edge/random problem (in NHWC) is tested in
tests/test_variants.py; the kernels themselves in tests/gpu.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from days.day09_igemm_simt import MIN_BLOCKS, TILES, Tile, default_tile, igemm_pointer_check, make_igemm, vec_path
from days.kit import blocks
from helpers import gpu
from helpers.launch import prepare
from helpers.problem import Conv2dProblem
from helpers.suites import resnet50
from helpers.variants import get


def nhwc(**kw) -> Conv2dProblem:
    return Conv2dProblem(layout="NHWC", **kw)


def test_tiles_are_the_instantiated_ones():
    assert {Tile(*t).thread_tile for t in TILES} == {(8, 8), (8, 4), (4, 8), (4, 4)}
    assert Tile(128, 128).shared_bytes == 2 * 8 * (132 + 132) * 4 <= 48 * 1024
    with pytest.raises(ValueError, match="no entry point for a 32 x 128 tile"):
        Tile(32, 128)


def test_entry_names_follow_tile_and_load_path():
    v = get("igemm_simt")
    big = nhwc(N=32, C=64, H=56, W=56, K=256, R=1, S=1)
    assert v.entry_for(big) == "conv2d_igemm_simt_128x128_vec"
    assert v.entry_for(nhwc(N=32, C=3, H=56, W=56, K=256, R=3, S=3, padding=1)).endswith("_scalar")
    assert v.entry_for(nhwc(N=32, C=64, H=56, W=56, K=64, R=3, S=3, padding=1)) == "conv2d_igemm_simt_128x64_vec"
    assert vec_path(big) and not vec_path(nhwc(N=1, C=45, H=8, W=8, K=4, R=1, S=1))


def test_tile_rule_on_resnet50():
    """128 x BN when it makes MIN_BLOCKS blocks, 128 x 64 when that does, else 64 x 64; BN = 64 for K <= 64."""
    for p in resnet50():
        p = get("igemm_simt").adapt(p)
        t = default_tile(p)
        assert (t.bm, t.bn) in TILES
        if p.K <= 64:
            assert t.bn == 64
        if blocks(p, Tile(128, 64 if p.K <= 64 else 128)) >= MIN_BLOCKS:
            assert t.bm == 128 and t.bn == (64 if p.K <= 64 else 128), p.name
        assert blocks(p, t) >= MIN_BLOCKS or t == Tile(64, 64), p.name
    # the 7x7, N = 32 layers have 52 blocks of 128 x 128: the rule halves BN
    assert default_tile(nhwc(N=32, C=2048, H=7, W=7, K=512, R=1, S=1)) == Tile(128, 64)


def test_forced_tile_changes_launch_and_coverage():
    p = nhwc(N=2, C=5, H=9, W=11, K=70, R=3, S=2, padding=(1, 0), stride=(2, 1), dilation=(1, 2))
    for bm, bn in TILES:
        v = make_igemm(f"t{bm}x{bn}", tile_rule=lambda _p, bm=bm, bn=bn: Tile(bm, bn))
        cfg = v.launch(p)
        assert cfg.grid == (-(-p.gemm.m // bm), -(-p.K // bn), 1) and cfg.block == (256, 1, 1)
        assert (np.asarray(v.covers(p)) == 1).all()


@pytest.mark.parametrize("name", ["igemm_simt", "igemm_simt_analytic"])
def test_refusals_name_the_reason(name):
    v = get(name)
    ok = nhwc(N=1, C=4, H=8, W=8, K=4, R=3, S=3, padding=1)
    assert v.supports(ok) is None
    assert "groups=1; got 2" in v.supports(nhwc(N=1, C=4, H=8, W=8, K=4, R=3, S=3, padding=1, groups=2))
    assert "layout NHWC; got NCHW" in v.supports(Conv2dProblem(N=1, C=4, H=8, W=8, K=4, R=3, S=3, padding=1))
    assert "dtype fp32" in v.supports(nhwc(N=1, C=4, H=8, W=8, K=4, R=3, S=3, padding=1, dtype="fp16"))


def test_pointer_check_names_the_misaligned_tensor():
    p = nhwc(N=1, C=8, H=4, W=4, K=8, R=1, S=1)
    x, w = p.make_inputs()
    y = torch.empty(p.y_shape)
    assert igemm_pointer_check(p, {"x": x, "w": w, "y": y}) is None
    assert igemm_pointer_check(p, {"x": x, "w": w, "y": None}) is None
    xs = torch.empty(x.numel() + 1)[1:].view(x.shape)  # 4 bytes past an aligned allocation
    assert "x.data_ptr() is not 16-byte aligned" in igemm_pointer_check(p, {"x": xs, "w": w, "y": y})
    ys = torch.empty(y.numel() + 1)[1:].view(y.shape)
    assert "y.data_ptr()" in igemm_pointer_check(p, {"x": x, "w": w, "y": ys})
    p3 = nhwc(N=1, C=3, H=4, W=4, K=6, R=1, S=1)  # scalar loads (C % 4 != 0), scalar stores (K % 4 != 0)
    x3, w3 = p3.make_inputs()
    assert igemm_pointer_check(p3, {"x": torch.empty(x3.numel() + 1)[1:].view(x3.shape), "w": w3, "y": None}) is None


def test_misaligned_x_refused_before_the_gpu(monkeypatch):
    """The alignment check runs right after the tensor checks, before any GPU call."""
    p = nhwc(N=1, C=8, H=4, W=4, K=8, R=1, S=1)
    x, w = p.make_inputs()
    xs = torch.empty(x.numel() + 1)[1:].view(x.shape)
    monkeypatch.setattr("helpers.launch.check_tensors", lambda *a, **k: None)  # CPU tensors pass

    def touched(*a, **k):
        raise AssertionError("the GPU was touched before the alignment check")

    monkeypatch.setattr(gpu, "device_info", touched)
    monkeypatch.setattr(gpu, "has_gpu", lambda: False)  # `supports` without a limit asks no device either
    with pytest.raises(ValueError, match="igemm_simt: x.data_ptr"):
        prepare("igemm_simt", p, xs, w)
