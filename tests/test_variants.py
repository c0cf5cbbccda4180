"""The variant registry on the CPU: launch configs, the write-coverage models, refusals, bad input.

For every registered variant and every problem it claims (`Variant.supports` is ``None``), the
Python model of its kernel (`Variant.covers`) must write each output element exactly once, with a
launch configuration inside CUDA's limits. Bad tensors must be refused before anything touches
the GPU or imports pycuda.
"""

from __future__ import annotations

import random
import sys
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import RecordingKernel, packed_like_pycuda

from helpers import compile as hc
from helpers import gpu
from helpers.launch import check_tensors, prepare, run
from helpers.problem import Conv2dProblem
from helpers.suites import edge, is_big, quick
from helpers.tma import MapBytes, TensorMap, kernel_args
from helpers.variants import MAX_GRID, MAX_THREADS_PER_BLOCK, Buffer, UnsupportedProblem, all_variants, get

VARIANTS = all_variants()
HOPPER_SMEM = 227 * 1024  # an H100's or H200's opt-in shared memory per block


def supports(v, p: Conv2dProblem) -> str | None:
    """`Variant.supports` with the shared memory of the GPUs ``v`` runs on: the Hopper-only variants
    (day 16) need more than the 48 KB assumed without a GPU, and get an H200's 227 KB."""
    return v.supports(p, smem_limit=HOPPER_SMEM if tuple(v.min_cc) >= (9, 0) else None)


def random_problems(n: int = 50, seed: int = 2024) -> list[Conv2dProblem]:
    """Small seeded problems: mostly 'same' odd filters (what days 01-06 take), some general ones."""
    rng = random.Random(seed)
    out: list[Conv2dProblem] = []
    while len(out) < n:
        kind = rng.random()
        N, H, W = rng.randint(1, 3), rng.randint(1, 40), rng.randint(1, 40)
        try:
            if kind < 0.6:  # "same", odd square or non-square filters, K around the blocking thresholds
                R = rng.choice([1, 3, 5, 7, 9])
                S = R if rng.random() < 0.7 else rng.choice([1, 3, 5])
                K = rng.choice([1, 2, 3, 4, 5, 8, 9, 17, 32, 33, 40])
                out.append(Conv2dProblem(N=N, C=rng.randint(1, 9), H=H, W=W, K=K, R=R, S=S, padding="same"))
            elif kind < 0.8:  # depthwise
                C = rng.randint(1, 12)
                out.append(Conv2dProblem(N=N, C=C, H=H, W=W, K=C, R=3, S=3, padding=1,
                                         stride=rng.choice([1, 2]), groups=C))
            else:  # general
                g = rng.choice([1, 2])
                out.append(
                    Conv2dProblem(
                        N=N, C=g * rng.randint(1, 4), H=H, W=W, K=g * rng.randint(1, 4),
                        R=rng.randint(1, 5), S=rng.randint(1, 5), stride=rng.choice([1, 2, (2, 1)]),
                        padding=rng.choice([0, 1, (2, 0)]), dilation=rng.choice([1, 2]), groups=g,
                    )
                )
        except ValueError:  # filter larger than the padded image: draw again
            continue
    return out


ALL_PROBLEMS = [(f"edge:{p.name}", p) for p in edge()] + [
    (f"rand{i}:{p.name}", p) for i, p in enumerate(random_problems())
]
# (variant, problem) pairs the variant claims; the unsupported ones are not tests (and not skips)
SUPPORTED = [
    pytest.param(v, v.adapt(p, op=True), id=f"{v.name}-{pid}")
    for v in VARIANTS
    for pid, p in ALL_PROBLEMS
    if supports(v, v.adapt(p, op=True)) is None
]


def check_launch_limits(v, p: Conv2dProblem) -> None:
    """The launch config of ``v`` for ``p`` is one CUDA accepts."""
    cfg = v.launch(p)
    assert len(cfg.grid) == 3 and len(cfg.block) == 3
    assert 1 <= cfg.threads_per_block <= MAX_THREADS_PER_BLOCK, (v.name, p.name, cfg)
    assert cfg.block[2] <= 64 and all(b >= 1 for b in cfg.block), (v.name, p.name, cfg)
    for axis, (g, limit) in enumerate(zip(cfg.grid, MAX_GRID)):
        assert isinstance(g, int) and 1 <= g <= limit, f"{v.name} {p.name}: grid {'xyz'[axis]} = {g}"
    assert cfg.shared_bytes >= 0


