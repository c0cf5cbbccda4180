"""Day 18 on the CPU: unit-stride dgrad as day 16's fprop over dy with the filter turned around
(`days.day18_dgrad_wgmma`; tests/gpu/test_dgrad_wgmma_gpu.py runs the kernels).

* the identity itself, in float64 with torch: ``torch.nn.grad.conv2d_input`` (and
  ``conv_transpose2d``, and the harness's reference) equals the fprop over dy with the filter
  w'[c, r', s', k] = w[k, R−1−r', S−1−s', c], stride 1, padding' = dil·(R−1) − pad and the same
  dilation, on random problems (non-square images and filters, R != S, dilations (1, 2) and
  (2, 1), every padding from 0 to the dilated filter's reach, odd C and K, N > 1); its output is
  H x W;
* ``dgrad_rotate_filter`` by its own index arithmetic (`rotate_model`) is ``torch.flip`` and
  ``permute`` of w, and writes every element of w' exactly once (`rotate_writes`), across
  partial 64-wide tiles of C and K; a planted short grid leaves elements unwritten;
* the launches: ``rotate`` then day 16's fprop launch for `choose` on the equivalent problem,
  with its arguments renamed (dy, the workspace, dx; no Cin, bias); the fprop those arguments
  describe (padding, dilation, sizes, maps) gives dx in float64; the dy map's im2col walk reads,
  for every row and tap, the dy pixel the rotated tap reaches; every dx element is written once
  (capped grids included);
* refusals, each naming its value: stride 2 (day 14's dgrad), groups, padding past the dilated
  filter (padding' < 0), K % 8 != 0, day 16's own limits in dgrad's terms, misaligned dy, dx, w;
  a fused epilogue;
* each launch built from its own file: ``rotate`` from the variant's ``18_dgrad_wgmma.cu``,
  ``fprop`` from day 16's ``16_igemm_wgmma.cu`` (`helpers.variants.KernelLaunch.cu_file`), the
  very module day 16 builds for that entry; the plan's kernels are built again when either file's
  source hash changes;
* the new ``.cu`` for sm_90a: the rotate kernel alone, without spills.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from days import day18_dgrad_wgmma as d18
from days.day16_igemm_wgmma import ENTRIES, PERSISTENT_MODES, choose, wgmma_launches
from helpers import compile as hc
from helpers import tma
from helpers.epilogue import PLAIN, Epilogue
from helpers.launch import compile_launches, compiled, prepare, sources_key
from helpers.problem import Conv2dProblem
from helpers.reference import reference
from helpers.tma import MapBytes, TensorMap
from helpers.variants import Buffer, UnsupportedProblem, get

V = get("dgrad_wgmma")
HOPPER_SMEM = 227 * 1024


def dgrad(**kw) -> Conv2dProblem:
    return Conv2dProblem(op="dgrad", dtype="fp16", layout="NHWC", **kw)


def random_identity_cases(n: int, seed: int = 17) -> list[Conv2dProblem]:
    """Unit-stride dgrad problems (fp32 NCHW: the identity needs no kernel), R != S allowed,
    dilation 1 or 2 per axis, every padding up to the dilated filter's reach, odd C and K."""
    rng, out = random.Random(seed), []
    while len(out) < n:
        R, S, dh, dw = rng.randint(1, 5), rng.randint(1, 5), rng.randint(1, 2), rng.randint(1, 2)
        ph, pw = rng.randint(0, dh * (R - 1)), rng.randint(0, dw * (S - 1))
        H, W = rng.randint(1, 13), rng.randint(1, 13)
        if H + 2 * ph < dh * (R - 1) + 1 or W + 2 * pw < dw * (S - 1) + 1:
            continue
        out.append(Conv2dProblem(N=rng.randint(1, 3), C=rng.choice([1, 3, 5, 8]), H=H, W=W, K=rng.choice([1, 2, 7]),
                                 R=R, S=S, padding=(ph, pw), dilation=(dh, dw), op="dgrad"))
    return out


IDENTITY = [
    Conv2dProblem(N=2, C=3, H=9, W=7, K=5, R=3, S=3, padding=1, op="dgrad"),
    Conv2dProblem(N=1, C=5, H=8, W=11, K=3, R=3, S=2, padding=(2, 0), dilation=(1, 2), op="dgrad"),
    Conv2dProblem(N=2, C=1, H=12, W=6, K=7, R=2, S=4, padding=(1, 3), dilation=(2, 1), op="dgrad"),
    Conv2dProblem(N=1, C=3, H=7, W=9, K=3, R=5, S=3, padding=0, op="dgrad"),  # padding 0: padding' = R - 1
    Conv2dProblem(N=1, C=2, H=6, W=6, K=4, R=3, S=3, padding=(2, 2), dilation=(1, 1), op="dgrad"),  # padding' 0
]


def rotated_kcrs(w_kcrs: torch.Tensor) -> torch.Tensor:
    """w'[c][k][r'][s'] = w[k][c][R−1−r'][S−1−s']: the rotated filter as torch's (C, K, R, S)."""
    return w_kcrs.flip(2, 3).transpose(0, 1)


