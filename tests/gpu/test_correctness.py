"""Every variant on a real GPU: correctness on the edge, quick and depthwise suites, batching, poisoning,
refusals before launch, the timer, `bench`, and a clean interpreter exit.

Skipped (tests/conftest.py) without a CUDA device or without pycuda. Problems with a tensor of
2^31 elements are marked ``big`` and run only on GPUs with >= 60 GB of memory. No test here
asserts a speed: timings are only checked for being well-formed.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import gpu
from helpers.check import check
from helpers.launch import prepare, run
from helpers.problem import Conv2dProblem
from helpers.reference import bitwise_equal, compare
from helpers.suites import depthwise, edge, is_big, quick
from helpers.variants import UnsupportedProblem, all_variants, get

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = all_variants()
SHAPE_LEVEL = 2**31  # smem limit for collection: shape-level reasons only (the device's limit is checked per test)


def claims(v, p) -> bool:
    """``v`` claims ``p`` at collection time (no GPU call; shared memory checked later)."""
    return v.supports(p, smem_limit=SHAPE_LEVEL) is None


def kinds_for(p) -> list[str]:
    """normal and int always; cancel (exact result 0) where the op has its cancelling pairs (an
    even C/groups for fprop, K/groups for dgrad, N for wgrad: `Conv2dProblem.supports_kind`)."""
    return ["normal", "int"] + (["cancel"] if p.supports_kind("cancel") is None else [])


def _cases():
    problems = [("edge", p) for p in edge()] + [("quick", p) for p in quick()] + [("depthwise", p) for p in depthwise()]
    for v in VARIANTS:
        for suite_name, p in problems:
            p = v.adapt(p, op=True)  # NHWC/fp16 kernels get the suites' problems in their layout/dtype
            if not claims(v, p):
                continue
            for kind in kinds_for(p):
                marks = [pytest.mark.big] if is_big(p) else []
                yield pytest.param(v, p, kind, id=f"{v.name}-{suite_name}:{p.name}-{kind}", marks=marks)


@pytest.fixture(scope="module", autouse=True)
def context():
    """The shared CUDA context (torch's primary context, pushed for pycuda)."""
    return gpu.init()


def skip_if_device_refuses(v, p) -> None:
    """Skip when the device's opt-in shared-memory limit is what rules ``p`` out for ``v``."""
    reason = v.supports(p, smem_limit=gpu.device_info().smem_per_block_optin)
    if reason:
        pytest.skip(f"on this device: {reason}")


@pytest.mark.parametrize("v, p, kind", list(_cases()))
def test_check_passes(v, p, kind: str):
    skip_if_device_refuses(v, p)
    r = check(v, p, kind=kind)
    assert r.ok, f"{v.name} on {p.name} ({kind}): {r.reason}"
    assert r.nonfinite == 0 and r.repeat_bitwise
    assert r.worst_err_over_bound <= 1 and math.isfinite(r.rel_l2)
    if kind == "int" and (v.error_model is None or v.error_model.exact_on_integers(p)):  # F(4, 3) rounds them
        assert r.exact is True, f"{v.name} on {p.name}: integer inputs but not bit-exact"
    if is_big(p):
        torch.cuda.empty_cache()


def _candidates():
    """Problems to pick a representative from: edge, quick, then depthwise (C = K = groups)."""
    return edge() + quick() + depthwise()


def _batched(v):
    for p in map(lambda q: v.adapt(q, op=True), _candidates()):
        if p.N > 1 and not is_big(p) and claims(v, p):
            return p
    return None


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_batch_matches_single_images(v):
    """out[n] of a batched launch equals, bit for bit, the N=1 launch on x[n:n+1] (dy[n:n+1] for
    dgrad; wgrad sums over the batch, so it has no per-image output)."""
    if v.op == "wgrad":
        pytest.skip("wgrad reduces over the images: dw has no image axis")
    p = _batched(v)
    if p is None:
        pytest.skip(f"{v.name} claims no batched problem of the edge/quick/depthwise suites")
    skip_if_device_refuses(v, p)
    x, w = p.make_inputs(device="cuda", seed=11)
    y = run(v, p, x, w).clone()
    p1 = dataclasses.replace(p, N=1, name="")
    for n in range(p.N):
        y1 = run(v, p1, x[n : n + 1], w)
        assert bitwise_equal(y[n : n + 1], y1), f"{v.name} on {p.name}: image {n} differs from its N=1 run"


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_poisoned_run_leaves_no_nan(v):
    p = next((p for p in map(lambda q: v.adapt(q, op=True), _candidates()) if not is_big(p) and claims(v, p)), None)
    if p is None:
        pytest.skip(f"{v.name} claims no edge/quick/depthwise problem")
    skip_if_device_refuses(v, p)
    x, w = p.make_inputs(device="cuda")
    y = torch.zeros(p.output_shape, dtype=p.torch_dtype, device="cuda")
    out = run(v, p, x, w, out=y, poison=True)
    assert out.data_ptr() == y.data_ptr()  # written in place
    assert not bool(torch.isnan(out).any()), f"{v.name} on {p.name}: {int(torch.isnan(out).sum())} outputs unwritten"


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_covers_model_matches_kernel_with_a_capped_grid(v):
    """Cap the grid at 1 block in y and 2 in z: the kernel's unwritten (NaN) outputs are exactly
    where the Python model `covers` predicts no write (none, for grid-stride kernels)."""
    p = next(
        (p for p in (v.adapt(q, op=True) for q in _candidates())
         if p.N * p.K > 2 and p.P > 1 and not is_big(p) and claims(v, p)),
        None,
    )
    if p is None:
        pytest.skip(f"{v.name} claims no suitable problem")
    skip_if_device_refuses(v, p)
    capped = v.with_output_launch(lambda cfg: dataclasses.replace(cfg, grid=(cfg.grid[0], 1, min(cfg.grid[2], 2))),
                                  name=f"{v.name}_capped")
    predicted_unwritten = np.asarray(capped.covers(p)) == 0
    x, w = p.make_inputs(device="cuda", seed=3)
    y = run(capped, p, x, w, poison=True)
    unwritten = torch.isnan(y).flatten().cpu().numpy()
    assert np.array_equal(unwritten, predicted_unwritten), (
        f"{v.name} on {p.name} with grid {capped.launch(p).grid}: the kernel left {int(unwritten.sum())} outputs "
        f"unwritten, the model predicts {int(predicted_unwritten.sum())}"
    )
    if not predicted_unwritten.any():
        ref = run(v, p, x, w)
        assert bitwise_equal(y, ref), f"{v.name}: the capped grid changes the result"


def _unclaimed(v):
    for p in map(lambda q: v.adapt(q, op=True), edge()):
        if not is_big(p) and p.x_numel < 10**6 and not claims(v, p):
            return p
    return None


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_unsupported_problem_raises_before_launch(v):
    p = _unclaimed(v)
    if p is None:
        pytest.skip(f"{v.name} claims every edge problem")
    x, w = p.make_inputs(device="cuda")
    y = torch.full(p.output_shape, 7.0, dtype=p.torch_dtype, device="cuda")
    with pytest.raises(UnsupportedProblem):
        run(v, p, x, w, out=y, poison=True)
    torch.cuda.synchronize()
    assert bool((y == 7.0).all()), "y was touched: the refusal came after the poison fill or a launch"


def test_naive_refuses_even_filter_on_cuda_tensors():
    from helpers.problem import Conv2dProblem

    p = Conv2dProblem(N=1, C=2, H=8, W=8, K=3, R=4, S=4, padding=(1, 1))
    x, w = p.make_inputs(device="cuda")
    with pytest.raises(UnsupportedProblem, match="odd filter"):
        run("naive", p, x, w)


def _square(v):
    """A claimed problem whose first input is square (H == W for x, P == Q for dy)."""
    for p in map(lambda q: v.adapt(q, op=True), _candidates()):
        side = (p.H, p.W) if p.inputs[0] == "x" else (p.P, p.Q)
        if side[0] == side[1] > 1 and not is_big(p) and claims(v, p):
            return p
    return None


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_bad_cuda_tensors_refused(v):
    p = _square(v)
    if p is None:
        pytest.skip(f"{v.name} claims no square problem")
    x, w = p.make_inputs(device="cuda")
    y = torch.full(p.output_shape, 7.0, dtype=p.torch_dtype, device="cuda")
    with pytest.raises(TypeError, match=f"must be {p.torch_dtype}"):
        run(v, p, x.double(), w, out=y)
    xt = x.transpose(2, 3) if p.layout == "NCHW" else x.transpose(1, 2)  # swap H and W (H == W)
    with pytest.raises(ValueError, match="not contiguous"):
        run(v, p, xt, w, out=y)
    b, out = p.inputs[1], p.output
    with pytest.raises(ValueError, match=rf"{b} is on cpu.*{b}\.cuda\(\)"):
        run(v, p, x, w.cpu(), out=y)
    with pytest.raises(ValueError, match=f"{out} must be"):
        run(v, p, x, w, out=torch.empty(1, device="cuda"))
    with pytest.raises(ValueError, match=f"{out} must be"):
        prepare(v, p, x, w, out=torch.empty(p.output_shape, dtype=torch.float64, device="cuda"))
    torch.cuda.synchronize()
    assert bool((y == 7.0).all())


@pytest.mark.parametrize("name", ["igemm_wmma", "igemm_production"])
def test_element_paths_take_misaligned_tensors(name, misaligned):
    """C % 8 != 0 and K % 8 != 0: day 10's scalar path and day 13's analytic iterator load and
    store element by element, so tensors 2 bytes off a 16-byte boundary must give exact results."""
    v = get(name)
    if v.build_reason(gpu.device_info().cc):
        pytest.skip(v.build_reason(gpu.device_info().cc))
    p = Conv2dProblem(N=2, C=12, H=9, W=8, K=20, R=3, S=3, padding=1, dtype="fp16", layout="NHWC")
    x, w = p.make_inputs(device="cuda", kind="int", seed=5)
    y = misaligned(torch.zeros(p.output_shape, dtype=p.torch_dtype, device="cuda"))
    out = run(v, p, misaligned(x), misaligned(w), out=y)
    r = compare(p, x, w, out, exact=True)
    assert r["exact_equal"] and r["nonfinite"] == 0


def test_time_gpu_is_well_formed():
    from helpers.timing import Timing, time_gpu

    a = torch.randn(1024, 1024, device="cuda")
    t = time_gpu(lambda: a @ a, warmup=2, min_reps=5, max_reps=20)
    assert isinstance(t, Timing)
    assert 0 < t.ms_p20 <= t.ms_p50 <= t.ms_p80, t
    assert 5 <= t.reps <= 20
    t = time_gpu(lambda: a @ a, reps=7, flush=False)
    assert t.reps == 7 and 0 < t.ms_p20 <= t.ms_p50 <= t.ms_p80


def test_bench_one_tiny_problem():
    from helpers.bench import baseline_name, bench, geomean_x_cudnn

    p = quick()[0]
    df = bench(VARIANTS, [p], progress=False, timing_kw=dict(warmup=1, reps=5))
    assert "x_cudnn" in df.columns and "ms_p50" in df.columns
    # Each variant runs in its own dtype and layout; each adapted (dtype, layout) gets its own
    # cuDNN row, named by `baseline_name` ("cudnn" for the suite problem's own).
    adapted = {v.name: v.adapt(p) for v in VARIANTS}
    baselines = {baseline_name(q, p) for q in adapted.values()}
    assert "cudnn" in baselines and len(baselines) > 1
    assert set(df.variant) == baselines | set(adapted)
    for b in baselines:
        base = df[df.variant == b]
        assert len(base) == 1 and base.x_cudnn.iloc[0] == 1.0 and base.ms_p50.iloc[0] > 0, b
    for v in VARIANTS:
        row = df[df.variant == v.name].iloc[0]
        assert (row["dtype"], row["layout"]) == (adapted[v.name].dtype, adapted[v.name].layout)
        if v.supports(adapted[v.name], smem_limit=gpu.device_info().smem_per_block_optin) is None:
            assert row.ok == True, f"{v.name}: {row.status}"  # noqa: E712
            assert row.x_cudnn > 0 and math.isfinite(row.x_cudnn) and row.tflops > 0
        else:
            assert str(row.status).startswith("unsupported")
    gm = geomean_x_cudnn(df)
    assert not set(gm.index) & baselines and (gm > 0).all()


def test_interpreter_exits_cleanly():
    """pycuda and torch share the primary context; the pop at exit leaves no 'context stack' abort."""
    code = textwrap.dedent(
        """
        import torch
        import helpers
        from helpers import gpu, suites
        gpu.init()
        p = suites.quick()[0]
        v = next(v for v in helpers.all_variants() if v.supports(p) is None)
        x, w = p.make_inputs(device="cuda")
        y = helpers.run(v, p, x, w)
        assert not torch.isnan(y).any()
        print("ran", v.name)
        """
    )
    pp = os.environ.get("PYTHONPATH")  # keep where pycuda was installed, put the repo first
    env = {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + pp if pp else "")}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "ran " in r.stdout
    assert "context stack" not in r.stderr and "PyCUDA ERROR" not in r.stderr, r.stderr


def test_kahan_compensates_and_double_accumulates():
    """On a long reduction (C = 512, 9 x 9: 41,472 terms) acc_kahan and acc_double land far closer
    to the float64 reference than acc_float: a build that lost its compensation (or its fp64
    sum) would be no better than the plain fp32 sum."""
    from helpers.problem import Conv2dProblem
    from helpers.reference import reference

    p = Conv2dProblem(N=1, C=512, H=24, W=24, K=8, R=9, S=9, padding=4)
    x, w = p.make_inputs(device="cuda", seed=5)
    ref = reference(p, x, w)
    err = {}
    for name in ("acc_float", "acc_kahan", "acc_double"):
        y = run(name, p, x, w)
        err[name] = float((p.to_nchw(y).double() - ref).abs().mean())
    assert err["acc_kahan"] < 0.5 * err["acc_float"], err
    assert err["acc_double"] < 0.5 * err["acc_float"], err