@pytest.mark.parametrize("v, p", SUPPORTED)
def test_every_output_written_once(v, p: Conv2dProblem):
    check_launch_limits(v, p)
    if is_big(p):
        pytest.skip("2^31-element problem: launch limits checked, coverage model not evaluated (memory)")
    counts = np.asarray(v.covers(p))
    numel = int(np.prod(p.tensor_shape(p.output)))
    assert counts.shape == (numel,), f"{v.name}: covers() gives {counts.shape}, want ({numel},)"
    never, twice = int((counts == 0).sum()), int((counts > 1).sum())
    assert never == 0 and twice == 0, f"{v.name} on {p.name}: {never} outputs never written, {twice} more than once"


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_supports_returns_none_or_a_reason(v):
    for _, p in ALL_PROBLEMS:
        reason = supports(v, v.adapt(p, op=True))
        assert reason is None or (isinstance(reason, str) and reason.startswith(v.name)), (v.name, p.name, reason)


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_variant_supports_something(v):
    """A variant with no supported problem among the edge and random ones would make the coverage test vacuous."""
    probs = [v.adapt(p, op=True) for p in edge() + random_problems() if not is_big(p)]
    assert any(supports(v, p) is None for p in probs), f"{v.name} supports none of the edge/random problems"


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_grid_capping_cases_are_covered(v):
    """The edge suite's N*K > 65535 and P > 65535*8 problems: supported ones keep the grid within limits."""
    for p in map(lambda q: v.adapt(q, op=True), edge()):
        if (p.N * p.K > MAX_GRID[2] or p.P > MAX_GRID[1] * 8) and supports(v, p) is None:
            cfg = v.launch(p)
            assert cfg.grid[1] <= MAX_GRID[1] and cfg.grid[2] <= MAX_GRID[2], (v.name, p.name, cfg)


def test_registry_names_and_days():
    names = [v.name for v in VARIANTS]
    assert len(names) == len(set(names))
    assert [v.day for v in VARIANTS] == sorted(v.day for v in VARIANTS)
    assert {"naive", "z_out"} <= set(names)
    for v in VARIANTS:
        assert get(v.name) is v and get(v) is v
        assert v.cu_file.endswith(".cu")
        for q in (v.adapt(p, op=True) for _, p in ALL_PROBLEMS[:12]):
            if supports(v, q) is None:
                ks = v.launches(q)
                assert ks and ks[-1].config == v.launch(q) and all(k.entry for k in ks), v.name
    with pytest.raises(KeyError, match="known: "):
        get("no_such_variant")


# ---- refusals of days 01-02 ------------------------------------------------------------------

BASE = dict(N=1, C=3, H=16, W=12, K=4, R=3, S=3, padding=1)


@pytest.mark.parametrize("name", ["naive", "z_out"])
@pytest.mark.parametrize(
    "change, must_name",
    [
        (dict(R=4, S=3, padding=(1, 1)), "R=4"),
        (dict(R=3, S=2, padding=(1, 0)), "S=2"),
        (dict(stride=(2, 1)), "(2, 1)"),
        (dict(dilation=2, padding=2), "(2, 2)"),
        (dict(C=4, K=4, groups=2), "groups=1; got 2"),
        (dict(padding=0), "(0, 0)"),
        (dict(padding=(1, 2)), "(1, 2)"),
        (dict(dtype="fp16"), "fp16"),
        (dict(layout="NHWC"), "NHWC"),
    ],
)
def test_days_01_02_refusals_name_the_value(name: str, change: dict, must_name: str):
    v = get(name)
    assert v.supports(Conv2dProblem(**BASE)) is None
    reason = v.supports(Conv2dProblem(**{**BASE, **change}))
    assert reason is not None and must_name in reason, reason
    assert reason.startswith(name)


# ---- bad input is refused before any GPU use -------------------------------------------------


@pytest.fixture
def no_gpu(monkeypatch):
    """Make any GPU use fail loudly: pycuda unimportable, `gpu.init`/`device_info` raising."""

    def touched(*a, **k):
        raise AssertionError("the GPU was touched before the input was validated")

    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    monkeypatch.setattr(gpu, "init", touched)
    monkeypatch.setattr(gpu, "device_info", touched)
    monkeypatch.setattr(gpu, "has_gpu", lambda: False)  # `supports` without a limit asks no device either


def supported_square(v) -> Conv2dProblem:
    """A problem ``v`` supports (in its operation) whose first input is square, H == W for x and
    P == Q for dy (so a transposed input keeps its shape)."""
    for p in map(lambda q: v.adapt(q, op=True), quick() + edge() + random_problems()):
        side = (p.H, p.W) if p.inputs[0] == "x" else (p.P, p.Q)
        if side[0] == side[1] > 1 and not is_big(p) and supports(v, p) is None:
            return p
    pytest.skip(f"{v.name} supports no square problem here")


@pytest.mark.parametrize("call", [prepare, run], ids=["prepare", "run"])
@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_bad_tensors_refused_on_cpu(v, call, no_gpu):
    p = supported_square(v)
    x, w = p.make_inputs()  # the op's two inputs (fprop x, w; dgrad dy, w; wgrad x, dy)
    a, b = p.inputs
    want = str(p.torch_dtype).replace(".", r"\.")  # e.g. torch\.float32
    with pytest.raises(TypeError, match=rf"{a} must be {want}"):
        call(v, p, x.double(), w)
    with pytest.raises(TypeError, match=rf"{b} must be {want}"):
        call(v, p, x, w.double())
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        call(v, p, x.numpy(), w)
    shape = list(x.shape)
    shape[2] += 1
    with pytest.raises(ValueError, match=f"{a} must have shape"):
        call(v, p, torch.zeros(shape, dtype=p.torch_dtype), w)
    with pytest.raises(ValueError, match=f"{b} must have shape"):
        call(v, p, x, w[:, :, :1])
    xt = x.transpose(2, 3) if p.layout == "NCHW" else x.transpose(1, 2)  # swap the square sides
    assert xt.shape == x.shape and not xt.is_contiguous()
    with pytest.raises(ValueError, match=rf"not contiguous.*{a}\.contiguous\(\)"):
        call(v, p, xt, w)
    with pytest.raises(ValueError, match=rf"{a} is on cpu.*{a}\.cuda\(\)"):
        call(v, p, x, w)


