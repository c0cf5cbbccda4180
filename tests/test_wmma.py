"""Day 10 on the CPU: entry points, refusals, the write-coverage model, the tensor checks.

The kernel file is compiled for every tensor-core architecture by tests/test_compile.py (files
with "wmma" in the name are built for sm_80+ only); tests/gpu/test_wmma_gpu.py runs it. The
generic registry tests (tests/test_variants.py) reach this variant through `Variant.adapt`, in its
first dtype (fp16); the coverage model is tested here in fp16 and bf16, on more shapes.
"""

from __future__ import annotations

import re
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from days import day10_igemm_wmma as hw
from helpers import compile as hc
from helpers import gpu
from helpers.launch import prepare
from helpers.problem import Conv2dProblem
from helpers.suites import edge, is_big, resnet50
from helpers.variants import MAX_GRID, UnsupportedProblem, get

V = get("igemm_wmma")


def nhwc(dtype: str = "fp16", **kw) -> Conv2dProblem:
    return Conv2dProblem(layout="NHWC", dtype=dtype, **kw)


def as_wmma(p: Conv2dProblem, dtype: str) -> Conv2dProblem:
    """A suite problem (fp32, any layout) as this variant takes it: NHWC, fp16 or bf16."""
    return replace(p, layout="NHWC", dtype=dtype, name="")


def test_registered_as_day_10():
    assert V.day == 10 and V.cu_file == "10_igemm_wmma.cu"
    assert V.dtypes == ("fp16", "bf16") and V.layouts == ("NHWC",) and V.accum == "fp32"
    assert V.tensor_check_fn is hw.wmma_tensor_check


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_entry_names_follow_dtype_and_load_path(dtype):
    vec = nhwc(dtype, N=2, C=64, H=14, W=14, K=64, R=3, S=3, padding=1)
    assert V.entry_for(vec) == f"conv2d_igemm_wmma_{dtype}_vec"
    for c in (1, 3, 12, 45):  # C % 8 != 0: scalar loads (a 16-byte chunk could straddle two pixels)
        assert V.entry_for(replace(vec, C=c, name="")) == f"conv2d_igemm_wmma_{dtype}_scalar"
    assert hw.vec_path(vec) and not hw.vec_path(replace(vec, C=12, name=""))
    assert hw.vec_store(vec) and not hw.vec_store(replace(vec, K=33, name=""))


def test_entry_for_fp32_names_the_dtypes():
    with pytest.raises(ValueError, match="fp16/bf16 only; got fp32"):
        hw.wmma_entry(nhwc("fp32", N=1, C=8, H=4, W=4, K=8, R=1, S=1))