@pytest.mark.parametrize("p", IDENTITY + random_identity_cases(40), ids=lambda p: p.name)
def test_unit_stride_dgrad_is_the_fprop_of_the_rotated_filter(p):
    g = torch.Generator().manual_seed(5)
    dy = torch.randn(p.N, p.K, p.P, p.Q, generator=g, dtype=torch.float64)
    w = torch.randn(p.K, p.C, p.R, p.S, generator=g, dtype=torch.float64)
    want = torch.nn.grad.conv2d_input((p.N, p.C, p.H, p.W), w, dy, padding=p.padding, dilation=p.dilation)
    fp = d18.fprop_problem(p)
    assert (fp.P, fp.Q, fp.C, fp.K, fp.stride) == (p.H, p.W, p.K, p.C, (1, 1))
    got = F.conv2d(dy, rotated_kcrs(w), padding=fp.padding, dilation=fp.dilation)
    assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    transposed = F.conv_transpose2d(dy, w, padding=p.padding, dilation=p.dilation)
    assert transposed.shape == want.shape and torch.allclose(transposed, want, rtol=1e-12, atol=1e-12)
    assert torch.allclose(reference(p, dy, w), got, rtol=1e-12, atol=1e-12)  # the harness's reference too


def test_a_filter_not_turned_around_is_caught():
    """The planted fault: the filter transposed but not flipped (or flipped on one axis only)."""
    p = IDENTITY[1]
    g = torch.Generator().manual_seed(1)
    dy, w = torch.randn(p.N, p.K, p.P, p.Q, generator=g, dtype=torch.float64), \
        torch.randn(p.K, p.C, p.R, p.S, generator=g, dtype=torch.float64)
    want = torch.nn.grad.conv2d_input((p.N, p.C, p.H, p.W), w, dy, padding=p.padding, dilation=p.dilation)
    fp = d18.fprop_problem(p)
    for bad in (w.transpose(0, 1), w.flip(2).transpose(0, 1), w.flip(3).transpose(0, 1)):
        got = F.conv2d(dy, bad, padding=fp.padding, dilation=fp.dilation)
        assert not torch.allclose(got, want)


def test_fprop_problem_and_its_refusals():
    p = dgrad(N=2, C=24, H=9, W=10, K=16, R=3, S=2, padding=(1, 0), dilation=(2, 1))
    fp = d18.fprop_problem(p)
    assert (fp.N, fp.C, fp.H, fp.W, fp.K, fp.R, fp.S) == (2, 16, p.P, p.Q, 24, 3, 2)
    assert fp.padding == (3, 1) and fp.dilation == (2, 1) and (fp.op, fp.dtype, fp.layout) == ("fprop", "fp16", "NHWC")
    assert (fp.P, fp.Q) == (p.H, p.W) and fp.y_shape == p.x_shape
    for bad in (replace(p, stride=(2, 1), padding=(5, 0), name=""), replace(p, padding=(5, 0), name="")):
        with pytest.raises(ValueError, match="no fprop equivalent"):
            d18.fprop_problem(bad)


# ---- dgrad_rotate_filter -------------------------------------------------------------------------

ROTATE_SHAPES = [(1, 1, 1, 1), (8, 3, 3, 8), (16, 3, 2, 3), (64, 1, 1, 64), (70, 2, 3, 65), (130, 3, 1, 8),
                 (8, 1, 4, 136), (72, 5, 5, 40), (24, 7, 7, 3)]  # (K, R, S, C): partial tiles of both


@pytest.mark.parametrize("K, R, S, C", ROTATE_SHAPES)
def test_rotate_model_is_flip_and_permute(K, R, S, C):
    p = dgrad(N=1, C=C, H=R + 2, W=S + 2, K=K, R=R, S=S)
    w = torch.randn(K, R, S, C, generator=torch.Generator().manual_seed(K * C), dtype=torch.float64)
    got = d18.rotate_model(p, w)
    want = w.flip(1, 2).permute(3, 1, 2, 0)  # [C][R][S][K], w'[c][r'][s'][k] = w[k][R-1-r'][S-1-s'][c]
    assert not torch.isnan(got).any(), "an element of w' no block writes"
    assert torch.equal(got, want)
    # and in torch's (C, K, R, S) view it is the filter the identity test uses
    assert torch.equal(got.permute(0, 3, 1, 2), rotated_kcrs(w.permute(0, 3, 1, 2)))