def aligned_x_problem(v, misaligned) -> Conv2dProblem | None:
    """A problem ``v`` supports on which its tensor check refuses a first input (x; dy for dgrad)
    2 bytes off alignment, or None."""
    for p in map(lambda q: v.adapt(q, op=True), quick() + edge() + random_problems()):
        if is_big(p) or supports(v, p) is not None:
            continue
        a, b = p.inputs
        off = misaligned(torch.zeros(p.tensor_shape(a), dtype=p.torch_dtype))
        if v.plan(p).tensor_reason({a: off, b: None, p.output: None}) is not None:
            return p
    return None


@pytest.mark.parametrize("v", [v for v in VARIANTS if v.tensor_check_fn], ids=lambda v: v.name)
def test_misaligned_x_refused_before_the_gpu(v, misaligned, monkeypatch):
    """Where a variant needs its first input (x; dy for dgrad) aligned (its 16-byte loads or
    copies), `prepare` refuses a misaligned one, naming it, right after the tensor checks and
    before any GPU call."""
    p = aligned_x_problem(v, misaligned)
    if p is None:
        pytest.skip(f"{v.name} needs no alignment of its first input on the edge/random problems it supports")
    x, w = p.make_inputs()
    monkeypatch.setattr("helpers.launch.check_tensors", lambda *a, **k: None)  # CPU tensors pass

    def touched(*a, **k):
        raise AssertionError("the GPU was touched before the tensor check")

    monkeypatch.setattr(gpu, "device_info", touched)
    monkeypatch.setattr(gpu, "has_gpu", lambda: False)  # `supports` without a limit asks no device either
    with pytest.raises(ValueError, match=rf"{v.name}: {p.inputs[0]}\.data_ptr\(\) is not 16-byte aligned"):
        prepare(v, p, misaligned(x), w)


@pytest.mark.parametrize("call", [prepare, run], ids=["prepare", "run"])
def test_unsupported_problem_refused_before_tensors(call, no_gpu):
    p = Conv2dProblem(N=1, C=2, H=8, W=8, K=3, R=4, S=4, padding=(1, 1))
    x, w = p.make_inputs()
    with pytest.raises(UnsupportedProblem, match="odd filter"):
        call("naive", p, x, w)
    assert issubclass(UnsupportedProblem, ValueError)


def test_filter_larger_than_image_refused_at_construction():
    with pytest.raises(ValueError, match="larger than the padded image"):
        Conv2dProblem(N=1, C=1, H=3, W=3, K=1, R=5, S=5)


def test_no_gpu_fixture_blocks_pycuda(no_gpu):
    with pytest.raises(ImportError):
        import pycuda.driver  # noqa: F401
    with pytest.raises(AssertionError, match="touched"):
        gpu.device_info()


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_sizes_past_int32_are_refused(v):
    """The kernels take sizes as np.int32: a larger one must be refused, not wrapped or overflowed at launch."""
    p = v.adapt(Conv2dProblem(N=1, C=1, H=2**31, W=1, K=1, R=1, S=1), op=True)
    reason = v.supports(p, smem_limit=2**31)
    assert reason is not None and "int32" in reason and str(2**31) in reason, reason


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_bad_y_refused_before_gpu(v, no_gpu):
    p = supported_square(v)
    x, w = p.make_inputs()
    shape, name = p.tensor_shape(p.output), p.output
    for y in (torch.empty(1), torch.empty(shape, dtype=torch.float64), torch.empty(shape + (2,))[..., 0],
              np.zeros(shape, dtype=np.float32)):
        with pytest.raises(ValueError, match=f"{name} must be"):
            prepare(v, p, x, w, out=y)
        with pytest.raises(ValueError, match=f"{name} must be"):
            run(v, p, x, w, out=y)


