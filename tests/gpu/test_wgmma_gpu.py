"""Day 16's Hopper kernel on a GPU (sm_90a: an H100 or H200; tests/test_wgmma.py is the CPU half).

* every schedule that loops over tiles on a grid of one and two blocks (pairs), on problems of several
  tiles per block (`capped`, `MULTI_TILE_PROBLEMS`): the ring across tiles, ping-pong's turns;
* every instantiated configuration (the ladder: one warpgroup, specialised, persistent, ping-pong), and
  per schedule one in groups of 3 m-tiles (`OPTIONS`, the tile order `choose` takes for large filters), on NHWC
  problems that divide no tile, with stride, padding and dilation on either axis, C = 8 .. 256
  with a partial last channel block, K odd; fp16 and bf16, normal and integer (bit-exact) inputs;
* the automatic ``igemm_wgmma`` on the NHWC edge problems it takes;
* the fused epilogue through `helpers.check.check_epilogue` (bias, alpha, beta, in-place Cin, ReLU);
* problems beyond the im2col mode's limits, refused before any launch, a misaligned y (refused when
  the copy engine stores it, exact when the threads do), the driver's parameter layout that
  `helpers.tma.kernel_args` pads to, and `helpers.launch.param_buffer` against pycuda's own packing.

Every `check` poisons the output with NaN, compares with the float64 reference within the
fp32-accumulation bound and repeats the launch to compare bitwise. Skipped (tests/conftest.py)
without a CUDA device or pycuda; the whole file is skipped on GPUs other than compute capability 9.0.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import TRAIN_VARIANTS, assert_check_ok, driver_like_offsets, train_layers

from days.day16_igemm_wgmma import (
    BEYOND_LIMITS,
    CHECK_PROBLEMS,
    ENTRIES,
    HOPPER_CC,
    MULTI_TILE_PROBLEMS,
    PERSISTENT_MODES,
    capped,
    make_wgmma,
)
from helpers import compile as hc
from helpers import gpu
from helpers.check import check, check_epilogue
from helpers.epilogue import Epilogue
from helpers.launch import Launcher, param_buffer, run
from helpers.problem import Conv2dProblem
from helpers.reference import compare
from helpers.suites import is_big, suite
from helpers.tma import TensorMap, kernel_args
from helpers.variants import UnsupportedProblem, get

pytestmark = pytest.mark.gpu

V = get("igemm_wgmma")
DTYPES = ("fp16", "bf16")
# every entry in row-major tile order, and one per schedule with tiles in groups of 3 m-tiles
OPTIONS = [replace(next(c for c in ENTRIES if c.mode == m), group_m=3)
           for m in dict.fromkeys(c.mode for c in ENTRIES)]
FORCED = {c.name: make_wgmma(name=f"igemm_wgmma[{c.name}]", config=c) for c in (*ENTRIES, *OPTIONS)}


@pytest.fixture(scope="module", autouse=True)
def context():
    ctx = gpu.init()
    cc = gpu.device_info().cc
    if cc != HOPPER_CC:
        pytest.skip(f"wgmma and the copy engine's im2col mode need sm_90a (compute capability 9.0); this GPU is {cc}")
    return ctx


def _cases(names, problems) -> list:
    """(variant name, problem in each dtype, input kind) for every name and problem."""
    return [
        pytest.param(name, replace(p, dtype=dt, name=""), kind, id=f"{name}-{dt}-{p.name}-{kind}")
        for name in names
        for p in problems
        for dt in DTYPES
        for kind in ("normal", "int")
    ]


CASES = _cases(FORCED, CHECK_PROBLEMS)


@pytest.mark.parametrize("name, p, kind", CASES)
def test_every_configuration(name, p, kind):
    assert_check_ok(check(FORCED[name], p, kind=kind), p, kind)


def _edge_cases():
    for dt in DTYPES:
        for p in suite("edge", dtype=dt, layout="NHWC"):
            if not is_big(p) and V.supports(p, smem_limit=2**31) is None:
                yield pytest.param(p, id=f"{dt}-{p.name}")


EDGE = list(_edge_cases())

# every schedule that loops over tiles on a grid of one and of two blocks (pairs for the clusters):
# each block takes several tiles, so the ring's phases cross tiles, ping-pong's consumers take
# turns more than once and reuse their staging buffers, and a pair walks several pair tiles
CAPPED = {v.name: v for c in ENTRIES if c.mode in PERSISTENT_MODES for v in (capped(c, 1), capped(c, 2))}
MULTI_TILE_CASES = _cases(CAPPED, MULTI_TILE_PROBLEMS)


@pytest.mark.parametrize("name, p, kind", MULTI_TILE_CASES)
def test_several_tiles_per_block(name, p, kind):
    assert_check_ok(check(CAPPED[name], p, kind=kind), p, kind)


def test_several_tiles_per_block_with_the_fused_epilogue():
    """A capped ping-pong block stores its tiles through the fused epilogue (in-place Cin, bias,
    ReLU) in turn with its other consumer, reusing its staging buffers across tiles."""
    v = capped("pingpong_128x128_c2_s6", 1)
    p = MULTI_TILE_PROBLEMS[1]
    r = check_epilogue(v, p, Epilogue(alpha=1.0, beta=1.0, relu=True), in_place=True)
    assert_check_ok(r, p, "normal")


def test_the_edge_suite_has_problems_for_it():
    assert len(EDGE) >= 4


@pytest.mark.parametrize("p", EDGE)
@pytest.mark.parametrize("kind", ["normal", "int", "cancel"])
def test_edge_suite(p, kind):
    assert_check_ok(check(V, p, kind=kind), p, kind)


P_EVEN = Conv2dProblem(layout="NHWC", dtype="fp16", N=2, C=64, H=15, W=13, K=72, R=3, S=3, padding=1)
P_ODD = Conv2dProblem(layout="NHWC", dtype="fp16", N=2, C=32, H=9, W=11, K=33, R=3, S=3, padding=1)
EPILOGUE_CASES = [
    ("bias-only", P_EVEN, Epilogue(), {"with_cin": False}),
    ("scale-relu", P_EVEN, Epilogue(alpha=0.5, beta=2.0, relu=True), {}),
    ("cin-no-bias", P_EVEN, Epilogue(alpha=1.0, beta=-0.75), {"with_bias": False}),
    ("in-place-residual-relu", P_EVEN, Epilogue(alpha=1.0, beta=1.0, relu=True), {"in_place": True}),
    ("int-relu", P_EVEN, Epilogue(alpha=2.0, beta=-1.0, relu=True), {"kind": "int"}),
    ("bf16", replace(P_EVEN, dtype="bf16", name=""), Epilogue(alpha=1.0, beta=1.0, relu=True), {}),
    ("odd-K", P_ODD, Epilogue(alpha=0.5, beta=2.0, relu=True), {}),
    ("odd-K-int-in-place", P_ODD, Epilogue(alpha=2.0, beta=-1.0, relu=True), {"kind": "int", "in_place": True}),
    ("alpha-0", P_EVEN, Epilogue(alpha=0.0, beta=1.0), {"kind": "int"}),
    # one operation away from the plain epilogue (EpilogueKind::PLAIN: alpha = 1, no Cin, bias or
    # ReLU), and on it with a Cin that beta = 0 leaves unread
    ("relu-only", P_EVEN, Epilogue(relu=True), {"with_cin": False, "with_bias": False}),
    ("alpha-only", P_EVEN, Epilogue(alpha=0.5), {"with_cin": False, "with_bias": False}),
    ("plain-cin-unread", P_EVEN, Epilogue(), {"with_bias": False}),
]


@pytest.mark.parametrize("name", list(FORCED))
@pytest.mark.parametrize("case, p, ep, kw", [pytest.param(*c, id=c[0]) for c in EPILOGUE_CASES])
def test_epilogue(name, case, p, ep, kw):
    r = check_epilogue(FORCED[name], p, ep, **kw)
    assert_check_ok(r, p, kw.get("kind", "normal"))


@pytest.mark.parametrize("p, why", BEYOND_LIMITS, ids=[w for _, w in BEYOND_LIMITS])
def test_beyond_the_limits_is_refused_before_a_launch(p, why):
    x, w = p.make_inputs(device="cuda")
    with pytest.raises(UnsupportedProblem, match=why):
        run(V, p, x, w)


@pytest.mark.parametrize("K", [72, 70])
def test_y_two_bytes_off(K, misaligned):
    """K % 8 == 0: the copy engine stores y, whose map needs a 16-byte aligned address, so a
    misaligned y is refused before the launch; K % 8 != 0: the threads store it element by element
    and the result is exact."""
    p = replace(P_EVEN, K=K, name="")
    x, w = p.make_inputs(device="cuda", kind="int", seed=3)
    y = misaligned(torch.full(p.output_shape, float("nan"), dtype=p.torch_dtype, device="cuda"))
    if K % 8 == 0:
        with pytest.raises(ValueError, match="y.data_ptr.. is not 16-byte aligned"):
            run(V, p, x, w, out=y)
        assert bool(y.isnan().all())
    else:
        r = compare(p, x, w, run(V, p, x, w, out=y), exact=True)
        assert r["exact_equal"] and r["nonfinite"] == 0


def test_the_driver_places_maps_where_kernel_args_pads():
    """The layout `kernel_args` fills is the driver's: three 128-byte maps, then y at their end."""
    p = CHECK_PROBLEMS[3]
    (k,) = V.launches(p)
    info = gpu.device_info()
    kern = hc.load_kernel(
        V.cu_file, k.entry, dynamic_smem=k.config.shared_bytes, arch=V.target(info.cc), params=len(k.args)
    )
    offs = kern.param_offsets
    assert len(offs) == len(k.args) == 23
    assert offs[1] == offs[0] + 128 and offs[2] == offs[1] + 128 and offs[3] == offs[2] + 128
    assert all(b > a for a, b in zip(offs, offs[1:]))