@pytest.mark.parametrize("K, R, S, C", ROTATE_SHAPES)
def test_rotate_writes_every_element_once(K, R, S, C):
    p = dgrad(N=1, C=C, H=R + 2, W=S + 2, K=K, R=R, S=S)
    launch = d18.rotate_launch(p)
    assert launch.grid == (-(-C // 64) * -(-K // 64), R, S) and launch.block == (256, 1, 1)
    counts = d18.rotate_writes(p)
    assert counts.shape == (K * R * S * C,) and (counts == 1).all()


def test_a_short_or_long_rotate_grid_is_caught():
    p = dgrad(N=1, C=70, H=5, W=5, K=130, R=3, S=3)
    launch = d18.rotate_launch(p)
    gx, gy, gz = launch.grid
    assert (d18.rotate_writes(p, replace(launch, grid=(gx - 1, gy, gz))) == 0).any()
    assert (d18.rotate_writes(p, replace(launch, grid=(gx, gy, gz - 1))) == 0).any()
    with pytest.raises(ValueError, match="writes outside w'"):
        d18.rotate_writes(p, replace(launch, grid=(gx, gy + 1, gz)))


# ---- the launches ----------------------------------------------------------------------------------

# Problems the variant takes, chosen to break it: a partial channel block of dy (K = 40), C odd and
# not a multiple of 8 (the threads store dx), non-square images and filters, both dilations, padding
# from 0 to the dilated filter's reach, several m-tiles and n-tiles (C = 136, 300), a 1x1 filter.
CLAIMED = [
    dgrad(N=2, C=24, H=9, W=10, K=16, R=3, S=3, padding=1),
    dgrad(N=3, C=5, H=11, W=9, K=40, R=3, S=2, padding=(2, 0), dilation=(1, 2)),
    dgrad(N=2, C=136, H=9, W=9, K=200, R=3, S=3, padding=1),  # day 14's "C, K past the tiles"
    dgrad(N=1, C=16, H=9, W=10, K=16, R=3, S=3, padding=2),  # padding' 0
    dgrad(N=2, C=16, H=12, W=15, K=8, R=3, S=3, padding=(1, 2), dilation=(1, 2)),  # day 14's dilation (1, 2)
    dgrad(N=2, C=33, H=15, W=12, K=24, R=3, S=2, padding=(0, 1), dilation=(2, 1)),
    dgrad(N=4, C=300, H=14, W=14, K=64, R=1, S=1),  # 1x1: one GEMM-K step of dy
    dgrad(N=2, C=72, H=17, W=13, K=136, R=5, S=4, padding=(4, 3)),  # padding = R - 1: padding' 0
    dgrad(N=1, C=3, H=17, W=15, K=8, R=5, S=5, padding=2),  # the smoke problem (C = 3)
]


@pytest.mark.parametrize("p", CLAIMED, ids=lambda p: p.name)
def test_launches_are_rotate_then_day_16s_fprop_renamed(p):
    assert V.supports(p, smem_limit=HOPPER_SMEM) is None, V.supports(p, smem_limit=HOPPER_SMEM)
    fp, plan = d18.fprop_problem(p), V.plan(p)
    assert plan.config == choose(fp) and V.workspace_bytes(p) == 2 * p.K * p.R * p.S * p.C
    rotate, main = V.launches(p)
    assert (rotate.name, rotate.entry, rotate.config) == ("rotate", "dgrad_rotate_filter", d18.rotate_launch(p))
    assert rotate.args[:2] == (Buffer("w"), Buffer("workspace"))
    assert [int(a) for a in rotate.args[2:]] == [p.K, p.C, p.R, p.S, p.R, p.S, 0, 1, 0, 1]
    assert all(type(a) is np.int32 for a in rotate.args[2:])
    (want,) = wgmma_launches(fp, PLAIN, plan.config)
    assert (main.name, main.entry, main.config) == ("fprop", want.entry, want.config)
    names = {"x": "dy", "w": "workspace", "y": "dx"}
    assert len(main.args) == len(want.args)
    for got, orig in zip(main.args, want.args):
        if isinstance(orig, TensorMap):
            assert got == TensorMap(names[orig.name], orig.desc)
        elif isinstance(orig, Buffer) and orig.name in names:
            assert got == Buffer(names[orig.name])
        elif isinstance(orig, Buffer):  # cin, bias: null pointers, the plain epilogue reads neither
            assert orig.name in ("cin", "bias") and type(got) is np.uintp and int(got) == 0
        else:
            assert type(got) is type(orig) and (got == orig if not isinstance(got, MapBytes) else got is orig)
    maps = {a.name for a in main.args if isinstance(a, TensorMap)}
    assert maps == {"dy", "workspace"} | ({"dx"} if p.C % 8 == 0 else set())
    assert {a.name for a in main.args if isinstance(a, Buffer)} == {"dx"}
    assert any(isinstance(a, MapBytes) for a in main.args) == (p.C % 8 != 0)  # dx stored by the threads


def simulate(p: Conv2dProblem, dy: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """dx from the launches' own arguments, in float64: w' by `rotate_model`, then the fprop the
    ``fprop`` launch describes (its sizes, stride, padding and dilation arguments, its maps' dims)
    over dy. NHWC dy [N][P][Q][K] and KRSC w in; dx out as logical NCHW (the reference's view)."""
    rotate, main = V.launches(p)
    assert [int(a) for a in rotate.args[2:]] == [p.K, p.C, p.R, p.S, p.R, p.S, 0, 1, 0, 1]
    wr = d18.rotate_model(p, w)  # [C][R][S][K]
    xmap, wmap = main.args[0].desc, main.args[1].desc
    M, Kp, Pp, Qp, sh, sw, ph, pw, dh, dw, S, taps, cblocks, _ = (int(a) for a in main.args[6:20])
    assert xmap.dims == (p.K, p.Q, p.P, p.N) and wmap.dims == (p.K, p.S, p.R, p.C)  # dy as x, w' as w
    assert xmap.lower == (-pw, -ph) and S == p.S and taps == p.R * p.S and cblocks == -(-p.K // 64)
    out = F.conv2d(dy.double().permute(0, 3, 1, 2), wr.permute(0, 3, 1, 2), stride=(sh, sw), padding=(ph, pw),
                   dilation=(dh, dw))
    assert out.shape == (p.N, Kp, Pp, Qp) and M == p.N * Pp * Qp
    return out


@pytest.mark.parametrize("p", CLAIMED, ids=lambda p: p.name)
def test_the_launch_arguments_compute_dx(p):
    dy, w = p.make_inputs(seed=2)
    got = simulate(p, dy, w)
    want = reference(p, dy, w).double()
    assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("p", CLAIMED, ids=lambda p: p.name)
def test_the_dy_map_walks_the_pixels_the_rotated_taps_reach(p):
    """The copy engine's im2col walk (`helpers.tma.im2col_rows`) on the launch's dy map: row m of a
    copy for dx pixel m0 + m and tap (r', s') is dy pixel (n, h − pad'_h + r'·dil_h, w − pad'_w +
    s'·dil_w), zeros outside dy: the dy pixel that tap w[k][R−1−r'][S−1−s'] pairs with dx pixel
    (n, h, w) in the dgrad sum."""
    _, main = V.launches(p)
    desc = main.args[0].desc
    (ph, pw), (dh, dw) = d18.rotated_padding(p), p.dilation
    pixels = min(desc.pixels, 64)
    walk = replace(desc, pixels=pixels)
    for m0 in range(0, p.N * p.H * p.W, 61):  # starts of copies spread over the images
        n0, rest = divmod(m0, p.H * p.W)
        h0, w0 = divmod(rest, p.W)
        for r in range(p.R):
            for s in range(p.S):
                rows = tma.im2col_rows(walk, (w0 - pw, h0 - ph, n0), (s * dw, r * dh))
                for i, got in enumerate(rows):
                    m = m0 + i
                    n, rest = divmod(m, p.H * p.W)
                    h, wq = divmod(rest, p.W)
                    # the dgrad sum: dx[h] takes dy[h + pad - r_orig dil] with r_orig = R - 1 - r
                    yy, xx = h + p.padding[0] - (p.R - 1 - r) * dh, wq + p.padding[1] - (p.S - 1 - s) * dw
                    want = (n, yy, xx) if n < p.N and 0 <= yy < p.P and 0 <= xx < p.Q else None
                    assert got == want, (p.name, m, r, s, got, want)


@pytest.mark.parametrize("p", CLAIMED, ids=lambda p: p.name)
def test_every_dx_element_written_once(p):
    counts = V.covers(p)
    assert counts.shape == (p.x_numel,) and (counts == 1).all()


@pytest.mark.parametrize("config", [c for c in ENTRIES if c.mode in PERSISTENT_MODES], ids=lambda c: c.name)
def test_forced_configurations_on_a_capped_grid_cover_dx_once(config):
    """Each of day 16's looping schedules forced, its grid cut to one block (a pair for the
    clusters): every block walks several tiles of dx, still each element once; the cut shows."""
    p = dgrad(N=2, C=300, H=17, W=18, K=72, R=3, S=3, padding=1)  # 612 x 300: several tiles on both axes
    v = d18.make_dgrad_wgmma(f"dgrad_wgmma[{config.name}]", config)
    assert v.supports(p, smem_limit=HOPPER_SMEM) is None and v.plan(p).config == config
    launch = v.launch(p)
    units = 2 if config.mode in ("cluster", "cluster_a") else 1
    capped = replace(launch, grid=(units, 1, 1))
    assert (v.plan(p).covers(capped) == 1).all()
    assert launch.grid[0] > units  # the cut is a real one


def test_every_configuration_is_offered_forced():
    forced = V.configs_fn()
    assert [c.name for c in forced] == [f"dgrad_wgmma[{c.name}]" for c in ENTRIES]
    assert all(c.configs_fn is None and c.op == "dgrad" for c in forced)
    with pytest.raises(ValueError, match="no entry"):
        d18.make_dgrad_wgmma("x", "persistent_1x1_c1_s1")


def test_build_target_is_sm90a_only():
    assert V.build_reason((9, 0)) is None and V.target((9, 0)) == "sm_90a"
    assert "9.0 or newer" in V.build_reason((8, 9)) and "only on compute capability 9.0" in V.build_reason((10, 0))


# ---- refusals ---------------------------------------------------------------------------------------

BASE = dict(N=2, C=24, H=9, W=10, K=16, R=3, S=3, padding=1)
REFUSED = [
    (dict(R=2, S=2, stride=3), "dgrad_wgmma: phase (0, 2) would need padding (0, -1) (a crop)"),
    (dict(stride=9), "stride (9, 9): the scatter kernel walks at most 8 phases per axis"),
    (dict(C=16, groups=2), "groups = 1; got 2"),
    (dict(padding=(3, 1)), "padding (3, 1) reaches past the dilated filter (dil_h (R-1), dil_w (S-1)) = (2, 2)"),
    (dict(padding=(1, 3)), "would need padding (1, -1)"),
    (dict(K=12), "K = 12: dy's pixels"),
    (dict(K=3), "K = 3"),
    (dict(N=1, C=8, H=210, W=8, K=8, R=3, S=1, padding=0, dilation=(100, 1)),
     "dy's tensor map (the fprop's x): the bounding box's lower corner"),
    (dict(N=1, C=8, H=300, W=8, K=8, R=3, S=1, padding=0, dilation=(128, 1)), "filter offset is 8 bits"),
]


@pytest.mark.parametrize("change, words", REFUSED, ids=[w[:40] for _, w in REFUSED])
def test_refusals_name_the_value(change, words):
    assert V.supports(dgrad(**BASE), smem_limit=HOPPER_SMEM) is None
    reason = V.supports(dgrad(**{**BASE, **change}), smem_limit=HOPPER_SMEM)
    assert reason is not None and words in reason and reason.startswith("dgrad_wgmma: "), reason


def test_day_16s_refusals_are_reworded_and_prefixed():
    p = dgrad(**{**BASE, "N": 1, "C": 8, "H": 210, "W": 8, "K": 8, "R": 3, "S": 1, "padding": 0,
                 "dilation": (100, 1)})
    reason = V.supports(p, smem_limit=HOPPER_SMEM)
    assert "day 16's fprop over dy (C' = K = 8, K' = C = 8, padding' (200, 0)) refuses it" in reason
    assert "x tensor map" not in reason and "day 13" not in reason
    assert d18.reworded("w tensor map: box; y tensor map: strides; day 13's kernel takes any C") == (
        "the rotated filter's tensor map (the fprop's w): box; dx's tensor map (the fprop's y): strides; day 14's "
        "dgrad takes any C")


def test_other_operations_dtypes_and_layouts_are_refused():
    assert "computes dgrad" in V.supports(replace(dgrad(**BASE), op="fprop", name=""))
    assert "takes dtype fp16/bf16" in V.supports(replace(dgrad(**BASE), dtype="fp32", name=""))
    assert "takes layout NHWC" in V.supports(replace(dgrad(**BASE), layout="NCHW", name=""))
    assert V.supports(replace(dgrad(**BASE), dtype="bf16", name=""), smem_limit=HOPPER_SMEM) is None


def test_a_fused_epilogue_is_refused():
    p = dgrad(**BASE)
    dy, w = p.make_inputs()
    with pytest.raises(ValueError, match="dgrad_wgmma fuses no epilogue"):
        prepare(V, p, dy, w, epilogue=Epilogue(relu=True))
    with pytest.raises(ValueError, match="fuses no epilogue"):
        d18.dgrad_launches(p, Epilogue(alpha=2.0), V.plan(p).config)


@pytest.mark.parametrize("C, refused", [(24, {"dy", "dx", "w"}), (5, {"dy"})])
def test_misaligned_tensors_are_refused_where_a_kernel_needs_them_aligned(C, refused, misaligned):
    """dy always (its im2col map); dx and w when C % 8 == 0 (dx's tiled map for the TMA stores, the
    rotate kernel's 16-byte loads of w); with C % 8 != 0 the threads store dx and the rotate kernel
    reads w element by element, so those may be 2 bytes off."""
    p = dgrad(**{**BASE, "C": C})
    plan = V.plan(p)
    tensors = {n: torch.zeros(p.tensor_shape(n), dtype=p.torch_dtype) for n in ("dy", "w", "dx")}
    assert plan.tensor_reason(tensors) is None
    for name in ("dy", "dx", "w"):
        reason = plan.tensor_reason({**tensors, name: misaligned(tensors[name])})
        assert (reason is not None) == (name in refused), (name, reason)
        if reason:
            assert f"{name}.data_ptr() is not 16-byte aligned" in reason


def test_a_refused_problem_has_no_launches():
    p = dgrad(**{**BASE, "stride": 9})
    plan = V.plan(p)
    assert plan.config is None and plan.reason
    with pytest.raises(ValueError, match="no configuration: stride"):
        _ = plan.launches
    with pytest.raises(UnsupportedProblem, match="at most 8 phases"):
        prepare(V, p, *p.make_inputs())


# ---- the build ---------------------------------------------------------------------------------------


def recording_load_kernel(built: list):
    """A stand-in for `helpers.compile.load_kernel` that records (file, entry, defines, arch) per build."""

    def load_kernel(cu_file, entry, defines=None, dynamic_smem=0, arch=None, params=0):
        built.append((cu_file, entry, dict(defines or {}), arch))
        return hc.CompiledKernel(function=lambda *a, **kw: None, num_regs=32, shared_static_bytes=0, local_bytes=0,
                                 max_threads_per_block=1024, param_offsets=(0,) * params if params else None)

    return load_kernel


@pytest.mark.parametrize("p", [CLAIMED[0], CLAIMED[1], CLAIMED[6]], ids=lambda p: p.name)
def test_each_launch_is_built_from_its_own_file(p, monkeypatch):
    """``rotate`` from the variant's file, ``fprop`` from day 16's (the launch names it): with the
    same defines and target as day 16's own launch of that entry, so both days share one module."""
    built = []
    monkeypatch.setattr(hc, "load_kernel", recording_load_kernel(built))
    plan = V.plan(p)
    rotate, main = plan.launches
    assert V.cu_file == d18.CU_FILE == "18_dgrad_wgmma.cu" and rotate.cu_file is None
    assert main.cu_file == d18.FPROP_CU_FILE == get("igemm_wgmma").cu_file == "16_igemm_wgmma.cu"
    assert plan.sources == ("18_dgrad_wgmma.cu", "16_igemm_wgmma.cu")
    compile_launches(V, list(plan.launches), "sm_90a")
    assert built == [("18_dgrad_wgmma.cu", "dgrad_rotate_filter", {}, "sm_90a"),
                     ("16_igemm_wgmma.cu", main.entry, {}, "sm_90a")]
    v16 = get("igemm_wgmma")
    (k16,) = v16.launches(d18.fprop_problem(p))
    assert k16.cu_file is None and k16.entry == main.entry
    assert hc._module_key(main.source(V), main.build_defines(V), V.target((9, 0))) == \
        hc._module_key(k16.source(v16), k16.build_defines(v16), v16.target((9, 0)))  # day 16's module, shared


def test_the_plans_kernels_are_built_again_when_either_file_changes(monkeypatch):
    """`helpers.launch.compiled` keys a plan's kernels on the source hash of every file its launches
    use: a change to the rotate kernel's file or to day 16's builds both launches again (the key
    named only the variant's file, so an edit to day 16's kernel would have run the stale build)."""
    built, hashes = [], {"18_dgrad_wgmma.cu": "rotate v1", "16_igemm_wgmma.cu": "fprop v1"}
    monkeypatch.setattr(hc, "load_kernel", recording_load_kernel(built))
    monkeypatch.setattr(hc, "source_hash", lambda cu_file: hashes[cu_file])  # any other file: a KeyError
    plan = V.plan(CLAIMED[0])
    assert sources_key(plan) == ("rotate v1", "fprop v1")
    compiled(plan, "cpu", "sm_90a")
    assert [b[0] for b in built] == ["18_dgrad_wgmma.cu", "16_igemm_wgmma.cu"]
    compiled(plan, "cpu", "sm_90a")
    assert len(built) == 2  # kept in the plan
    for cu_file, edit in (("18_dgrad_wgmma.cu", "rotate v2"), ("16_igemm_wgmma.cu", "fprop v2")):
        before = len(built)
        hashes[cu_file] = edit
        compiled(plan, "cpu", "sm_90a")
        assert [b[0] for b in built[before:]] == ["18_dgrad_wgmma.cu", "16_igemm_wgmma.cu"], cu_file
    assert len(plan.compiled) == 3
    hashes.update({"18_dgrad_wgmma.cu": "rotate v1", "16_igemm_wgmma.cu": "fprop v1"})
    compiled(plan, "cpu", "sm_90a")
    assert len(built) == 6 and len(plan.compiled) == 3  # the first sources again: the first build


@pytest.mark.nvcc
def test_the_rotate_kernel_alone_builds_for_sm90a_without_spills():
    """18_dgrad_wgmma.cu holds the rotate and scatter kernels and nothing of day 16's; the fprop
    entry the variant launches is in day 16's own build."""
    reports = {r.entry: r for r in hc.nvcc_compile(d18.CU_FILE, arch="sm_90a")[0]}
    assert set(reports) == {"dgrad_rotate_filter", "dgrad_scatter_strided"}
    for r in reports.values():
        assert r.arch == "sm_90a" and (r.spill_stores, r.spill_loads, r.stack_bytes) == (0, 0, 0)
        assert r.registers <= 64
    assert reports["dgrad_rotate_filter"].shared_bytes == 64 * 66 * 2
    assert reports["dgrad_scatter_strided"].shared_bytes == 8 * (4 + 4 + 8)  # col_extent, col_hit, col_offset
    day16 = {r.entry for r in hc.nvcc_compile(d18.FPROP_CU_FILE, arch="sm_90a")[0]}
    assert choose(d18.fprop_problem(CLAIMED[2])).entry("fp16") in day16


# ---- strided layers: one fprop per phase, then the scatter -------------------------------------------

STRIDED = [
    dgrad(N=4, C=64, H=28, W=28, K=128, R=1, S=1, stride=2),  # a ResNet-50 downsample, small
    dgrad(N=2, C=16, H=10, W=9, K=24, R=1, S=1, stride=3),  # stride 3 > the filter: tapless phases
    dgrad(N=2, C=16, H=14, W=12, K=24, R=3, S=3, stride=2, padding=1),  # ResNet's strided 3 x 3, even
    dgrad(N=3, C=16, H=13, W=11, K=8, R=3, S=3, stride=2, padding=1),  # odd sizes
    dgrad(N=2, C=8, H=32, W=30, K=64, R=7, S=7, stride=2, padding=3),  # the stem
    dgrad(N=2, C=8, H=15, W=12, K=24, R=3, S=2, stride=(2, 1), padding=1, dilation=(2, 1)),
    dgrad(N=2, C=8, H=10, W=11, K=8, R=4, S=2, stride=(1, 2), padding=(1, 0)),  # an even filter
    dgrad(N=2, C=5, H=13, W=7, K=40, R=3, S=3, stride=2, padding=1),  # C odd: the threads store
]


def simulate_phases(p: Conv2dProblem, dy: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """dx from the strided plan's own launch arguments, in float64: per phase, the rotated filter
    by `rotate_model` on the rotate launch's taps, the fprop its launch describes (dy as its map
    holds it, the lower padding, the phase's extent as P x Q, the dilation), its output placed at
    the launch's workspace offset; then `scatter_model`. Logical NCHW out."""
    launches, base = V.launches(p), d18.compact_offset(p)
    ys = torch.full((p.N * p.H * p.W * p.C,), float("nan"), dtype=torch.float64)
    for rot, fp in zip(launches[0:-1:2], launches[1:-1:2]):
        K, C, R, S, T, U, rb, rs, sb, ss = (int(a) for a in rot.args[2:])
        assert (K, C, R, S) == (p.K, p.C, p.R, p.S) and rot.name == "rotate" + fp.name.removeprefix("fprop")
        wr = d18.rotate_model(p, w, d18.Taps(T, U, rb, rs, sb, ss))
        xmap = fp.args[0].desc
        M, Kp, Pp, Qp, sh, sw, ph, pw, dh, dw, S2, taps, _, _ = (int(a) for a in fp.args[6:20])
        assert xmap.dims == (p.K, p.Q, p.P, p.N) and xmap.lower == (-pw, -ph) and (sh, sw) == (1, 1)
        assert xmap.upper == (Qp - 1 - pw - (p.Q - 1), Pp - 1 - ph - (p.P - 1)) and (S2, taps) == (U, T * U)
        x = dy.double().permute(0, 3, 1, 2)
        bottom, right = max(0, Pp + dh * (T - 1) - p.P), max(0, Qp + dw * (U - 1) - p.Q)
        out = F.conv2d(F.pad(x, (pw, right, ph, bottom)), wr.permute(0, 3, 1, 2), dilation=(dh, dw))[:, :, :Pp, :Qp]
        (y,) = [a for a in fp.args if isinstance(a, Buffer) and a.name == "workspace"]
        start = (y.offset - base) // p.itemsize
        ys[start:start + out.numel()] = out.permute(0, 2, 3, 1).reshape(-1)
    scatter = launches[-1]
    assert scatter.args[:2] == (Buffer("workspace", base), Buffer("dx"))
    assert [int(a) for a in scatter.args[2:]] == [p.N, p.H, p.W, p.C, *p.stride, *p.padding, *p.dilation, p.R, p.S]
    return d18.scatter_model(p, ys).permute(0, 3, 1, 2)


@pytest.mark.parametrize("p", STRIDED, ids=lambda p: p.name)
def test_a_strided_dgrad_is_its_phases_fprops_scattered(p):
    """The launches' arguments give dx (the harness's float64 reference, torch's conv2d_input) on
    strided problems: 1 x 1, 3 x 3, the 7 x 7 stem, stride 3 (phases with no tap: zeros), an even
    filter, dilation, stride (2, 1) and (1, 2), odd sizes; the scatter writes every dx element once."""
    assert V.supports(p, smem_limit=HOPPER_SMEM) is None, V.supports(p, smem_limit=HOPPER_SMEM)
    dy, w = p.make_inputs(seed=2)
    got, want = simulate_phases(p, dy, w), reference(p, dy, w).double()
    assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-9, atol=1e-9)
    assert (V.plan(p).covers() == 1).all() and V.covers(p).shape == (p.x_numel,)


def test_a_phase_filter_not_turned_around_is_caught(monkeypatch):
    """The planted fault: each phase's taps kept in w's order (not turned around)."""
    p = STRIDED[2]
    dy, w = p.make_inputs(seed=3)
    real = d18.rotate_model
    monkeypatch.setattr(d18, "rotate_model", lambda q, w_, taps=None: real(q, w_, taps).flip(1, 2))
    assert not torch.allclose(simulate_phases(p, dy, w), reference(p, dy, w).double())


@pytest.mark.parametrize("size, stride, pad, dil, taps, want", [
    (14, 2, 1, 1, 3, [(0, 7, (1,), 0, 1), (1, 7, (0, 2), 0, 1)]),  # ResNet's 3 x 3 stride 2
    (10, 3, 0, 1, 1, [(0, 4, (0,), 0, 1), (1, 3, (), 0, 1), (2, 3, (), 0, 1)]),  # 1 x 1 stride 3
    (32, 2, 3, 1, 7, [(0, 16, (1, 3, 5), 1, 1), (1, 16, (0, 2, 4, 6), 1, 1)]),  # the stem
    (15, 2, 1, 2, 3, [(0, 8, (), 0, 1), (1, 7, (0, 1, 2), 1, 1)]),  # dilation 2: every tap in one phase
])
def test_axis_phases(size, stride, pad, dil, taps, want):
    got = [(a.a, a.extent, a.taps, a.pad, a.dil) for a in d18.axis_phases(size, stride, pad, dil, taps)]
    assert got == want


@pytest.mark.parametrize("K, C, taps", [(8, 3, d18.Taps(2, 1, 0, 2, 1, 1)), (70, 65, d18.Taps(3, 2, 1, 2, 0, 3))])
def test_rotate_model_of_a_phase_is_its_taps_turned_around(K, C, taps):
    p = dgrad(N=1, C=C, H=12, W=12, K=K, R=7, S=7, stride=2, padding=3)
    w = torch.randn(K, 7, 7, C, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = d18.rotate_model(p, w, taps)
    rs = [taps.rb + j * taps.rstep for j in range(taps.T)][::-1]
    ss = [taps.sb + i * taps.sstep for i in range(taps.U)][::-1]
    assert torch.equal(got, w[:, rs][:, :, ss].permute(3, 1, 2, 0))
    assert (d18.rotate_writes(p, taps=taps) == 1).all()


@pytest.mark.parametrize("grid", [1, 3, 1000])
def test_the_scatter_grid_stride_loop_writes_every_element_once(grid):
    p = STRIDED[-1]
    launch = replace(d18.scatter_launch(p), grid=(grid, 1, 1))
    assert (d18.scatter_writes(p, launch) == 1).all()
    assert d18.scatter_launch(STRIDED[0]).grid[0] == 4 * 28  # one block per dx row (n, h)
    assert d18.scatter_launch(dgrad(N=256, C=256, H=56, W=56, K=128, R=1, S=1, stride=2)).grid[0] == 8 * 132


@pytest.mark.parametrize("d", [1, 2, 3, 7, 8, 24, 32, 64, 100, 256, 2**16 + 1, 2**30 + 1, 2**31 - 1])
def test_the_scatters_division_by_multiplication_is_exact(d):
    """`Divisor` (the scatter kernel's n / d) against //, for small n, n near 2^31 and random n."""
    rng = np.random.default_rng(d)
    n = np.concatenate([np.arange(1 << 14), 2**31 - 1 - np.arange(1 << 10), rng.integers(0, 2**31, 1 << 14)])
    assert (d18.Divisor(d).div(n) == n // d).all()


def test_a_planted_divisor_fault_is_caught():
    """The check above can fail: the multiplier one less is wrong for some n."""
    class Off(d18.Divisor):
        @property
        def multiplier(self):
            return super().multiplier - 1
    n = np.arange(1 << 16)
    assert not (Off(7).div(n) == n // 7).all()


def test_a_dx_that_no_dy_pixel_reaches_is_refused_not_crashed():
    """Stride 2, padding 1, a 1 x 1 filter and one input row: no phase has both a tap and pixels, so
    dx is all zeros; refused with that reason (day 14's dgrad writes it), where `fprop_problem` used
    to fail on an empty max."""
    p = dgrad(N=1, C=8, H=1, W=8, K=8, R=1, S=1, stride=2, padding=1)
    assert not any(map(d18.active, d18.phases(p)))
    assert "no dy pixel reaches any dx pixel" in V.supports(p)


def test_the_divisor_and_the_scatter_model_keep_the_kernels_ranges():
    with pytest.raises(ValueError, match="1 <= d < 2"):
        d18.Divisor(0)
    with pytest.raises(ValueError, match="0 <= n < 2"):
        d18.Divisor(3).div(2**32 - 1)  # the kernel's 32-bit sum would overflow: its answer differs from //
    with pytest.raises(ValueError, match="0 <= n < 2"):
        d18.Divisor(3).div(-1)
    assert d18.Divisor(3).div(np.array([2**31 - 1], dtype=np.int32))[0] == (2**31 - 1) // 3  # no int32 overflow
    p = STRIDED[0]
    with pytest.raises(ValueError, match="steps by SCATTER_THREADS"):
        d18.scatter_writes(p, replace(d18.scatter_launch(p), block=(128, 1, 1)))