# (variant, problem, words of the reason): problems inside every int32 argument whose *products*
# overflow 32-bit arithmetic in the kernel (checked by emulating the kernels' int math).
INT32_PRODUCTS = [
    # 09/10/11: `const int pq = (int)(m % (P * Q))` wraps for P*Q >= 2^31: pixel 2^31 decodes to
    # h0 = -46340 (padding) instead of row 46340, so its outputs would be 0.
    *[pytest.param(n, Conv2dProblem(N=1, C=1, H=46341, W=46341, K=1, R=1, S=1), "P*Q", id=f"{n}-PQ")
      for n in ("igemm_simt_analytic", "igemm_simt", "igemm_wmma", "igemm_mma")],
    # GEMM-K walks: CEIL_DIV(C, 8) (09) and CEIL_DIV(C, 32) (10, 11) wrap to a negative step count
    # (no loop, y = 0); the analytic kernel's `kg0 += 8` wraps and `kg0 < KG` never ends. One
    # bound, R*S*C <= INT32_MAX - 31, covers the widest step (32).
    *[pytest.param(n, Conv2dProblem(N=1, C=2**31 - 1, H=1, W=1, K=1, R=1, S=1), "R*S*C", id=f"{n}-RSC")
      for n in ("igemm_simt_analytic", "igemm_simt", "igemm_wmma", "igemm_mma")],
    # 06 (K < 32 tiles): `for (c0 = 0; c0 < C; c0 += CC)` wraps for C > INT32_MAX - CC + 1.
    pytest.param("blocked", Conv2dProblem(N=1, C=2**31 - 1, H=1, W=1, K=1, R=1, S=1), "C =", id="blocked-C"),
]


@pytest.mark.parametrize("name, p, words", INT32_PRODUCTS)
def test_int32_products_in_kernels_are_refused(name: str, p: Conv2dProblem, words: str):
    v = get(name)
    reason = v.supports(v.adapt(p, op=True), smem_limit=2**31)
    assert reason is not None and words in reason, reason


@pytest.mark.parametrize("name", ["igemm_simt_analytic", "igemm_simt", "igemm_wmma", "igemm_mma", "blocked"])
def test_int32_product_limits_are_tight(name: str):
    """Just inside the new limits the variants still claim the problem."""
    v = get(name)
    for p in (Conv2dProblem(N=1, C=2**31 - 32, H=1, W=1, K=1, R=1, S=1),
              Conv2dProblem(N=1, C=1, H=46340, W=46340, K=1, R=1, S=1)):
        assert v.supports(v.adapt(p, op=True), smem_limit=2**31) is None, (name, p.name)


# ---- the launch path end to end, with a stand-in GPU -----------------------------------------


def fake_map(desc, address: int) -> MapBytes:
    """A stand-in for `helpers.tma.encode`: 128 bytes that name the map and the address."""
    return MapBytes(f"{hash(desc) & 0xFFFFFFFF:08x}{address:016x}".encode().ljust(128, b"."))


STAND_IN_OFFSETS = tuple(112 + 128 * i for i in range(64))  # the stand-in driver's: room for any parameter


@pytest.fixture
def stand_in_gpu(monkeypatch):
    """CPU tensors pass the device check, the device is an H200 (sm_90) on the default stream, and
    `load_kernel` returns a recorder for each entry (`conftest.RecordingKernel`: each launch's
    entry, parameter buffer, grid, block and shared bytes): `prepare` runs every other step for real."""
    from helpers import launch as hl

    real_check = hl.check_tensors

    def check_but_device(*a, **k):
        try:
            real_check(*a, **k)
        except ValueError as e:
            if "kernels need CUDA tensors" not in str(e):
                raise

    calls, built = [], []

    def load_kernel(cu_file, entry, defines=None, dynamic_smem=0, arch=None, params=0):
        built.append((cu_file, entry, dict(defines or {}), dynamic_smem, arch))
        offsets = STAND_IN_OFFSETS[:params] if params else None
        return hc.CompiledKernel(function=RecordingKernel(entry, calls), num_regs=32, shared_static_bytes=0,
                                 local_bytes=0, max_threads_per_block=1024, param_offsets=offsets)

    monkeypatch.setattr(hl, "check_tensors", check_but_device)
    monkeypatch.setattr(hl, "encode_map", fake_map)  # the driver encodes tensor maps (day 16)
    monkeypatch.setattr(
        gpu, "device_info", lambda: SimpleNamespace(smem_per_block_optin=227 * 1024, cc=(9, 0), sms=132)
    )
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(hc, "load_kernel", load_kernel)
    return calls, built


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_prepare_binds_every_launch_by_name(v, stand_in_gpu):
    """`prepare` builds each launch for the variant's target, allocates the output and workspace,
    and passes each named buffer's pointer and the scalars in the launch's order."""
    calls, built = stand_in_gpu
    p = supported_square(v)
    x, w = p.make_inputs()
    plan, y = prepare(v, p, x, w)
    launches = v.launches(p)
    assert [b[1] for b in built] == [k.entry for k in launches]
    assert [b[0] for b in built] == [k.source(v) for k in launches]  # the variant's file, or the launch's own
    assert all(b[2] == v.defines and b[4] == v.target((9, 0)) for b in built)
    assert tuple(y.shape) == p.tensor_shape(p.output) and y.dtype == p.torch_dtype
    assert list(plan.kernels) == [k.name for k in launches]
    ws = plan.workspace
    assert (ws is None) == (v.workspace_bytes(p) == 0) and (ws is None or ws.numel() == v.workspace_bytes(p))
    plan()
    ptrs = {p.inputs[0]: x.data_ptr(), p.inputs[1]: w.data_ptr(), p.output: y.data_ptr(), "cin": 0, "bias": 0,
            "workspace": ws.data_ptr() if ws is not None else None}
    assert [c[0] for c in calls] == [k.entry for k in launches]
    for (entry, buf, grid, block, shared), k in zip(calls, launches):
        assert (grid, block, shared) == (k.config.grid, k.config.block, k.config.shared_bytes)
        args = tuple(fake_map(a.desc, ptrs[a.name] + a.offset) if isinstance(a, TensorMap)  # day 18 maps its workspace
                     else np.uintp(ptrs[a.name] + a.offset) if isinstance(a, Buffer) else a for a in k.args)
        if any(isinstance(a, TensorMap) for a in k.args):  # laid out at the driver's offsets first
            args = kernel_args(args, STAND_IN_OFFSETS[:len(args)])
        assert buf == packed_like_pycuda(args), entry


