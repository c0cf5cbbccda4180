"""Day 11 on the CPU: entry points per dtype and load path, refusals, the tensor checks.

The coverage model on every claimed edge/random problem runs in tests/test_variants.py (in NHWC,
fp32 problems are refused by dtype there, so it is repeated here in fp16 and bf16); the kernel
itself in tests/gpu/test_mma_gpu.py.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from days.day09_igemm_simt import vec_path
from days.day11_igemm_mma import MMA_TILE, tensor_core_check
from helpers.problem import Conv2dProblem
from helpers.suites import edge, is_big
from helpers.variants import get


def nhwc(dtype="fp16", **kw) -> Conv2dProblem:
    return Conv2dProblem(layout="NHWC", dtype=dtype, **kw)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_entries_follow_dtype_and_load_path(dtype):
    v = get("igemm_mma")
    assert v.entry_for(nhwc(dtype, N=1, C=64, H=8, W=8, K=64, R=3, S=3, padding=1)) == f"conv2d_igemm_mma_{dtype}_vec"
    scalar = nhwc(dtype, N=1, C=12, H=8, W=8, K=64, R=3, S=3, padding=1)
    assert v.entry_for(scalar) == f"conv2d_igemm_mma_{dtype}_scalar"
    assert vec_path(nhwc(dtype, N=1, C=8, H=2, W=2, K=1, R=1, S=1))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_covers_edge_suite(dtype):
    v = get("igemm_mma")
    claimed = 0
    for p in edge():
        p = replace(p, layout="NHWC", dtype=dtype, name="")
        if is_big(p) or v.supports(p):
            continue
        claimed += 1
        cfg = v.launch(p)
        assert cfg.block == (256, 1, 1) and cfg.grid[0] == -(-p.gemm.m // MMA_TILE[0])
        assert (np.asarray(v.covers(p)) == 1).all(), p.name
    assert claimed >= 15


def test_refusals_name_the_reason():
    v = get("igemm_mma")
    assert "dtype fp16/bf16; got fp32" in v.supports(Conv2dProblem(N=1, C=8, H=4, W=4, K=8, R=1, S=1, layout="NHWC"))
    assert "layout NHWC; got NCHW" in v.supports(Conv2dProblem(N=1, C=8, H=4, W=4, K=8, R=1, S=1, dtype="fp16"))
    assert "groups=1; got 2" in v.supports(nhwc(N=1, C=8, H=4, W=4, K=8, R=1, S=1, groups=2))


def test_tensor_check_names_the_misaligned_tensor():
    p = nhwc(N=1, C=8, H=4, W=4, K=8, R=1, S=1)
    x, w = p.make_inputs()
    y = torch.empty(p.y_shape, dtype=torch.float16)
    assert tensor_core_check(p, {"x": x, "w": w, "y": y}) is None
    assert tensor_core_check(p, {"x": x, "w": w, "y": None}) is None
    xs = torch.empty(x.numel() + 1, dtype=torch.float16)[1:].view(x.shape)  # 2 bytes off
    assert "x.data_ptr() is not 16-byte aligned" in tensor_core_check(p, {"x": xs, "w": w, "y": y})
    ys = torch.empty(y.numel() + 1, dtype=torch.float16)[1:].view(y.shape)
    assert "y.data_ptr() is not 4-byte aligned" in tensor_core_check(p, {"x": x, "w": w, "y": ys})
    p3 = nhwc(N=1, C=3, H=4, W=4, K=8, R=1, S=1)  # scalar loads: x and w need no alignment
    x3, w3 = p3.make_inputs()
    x3s = torch.empty(x3.numel() + 1, dtype=torch.float16)[1:].view(x3.shape)
    assert tensor_core_check(p3, {"x": x3s, "w": w3, "y": None}) is None


def test_odd_k_needs_no_aligned_y():
    """Pairs are stored only where K is even; with odd K the kernel stores element by element,
    so a y view 2 bytes off an allocation is fine (and still refused for even K)."""
    p = nhwc(N=1, C=8, H=4, W=4, K=7, R=1, S=1)
    x, w = p.make_inputs()
    ys = torch.empty(math.prod(p.y_shape) + 1, dtype=torch.float16)[1:].view(p.y_shape)
    assert tensor_core_check(p, {"x": x, "w": w, "y": ys}) is None
    p8 = nhwc(N=1, C=8, H=4, W=4, K=8, R=1, S=1)
    x8, w8 = p8.make_inputs()
    ys8 = torch.empty(math.prod(p8.y_shape) + 1, dtype=torch.float16)[1:].view(p8.y_shape)
    assert "y.data_ptr() is not 4-byte aligned" in tensor_core_check(p8, {"x": x8, "w": w8, "y": ys8})