def test_kernel_constants_match_python():
    """The tile the coverage model and launch assume is the one compiled into the .cu file."""
    src = hc.kernel_path(V.cu_file).read_text()

    def const(name: str) -> int:
        m = re.search(rf"\b{name} = (\d+)", src)
        assert m, f"{name} not found in {V.cu_file}"
        return int(m[1])

    assert (const("W_BM"), const("W_BN"), const("W_BK")) == (hw.BM, hw.BN, hw.BK)
    assert (const("W_WM"), const("W_WN"), const("W_F"), const("W_PAD")) == (hw.WM, hw.WN, hw.FRAG, hw.PAD)
    assert const("W_THREADS") == hw.THREADS == 32 * (hw.BM // hw.WM) * (hw.BN // hw.WN)
    assert hw.SHARED_BYTES == 40960 <= 48 * 1024  # static shared memory, no opt-in needed
    for entry in ("fp16_vec", "fp16_scalar", "bf16_vec", "bf16_scalar"):
        assert f"conv2d_igemm_wmma_{entry}(" in src


def test_refusals_name_the_reason():
    ok = nhwc(N=1, C=4, H=8, W=8, K=4, R=3, S=3, padding=1)
    assert V.supports(ok) is None and V.supports(replace(ok, dtype="bf16", name="")) is None
    assert "groups=1; got 2" in V.supports(replace(ok, groups=2, name=""))
    assert "layout NHWC; got NCHW" in V.supports(replace(ok, layout="NCHW", name=""))
    assert "dtype fp16/bf16; got fp32" in V.supports(replace(ok, dtype="fp32", name=""))
    assert "dtype fp16/bf16; got fp64" in V.supports(replace(ok, dtype="fp64", name=""))
    big = nhwc(N=1, C=1, H=2**31, W=1, K=1, R=1, S=1)
    reason = V.supports(big, smem_limit=2**31)
    assert "int32" in reason and str(2**31) in reason
    for r in (V.supports(replace(ok, groups=2, name="")), V.supports(big)):
        assert r.startswith("igemm_wmma")


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_every_output_written_once_on_the_edge_suite(dtype):
    """covers() == 1 on every NHWC edge problem the variant claims (the 2^31-element one: launch limits only)."""
    claimed = 0
    for p in (as_wmma(q, dtype) for q in edge()):
        if V.supports(p) is not None:
            assert p.groups > 1, (p.name, V.supports(p))  # the only edge shape it refuses
            continue
        claimed += 1
        cfg = V.launch(p)
        assert cfg.block == (hw.THREADS, 1, 1) and cfg.shared_bytes == 0
        assert all(1 <= g <= lim for g, lim in zip(cfg.grid, MAX_GRID)), (p.name, cfg)
        if is_big(p):
            continue
        counts = np.asarray(V.covers(p))
        assert counts.shape == (p.y_numel,)
        assert (counts == 1).all(), f"{p.name}: {(counts == 0).sum()} never written, {(counts > 1).sum()} twice"
    assert claimed == sum(p.groups == 1 for p in edge())


@pytest.mark.parametrize(
    "p",
    [as_wmma(p, "fp16") for p in resnet50(batches=(2,))]
    + [
        nhwc(N=3, C=8, H=13, W=11, K=130, R=3, S=3, padding=1),  # K > 128, K % 8 != 0
        nhwc(N=1, C=16, H=23, W=7, K=257, R=1, S=1),  # M and K both off the tile
        nhwc("bf16", N=2, C=24, H=9, W=17, K=40, R=2, S=3, stride=(2, 1), padding=(1, 0), dilation=(1, 2)),
    ],
    ids=lambda p: f"{p.dtype}:{p.name}",
)
def test_every_output_written_once_on_more_shapes(p):
    counts = np.asarray(V.covers(p))
    assert (counts == 1).all(), p.name


def test_covers_model_sees_a_short_grid():
    """With one block fewer in x and in y, exactly the rows and channels of the missing blocks stay unwritten."""
    p = nhwc(N=1, C=8, H=20, W=20, K=300, R=1, S=1)  # M = 400: 4 blocks; K = 300: 3 blocks
    cfg = V.launch(p)
    assert cfg.grid == (4, 3, 1)
    counts = V.plan(p).covers(replace(cfg, grid=(3, 2, 1))).reshape(p.gemm.m, p.K)
    assert (counts[: 3 * hw.BM, : 2 * hw.BN] == 1).all()
    assert (counts[3 * hw.BM :] == 0).all() and (counts[:, 2 * hw.BN :] == 0).all()


def test_pointer_check_names_the_misaligned_tensor(misaligned):
    p = nhwc(N=1, C=8, H=4, W=4, K=8, R=1, S=1)  # 16-byte loads and stores
    x, w = p.make_inputs()
    y = torch.empty(p.y_shape, dtype=torch.float16)
    assert hw.wmma_tensor_check(p, {"x": x, "w": w, "y": y}) is None
    assert hw.wmma_tensor_check(p, {"x": x, "w": w, "y": None}) is None
    assert "x.data_ptr() is not 16-byte aligned" in hw.wmma_tensor_check(p, {"x": misaligned(x), "w": w, "y": y})
    assert "w.data_ptr() is not 16-byte aligned" in hw.wmma_tensor_check(p, {"x": x, "w": misaligned(w), "y": y})
    reason = hw.wmma_tensor_check(p, {"x": x, "w": w, "y": misaligned(y)})
    assert "y.data_ptr()" in reason and "16-byte stores (K % 8 == 0)" in reason and "y.clone()" in reason
    # C % 8 != 0 and K % 8 != 0: scalar loads and stores take any (2-byte aligned) pointer
    p3 = nhwc(N=1, C=12, H=4, W=4, K=6, R=1, S=1)
    x3, w3 = p3.make_inputs()
    y3 = torch.empty(p3.y_shape, dtype=torch.float16)
    assert hw.wmma_tensor_check(p3, {"x": misaligned(x3), "w": misaligned(w3), "y": misaligned(y3)}) is None


@pytest.mark.parametrize(
    "cc, refused", [((7, 5), True), ((7, 0), True), ((8, 0), False), ((9, 0), False), ((12, 0), False)]
)
def test_old_gpus_are_refused_with_a_reason(cc, refused):
    reason = V.build_reason(cc)
    if refused:
        assert f"{cc[0]}.{cc[1]}" in reason and "8.0 or newer" in reason and "bf16 WMMA" in reason
        assert "igemm_wmma" in V.supports(nhwc(N=1, C=8, H=4, W=4, K=8, R=1, S=1), cc=cc)
    else:
        assert reason is None and V.target(cc) == f"sm_{cc[0]}{cc[1]}"


def test_old_gpu_refused_after_the_tensor_checks(monkeypatch):
    """An sm_75 device is refused by `prepare` once the tensors pass (a misaligned x is refused before
    any GPU call: tests/test_variants.py, for every variant that needs x aligned)."""
    p = nhwc(N=1, C=8, H=4, W=4, K=8, R=1, S=1)
    x, w = p.make_inputs()
    monkeypatch.setattr("helpers.launch.check_tensors", lambda *a, **k: None)  # CPU tensors pass
    monkeypatch.setattr(gpu, "device_info", lambda: SimpleNamespace(smem_per_block_optin=48 * 1024, cc=(7, 5)))
    with pytest.raises(UnsupportedProblem, match="igemm_wmma needs a GPU of compute capability 8.0"):
        prepare(V, p, x, w)


def test_fp32_tensors_refused_for_an_fp16_problem(monkeypatch):
    p = nhwc(N=1, C=8, H=4, W=4, K=8, R=1, S=1)
    x, w = p.make_inputs()
    with pytest.raises(TypeError, match=r"x must be torch\.float16"):
        prepare(V, p, x.float(), w)
    with pytest.raises(TypeError, match=r"w must be torch\.bfloat16"):
        prepare(V, replace(p, dtype="bf16", name=""), x.bfloat16(), w)


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_two_blocks_fit_an_sm(arch):
    """__launch_bounds__(256, 2): every entry within 128 registers, no spills, 40 KB of static shared memory."""
    reports, log = hc.nvcc_compile(V.cu_file, arch=arch)
    assert {r.entry for r in reports} == {
        f"conv2d_igemm_wmma_{e}" for e in ("fp16_vec", "fp16_scalar", "bf16_vec", "bf16_scalar")
    }
    for r in reports:
        assert r.registers <= 128 and (r.spill_stores, r.spill_loads, r.stack_bytes) == (0, 0, 0), r
        assert r.shared_bytes == hw.SHARED_BYTES, r