# The variants one of whose launches is built from another file than the variant's (`KernelLaunch.cu_file`).
# day 18 runs day 16's kernel from its file; day 22 runs day 16's (fprop) and day 18's (dgrad) launches where
# it does not split (these small problems)
OWN_FILE_LAUNCHES = {"dgrad_wgmma": {"fprop": "16_igemm_wgmma.cu"}, "igemm_split_k": {"main": "16_igemm_wgmma.cu"},
                     "dgrad_split_k": {"rotate": "18_dgrad_wgmma.cu", "fprop": "16_igemm_wgmma.cu"}}


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_launches_build_from_the_variants_file_unless_they_name_their_own(v, stand_in_gpu):
    """Every launch of the series but those of `OWN_FILE_LAUNCHES` names no file (`KernelLaunch.cu_file` None):
    `compile_launches` builds it from the variant's ``cu_file``, as before launches could name
    one; a launch that names one is built from that file, which exists."""
    _, built = stand_in_gpu
    p = supported_square(v)
    launches = v.launches(p)
    named = {k.name: k.cu_file for k in launches if k.cu_file is not None}
    assert named == OWN_FILE_LAUNCHES.get(v.name, {})
    prepare(v, p, *p.make_inputs())
    want = [named.get(k.name, v.cu_file) for k in launches]
    assert [b[0] for b in built] == want and [k.source(v) for k in launches] == want
    assert v.plan(p).sources == tuple(dict.fromkeys(want))
    assert all(hc.kernel_path(f).is_file() for f in want)


def test_prepare_refuses_aliasing_outputs(stand_in_gpu):
    """The output may not share memory with an input (other blocks still read it)."""
    v = get("igemm_simt")
    p = Conv2dProblem(N=1, C=8, H=6, W=6, K=8, R=1, S=1, layout="NHWC")  # 1x1, C == K: x and y have one shape
    x, w = p.make_inputs()
    with pytest.raises(ValueError, match="y overlaps x in memory"):
        prepare(v, p, x, w, out=x)
    prepare(v, p, x, w, out=torch.empty(p.y_shape))


def test_prepare_cache_reuses_the_plan_and_checks_tensors_every_call(stand_in_gpu, monkeypatch):
    """With ``cache=True`` a second call on the same variant, problem, epilogue and device builds
    nothing and asks the variant for no launches, yet checks its tensors and binds their own
    pointers; another problem, another variant object or `clear_plans` make a new plan, and
    ``cache=False`` always does; an edited kernel file builds the kept plan's kernels again."""
    from helpers import launch as hl

    calls, built = stand_in_gpu
    base = get("wgrad")  # two launches (main loop, reduction) and a workspace
    asked = []

    def counted(p, ep, cfg):
        asked.append(p)
        return base.launches_fn(p, ep, cfg)

    v = replace(base, name="wgrad[counted]", launches_fn=counted)
    p = Conv2dProblem(N=4, C=16, H=28, W=28, K=16, R=3, S=3, padding=1, dtype="fp16", layout="NHWC", op="wgrad")
    x, dy = p.make_inputs()
    assert v.workspace_bytes(p) > 0
    hl.clear_plans()
    plan, dw = prepare(v, p, x, dy, cache=True)
    first_builds, first_asks = len(built), len(asked)
    assert first_builds == len(v.launches(p)) and first_asks > 0
    del asked[first_asks:]
    x2, dy2 = p.make_inputs()
    plan2, dw2 = prepare(v, p, x2, dy2, cache=True)
    assert len(built) == first_builds and len(asked) == first_asks  # nothing rebuilt, no launches asked
    assert dw2.data_ptr() != dw.data_ptr() and plan2.workspace.numel() == plan.workspace.numel()
    plan2()
    assert calls[0][1][:16] == packed_like_pycuda((np.uintp(x2.data_ptr()), np.uintp(dy2.data_ptr())))  # its pointers
    with pytest.raises(ValueError, match="dy must have shape"):  # tensors are checked on a hit too
        prepare(v, p, x2, dy2[:1], cache=True)
    with pytest.raises(ValueError, match="dw overlaps x"):
        prepare(v, p, x2, dy2, out=x2.view(-1)[: dw.numel()].view(dw.shape), cache=True)
    misses = [
        lambda: prepare(v, replace(p, N=3, name=""), *replace(p, N=3, name="").make_inputs(), cache=True),
        lambda: prepare(replace(v), p, x2, dy2, cache=True),  # an equal copy is another variant
        lambda: prepare(v, p, x2, dy2),  # no cache: planned afresh
    ]
    for make in misses:
        n = len(built)
        make()
        assert len(built) > n
    n = len(built)
    hl.clear_plans()
    prepare(v, p, x2, dy2, cache=True)
    assert len(built) > n
    n = len(built)
    monkeypatch.setattr("helpers.compile.source_hash", lambda cu: "an edited source")
    asked.clear()
    prepare(v, p, x2, dy2, cache=True)  # the kernel (or a file it includes) changed: built again
    assert len(built) > n and asked == []