def pycuda_build_arg_buf():
    """pycuda's own ``_build_arg_buf``, with which ``Function.__call__`` packs its arguments: a
    function local to ``pycuda.driver._add_functionality``, taken from ``__call__``'s closure."""
    import pycuda.driver as drv

    call = drv.Function.__call__
    return dict(zip(call.__code__.co_freevars, (c.cell_contents for c in call.__closure__)))["_build_arg_buf"]


@pytest.mark.parametrize("name", TRAIN_VARIANTS)
def test_param_buffer_is_pycudas_own_packing(name):
    """`helpers.launch.param_buffer` packs every launch of the training network's layers (real
    tensors, maps encoded by the driver) byte for byte as pycuda's ``_build_arg_buf`` packs the
    arguments `helpers.launch.bind` passed before it packed them itself (after
    `helpers.tma.kernel_args` for a launch that passes maps)."""
    build_arg_buf = pycuda_build_arg_buf()
    v, info = get(name), gpu.device_info()
    packed = 0
    for p in train_layers(n=8, size=28):
        p = v.adapt(p, op=True)
        plan = v.plan(p)
        if plan.refusal(smem_limit=info.smem_per_block_optin, cc=info.cc):
            continue
        a, b = p.make_inputs(device="cuda")
        nbytes = plan.workspace_bytes
        tensors = {**dict(zip(p.inputs, (a, b))), "workspace": torch.empty(nbytes, dtype=torch.uint8, device="cuda")
                   if nbytes else None, p.output: torch.empty(p.output_shape, dtype=p.torch_dtype, device="cuda"),
                   **{nm: None for nm in v.operands}}
        for k in plan.launches:
            maps = any(isinstance(x, TensorMap) for x in k.args)
            launcher = Launcher(k, None, driver_like_offsets(k.args) if maps else None)
            args = launcher.arguments(launcher.addresses(tensors))
            _, want = build_arg_buf(kernel_args(args, launcher.offsets) if maps else args)
            assert param_buffer(args, launcher.offsets) == bytes(want), (p.name, k.name)
            packed += 1
    assert packed > 0