def test_a_kept_plan_repeats_only_the_per_call_work(stand_in_gpu, monkeypatch):
    """On a kept plan (``cache=True``) a later call builds nothing, works out no refusal (the plan
    keeps them), encodes no map and packs no parameter buffer while its tensors are where they
    were, yet checks the stream and its tensors on every call: a bad tensor raises the first
    call's error before any launch; a tensor at a new address packs that launch again."""
    from helpers import launch as hl
    from helpers.variants import Plan

    calls, _ = stand_in_gpu
    counts = {}

    def count(owner, name):
        real = getattr(owner, name)

        def counted(*a, **k):
            counts[name] = counts.get(name, 0) + 1
            return real(*a, **k)

        monkeypatch.setattr(owner, name, counted)

    for name in ("compile_launches", "encode_map", "param_buffer", "_check_stream", "_check_call"):
        count(hl, name)
    count(Plan, "_launch_refusal")
    v = get("igemm_wgmma")  # one launch, three tensor maps
    p = Conv2dProblem(N=2, C=64, H=14, W=14, K=128, R=3, S=3, padding=1, dtype="fp16", layout="NHWC")
    x, w = p.make_inputs()
    y = torch.empty(p.output_shape, dtype=p.torch_dtype)
    hl.clear_plans()
    prepared, out = prepare(v, p, x, w, out=y, cache=True)
    prepared()
    assert counts == {"compile_launches": 1, "encode_map": 3, "param_buffer": 1, "_check_stream": 1,
                      "_check_call": 1, "_launch_refusal": 2}
    for _ in range(2):
        counts.clear()
        prepared, out = prepare(v, p, x, w, out=y, cache=True)
        prepared()
        assert counts == {"_check_stream": 1, "_check_call": 1} and out is y
    assert calls[0] == calls[1] == calls[2]  # one buffer, launched three times
    counts.clear()
    with pytest.raises(ValueError, match=r"x must have shape \(2, 14, 14, 64\)"):
        prepare(v, p, x[:1], w, out=y, cache=True)
    x_in_y = y.view(-1)[: x.numel()].view(x.shape)
    with pytest.raises(ValueError, match="y overlaps x in memory"):
        prepare(v, p, x_in_y, w, out=y, cache=True)
    assert counts == {"_check_call": 2} and len(calls) == 3
    counts.clear()
    prepare(v, p, x, w, cache=True)[0]()  # a fresh y: the launch is packed again (`encode` keeps x's and w's maps)
    assert counts == {"_check_stream": 1, "_check_call": 1, "param_buffer": 1, "encode_map": 3}
    assert calls[3][1] != calls[0][1]


def test_supports_without_a_limit_uses_the_device_or_says_what_it_assumed(monkeypatch):
    """The public `supports` gives the launch path's answer: the GPU's opt-in limit, or without a
    GPU the 48 KB every GPU allows, named as assumed in the refusal."""
    v = get("igemm_production")
    p = Conv2dProblem(N=8, C=64, H=56, W=56, K=256, R=3, S=3, padding=1, dtype="fp16", layout="NHWC")
    need = v.launch(p).shared_bytes
    assert need > 48 * 1024  # the rule's tile for this layer opts into more than 48 KB
    monkeypatch.setattr(gpu, "has_gpu", lambda: False)
    reason = v.supports(p)
    assert reason is not None and f"needs {need} B" in reason and "assumed without a GPU" in reason
    monkeypatch.setattr(gpu, "has_gpu", lambda: True)
    monkeypatch.setattr(
        gpu, "device_info", lambda: SimpleNamespace(smem_per_block_optin=227 * 1024, cc=(9, 0), sms=132)
    )
    assert v.supports(p) is None
    assert v.supports(p, smem_limit=48 * 1024).endswith(f"the limit is {48 * 1024} B")  # an explicit limit: no note


def test_run_does_not_poison_an_in_place_cin_passed_as_a_view(stand_in_gpu):
    """cin may be the output's own memory under any view (y, y[:], y.view(...)): run must not NaN it."""
    v = get("igemm_production")
    p = Conv2dProblem(N=1, C=8, H=4, W=4, K=8, R=1, S=1, dtype="fp16", layout="NHWC")
    x, w = p.make_inputs()
    from helpers.epilogue import Epilogue

    for view in (lambda t: t, lambda t: t[:], lambda t: t.view(t.shape), lambda t: t.detach()):
        y = torch.ones(p.y_shape, dtype=torch.float16)
        run(v, p, x, w, out=y, cin=view(y), epilogue=Epilogue(beta=1.0))
        assert bool((y == 1).all()), "run poisoned the in-place residual"
    y = torch.ones(p.y_shape, dtype=torch.float16)
    run(v, p, x, w, out=y)  # no cin: poisoned as always (the stand-in kernel writes nothing)
    assert bool(torch.isnan(y).all())


def test_epilogue_type_errors_before_any_gpu_use(no_gpu):
    from helpers.epilogue import Epilogue

    p = Conv2dProblem(N=1, C=3, H=8, W=8, K=4, R=3, S=3, padding=1)
    x, w = p.make_inputs()
    for bad in ("relu", 1.0, True):
        with pytest.raises(TypeError, match="epilogue must be a helpers.epilogue.Epilogue"):
            prepare("naive", p, x, w, epilogue=bad)
    with pytest.raises(TypeError, match="relu must be True or False"):
        Epilogue(relu="no")
    with pytest.raises(TypeError, match="relu must be True or False"):
        Epilogue(relu=2)
    with pytest.raises(TypeError, match="alpha must be a real number"):
        Epilogue(alpha="2")
    with pytest.raises(TypeError, match="beta must be a real number"):
        Epilogue(beta=True)


def test_copies_keep_a_fixed_entry():
    v = get("naive")
    capped = v.with_output_launch(lambda cfg: cfg, name="naive_same")
    assert capped.entry == v.entry == "conv2d_naive"
    with pytest.raises(AttributeError, match="per problem"):
        _ = get("blocked").with_output_launch(lambda cfg: cfg, name="b").entry


def test_bind_refuses_a_buffer_offset_outside_its_tensor():
    """A `Buffer` offset (e.g. one phase's filter in dgrad's workspace) must point inside the tensor."""
    from helpers.launch import Launcher, bind
    from helpers.variants import KernelLaunch, LaunchConfig

    ws = torch.empty(64, dtype=torch.uint8)
    k = KernelLaunch("main", "f", LaunchConfig((1, 1, 1), (1, 1, 1)), (Buffer("workspace", 16),))
    assert "main" in bind([Launcher(k, RecordingKernel("f", []))], {"workspace": ws})
    for off in (64, 1000):
        bad = KernelLaunch("main", "f", LaunchConfig((1, 1, 1), (1, 1, 1)), (Buffer("workspace", off),))
        with pytest.raises(ValueError, match="outside the tensor"):
            bind([Launcher(bad, RecordingKernel("f", []))], {"workspace": ws})


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it lives on ``cuda:<index>`` (a fake device index, for the CPU)."""

    index = 1

    @property
    def device(self):
        return torch.device("cuda", type(self).index)


@pytest.mark.parametrize("index", [1, 0])
def test_tensors_on_another_gpu_than_the_context_are_refused(index, monkeypatch):
    """The kernels run in the context of `helpers.gpu.context_device` (cuda:0 here): tensors on
    cuda:1 are refused by name, before any launch (they were accepted, and the kernels read them
    through another device's pointers); on cuda:0 they pass the device check."""
    p = Conv2dProblem(N=1, C=3, H=8, W=8, K=4, R=3, S=3, padding=1)
    x, w = (t.as_subclass(_OnCuda) for t in p.make_inputs())
    monkeypatch.setattr(_OnCuda, "index", index)
    if index == 1:
        with pytest.raises(ValueError, match=r"on cuda:1, but the kernels run in the context of cuda:0"):
            check_tensors(p, (x, w))
    else:
        check_tensors(p, (x, w))


def test_init_on_a_second_device_is_refused(monkeypatch):
    """One process runs its kernels in one context: asking `helpers.gpu.init` for another device
    once the context exists is an error, not a silent return of the first device's context; the
    harness's own calls (``init()``, no device) take the context's device, whichever it is."""
    monkeypatch.setattr(gpu, "_ctx", object())
    monkeypatch.setattr(gpu, "_device", 0)
    assert gpu.init(0) is gpu._ctx and gpu.init() is gpu._ctx
    with pytest.raises(ValueError, match="the shared context is on cuda:0"):
        gpu.init(1)
    monkeypatch.setattr(gpu, "_device", 1)  # a context on device 1: the harness's own init() calls keep it
    assert gpu.init() is gpu._ctx and gpu.init(1) is gpu._ctx and gpu.context_device() == torch.device("cuda", 1)


def test_one_benchmark_row_asks_the_variant_once(stand_in_gpu, monkeypatch):
    """A benchmark row makes the variant's plan once and passes it on: the configuration, the
    support check, the two checked runs of each input kind and the timed run ask ``config_fn`` and
    ``launches_fn`` once between them (before the plan, one row called ``launches_fn`` 16 times).
    The real `helpers.bench.bench`, `helpers.check.check` and `prepare`, on CPU tensors, with
    recorded launches; only the float64 comparison and the timer are stood in."""
    import importlib

    hb = importlib.import_module("helpers.bench")
    hk = importlib.import_module("helpers.check")
    base = get("dgrad")  # a configuration, three launches and a workspace
    asked = {"config": 0, "launches": 0}

    def config_fn(p):
        asked["config"] += 1
        return base.config_fn(p)

    def launches_fn(p, ep, cfg):
        asked["launches"] += 1
        return base.launches_fn(p, ep, cfg)

    v = replace(base, name="dgrad[counted]", config_fn=config_fn, launches_fn=launches_fn)
    problems = [Conv2dProblem(N=2, C=16, H=9, W=11, K=24, R=3, S=3, stride=2, padding=1, dtype="fp16",
                              layout="NHWC", op="dgrad"), Conv2dProblem(N=1, C=8, H=6, W=6, K=8, R=1, S=1,
                                                                        dtype="fp16", layout="NHWC", op="dgrad")]
    real_inputs = Conv2dProblem.make_inputs
    monkeypatch.setattr(Conv2dProblem, "make_inputs", lambda self, device="cpu", **kw: real_inputs(self, **kw))
    passed = {"nonfinite": 0, "max_abs_err": 0.0, "worst_err_over_bound": 0.0, "rel_l2": 0.0, "exact_equal": True}
    monkeypatch.setattr(hk, "compare", lambda *a, **kw: passed)
    monkeypatch.setattr(hb, "time_gpu", lambda fn, **kw: fn() or SimpleNamespace(ms_p50=1.0, ms_p20=1.0, ms_p80=1.0,
                                                                                 reps=1))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (2**40, 2**41))
    df = hb.bench([v], problems, cudnn=False, progress=False)
    assert list(df.status) == ["ok", "ok"], df.status.tolist()
    calls, _ = stand_in_gpu
    assert asked == {"config": 2, "launches": 2}  # once per row
    runs = 2 * 2 + 1  # two checked runs of each input kind (normal, int), then the timed one
    assert len(calls) == runs * sum(len(base.launches(p)) for p in problems)


def test_prepare_runs_the_configuration_the_review_answers_with(stand_in_gpu):
    """A variant's ``review_fn`` runs after the tensor checks and may answer with another
    configuration: `prepare` then builds and binds that configuration's plan (the tuned variant
    falls back to the rule's this way); a review that keeps the configuration keeps the plan."""
    calls, built = stand_in_gpu
    base = get("igemm_wgmma")
    p = Conv2dProblem(N=2, C=64, H=14, W=14, K=128, R=3, S=3, padding=1, dtype="fp16", layout="NHWC")
    x, w = p.make_inputs()
    rule = base.plan(p).config
    other = next(c for c in base.configs_fn() if c.config_fn(p).name != rule.name).config_fn(p)
    seen = []
    v = replace(base, name="wgmma[reviewed]", review_fn=lambda q, cfg: seen.append(cfg) or other)
    prepared, _ = prepare(v, p, x, w)
    assert seen == [rule] and prepared.plan.config == other
    assert [b[1] for b in built] == [k.entry for k in base.plan(p, config=other).launches]
    kept = replace(base, name="wgmma[kept]", review_fn=lambda q, cfg: cfg)
    assert prepare(kept, p, x, w)[0].plan.config == rule
    with pytest.raises(ValueError, match="x must have shape"):  # the tensors are checked before the review
        prepare(replace(v, review_fn=lambda q, cfg: pytest.fail("reviewed before the tensor checks")), p, x[:1], w)


def test_a_plan_and_a_call_that_disagree_are_refused_before_any_gpu_call(no_gpu):
    """A plan carries its problem and epilogue: `prepare`, `run` and `check` refuse a plan given
    another epilogue or problem, and a variant given no problem, with the reason (no GPU touched)."""
    from helpers.check import check
    from helpers.epilogue import Epilogue
    from helpers.variants import as_plan

    v = get("igemm_production")
    p = Conv2dProblem(N=1, C=16, H=8, W=8, K=16, R=3, S=3, padding=1, dtype="fp16", layout="NHWC")
    plan = v.plan(p)
    x, w = p.make_inputs()
    assert as_plan(plan) is plan and as_plan(v, p).config == plan.config
    with pytest.raises(ValueError, match="the plan was made for"):
        prepare(plan, x, w, epilogue=Epilogue(relu=True))
    with pytest.raises(ValueError, match="the plan was made for"):
        run(plan, x, w, epilogue=Epilogue(alpha=2.0))
    with pytest.raises(ValueError, match="the plan is for"):
        check(plan, replace(p, K=32, name=""))
    with pytest.raises(TypeError, match="needs the problem"):
        prepare(v, x, w)
    with pytest.raises(TypeError, match="needs the problem"):
        check(v)
