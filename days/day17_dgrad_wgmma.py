"""Day 17's variant: unit-stride dgrad on day 16's Hopper kernel (``kernels/conv2d/17_dgrad_wgmma.cu``
holds day 17's own kernel, the filter's rotation; day 16's is built from day 16's file).

With stride 1, dgrad is an fprop: dx[n, h, w, c] = Σ_{k, r, s} dy[n, h + pad_h − r·dil_h,
w + pad_w − s·dil_w, k] · w[k, r, s, c] is the fprop over dy (K input channels, a P x Q image)
with the filter turned 180° and its roles swapped, w'[c, r', s', k] = w[k, R−1−r', S−1−s', c]
(C filters of R x S taps over K channels, KRSC like every filter of the series), stride 1, the same
dilation and padding' = (dil_h·(R−1) − pad_h, dil_w·(S−1) − pad_w), whose output is H x W
(`fprop_problem`; tests/test_dgrad_wgmma.py proves the identity in float64 against torch).

A run is two launches, and day 16's kernel is not changed:

* ``rotate``: ``dgrad_rotate_filter`` writes w' into the workspace (`rotate_launch`; its writes:
  `rotate_writes`, its arithmetic: `rotate_model`), built from the variant's file, ``CU_FILE``;
* ``fprop``: day 16's entry for `choose` on `fprop_problem`, with day 16's own maps and launch
  (`days.day16_igemm_wgmma.wgmma_launches`), its tensors renamed (`dgrad_names`): x is dy, w is
  the workspace (w'), y is dx; no Cin or bias (null pointers). The launch names day 16's file
  (``FPROP_CU_FILE``, `helpers.variants.KernelLaunch.cu_file`): the harness builds it from there,
  as day 16 does, for the same ``sm_90a``.

A strided 1 x 1 layer (stride (sh, sw), any padding) is a GEMM whose output lands on every sh-th
row and sw-th column of dx: ``rotate`` (a transpose, for R = S = 1), ``fprop``, day 16's 1 x 1
fprop over dy storing the compact y [N][P][Q][C] into the workspace (`compact_offset`), then
``scatter`` (``dgrad_scatter_strided``, this file) writes all of dx in one pass, y's pixels where
sh divides h + ph and sw divides w + pw, zeros elsewhere (`scatter_model`, `scatter_writes`).

Refused, with the reason: stride other than 1 with a filter other than 1 x 1 (day 14's ``dgrad``
runs strided layers), groups,
padding past the dilated filter (padding' < 0, a crop), K % 8 != 0 (dy's pixels are the fprop's
input rows, which the copy engine reads in 16-byte strides), and whatever day 16 refuses for the
equivalent fprop (`dgrad_reason`, its reasons in dgrad's terms). A fused epilogue is refused (the
variant fuses none): dgrad's bias or residual would be day 16's, but nothing here needs it yet.

`make_dgrad_wgmma` builds the variant with a configuration forced (each of day 16's entries);
the registered ``dgrad_wgmma`` takes day 16's rule (`choose_config`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from helpers.epilogue import PLAIN, Epilogue
from helpers.problem import Conv2dProblem
from helpers.tma import TensorMap
from helpers.variants import INT32_MAX, Buffer, KernelLaunch, LaunchConfig, Variant, register

from .day16_igemm_wgmma import BY_NAME, ENTRIES, HOPPER_CC, WgmmaConfig, choose, covers, problem_reason, wgmma_launches
from .day16_igemm_wgmma import CU_FILE as FPROP_CU_FILE
from .kit import VEC_BYTES, alignment_reason, cdiv

CU_FILE = "17_dgrad_wgmma.cu"  # rotate and scatter; the fprop launch is built from FPROP_CU_FILE (day 16's)
ROTATE_ENTRY = "dgrad_rotate_filter"
ROTATE_TILE = 64  # filters x channels of one block of dgrad_rotate_filter, per tap
ROTATE_THREADS = 256
SCATTER_ENTRY = "dgrad_scatter_strided"
SCATTER_THREADS = 256
SCATTER_BLOCKS_PER_SM = 8  # the grid-stride loop's grid: 8 blocks of 256 threads per SM (all resident)
SCATTER_SMS = 132  # the grid assumes the H100's / H200's SM count; any count is correct, only the pace changes
WORKSPACE_ALIGN = 128  # the compact y starts this many bytes aligned past w' (its tiled map needs 16)
NULL = np.uintp(0)  # a pointer argument the kernel does not read (no Cin, no bias)
# Day 16's tensor names -> this run's: the fprop reads dy as x and w' (the workspace) as w, and stores dx as y.
DGRAD_NAMES = {"x": "dy", "w": "workspace", "y": "dx"}
# Words of day 16's reasons -> dgrad's: the maps and sizes of the fprop it runs.
REWORDED = (
    ("x tensor map", "dy's tensor map (the fprop's x)"),
    ("w tensor map", "the rotated filter's tensor map (the fprop's w)"),
    ("y tensor map", "dx's tensor map (the fprop's y)"),
    ("day 13's kernel", "day 14's dgrad"),
)


def rotated_padding(p: Conv2dProblem) -> tuple[int, int]:
    """padding' of the fprop over dy: (dil_h·(R−1) − pad_h, dil_w·(S−1) − pad_w), negative where
    the padding reaches past the dilated filter."""
    (ph, pw), (dh, dw) = p.padding, p.dilation
    return dh * (p.R - 1) - ph, dw * (p.S - 1) - pw


def strided_1x1(p: Conv2dProblem) -> bool:
    """A 1 x 1 filter with a stride other than 1: dx is a GEMM's output scattered (`scatter_model`)."""
    return p.R == p.S == 1 and p.stride != (1, 1)


def shape_reason(p: Conv2dProblem) -> str | None:
    """None if ``p`` is a dgrad that `fprop_problem` turns into an fprop, else why not: groups,
    stride other than 1 with a filter other than 1 x 1, padding' < 0 (stride 1)."""
    if p.groups != 1:
        return f"needs groups = 1; got {p.groups}"
    if strided_1x1(p):
        return None
    if p.stride != (1, 1):
        return (f"handles stride 1, and strided 1 x 1 filters, only; got stride {p.stride} with a {p.R} x {p.S} "
                "filter: day 14's dgrad runs strided layers")
    pad = rotated_padding(p)
    if min(pad) < 0:
        reach = (p.dilation[0] * (p.R - 1), p.dilation[1] * (p.S - 1))
        return (f"padding {p.padding} reaches past the dilated filter (dil_h (R-1), dil_w (S-1)) = {reach}: the "
                f"rotated filter's fprop would need padding {pad} (a crop), which day 16's fprop does not take; "
                "day 14's dgrad runs it")
    return None


def fprop_problem(p: Conv2dProblem) -> Conv2dProblem:
    """The fprop whose output is ``p``'s dx: over dy (N images of P x Q pixels, C' = K channels),
    K' = C filters of R x S (the rotated filter), stride 1, padding' (`rotated_padding`), the same
    dilation; its P' x Q' is H x W. A strided 1 x 1 layer (`strided_1x1`): the 1 x 1 fprop over dy
    with the filter transposed, padding 0, whose P x Q output is dx's compact part (`scatter_model`
    spreads it over dx).

    Raises:
        ValueError: a problem `shape_reason` refuses (the message is the reason).
    """
    reason = shape_reason(p)
    if reason:
        raise ValueError(f"no fprop equivalent: {reason}")
    if strided_1x1(p):
        return Conv2dProblem(N=p.N, C=p.K, H=p.P, W=p.Q, K=p.C, R=1, S=1, dtype=p.dtype, layout=p.layout)
    return Conv2dProblem(N=p.N, C=p.K, H=p.P, W=p.Q, K=p.C, R=p.R, S=p.S, padding=rotated_padding(p),
                         dilation=p.dilation, dtype=p.dtype, layout=p.layout)


def choose_config(p: Conv2dProblem) -> WgmmaConfig | None:
    """Day 16's rule (`choose`) on `fprop_problem`; None where there is none (`shape_reason`)."""
    return None if shape_reason(p) else choose(fprop_problem(p))


def reworded(reason: str) -> str:
    """Day 16's reason for the equivalent fprop with its tensors named as dgrad's (`REWORDED`)."""
    for old, new in REWORDED:
        reason = reason.replace(old, new)
    return reason


def dgrad_reason(p: Conv2dProblem, cfg: WgmmaConfig | None) -> str | None:
    """None if the variant runs ``p`` with ``cfg`` (day 16's configuration of the equivalent
    fprop), else why not: `shape_reason`; K % 8 (dy's pixels are the copy engine's 16-byte
    strides); the rotate kernel's int channel tiles; day 16's `problem_reason` for
    `fprop_problem`, in dgrad's terms."""
    reason = shape_reason(p)
    if reason:
        return reason
    if p.K % 8:
        return (f"K = {p.K}: dy's pixels are the fprop's input rows, which the copy engine reads in 16-byte "
                "strides (K % 8 == 0); day 14's dgrad takes any K")
    if max(p.C, p.K) + ROTATE_TILE > INT32_MAX:
        return f"C = {p.C} or K = {p.K} plus a 64-wide tile does not fit the rotate kernel's int indices"
    if strided_1x1(p) and max(p.H + 2 * p.padding[0], p.W + 2 * p.padding[1]) > INT32_MAX:
        return f"H, W = {p.H}, {p.W} plus twice the padding do not fit the scatter kernel's int indices"
    fp = fprop_problem(p)
    if cfg is None:
        return "no day-16 configuration for the equivalent fprop"
    why = problem_reason(fp, cfg)
    if why:
        return f"day 16's fprop over dy (C' = K = {p.K}, K' = C = {p.C}, padding' {fp.padding}) refuses it: " \
               f"{reworded(why)}"
    return None


def rotate_launch(p: Conv2dProblem) -> LaunchConfig:
    """``dgrad_rotate_filter``: grid (ceil(C / 64)·ceil(K / 64), R, S) (block x: the c-tile
    x % ceil(C / 64), the k-tile x / ceil(C / 64); y, z: the tap (r', s') of w'), 256 threads."""
    tiles = cdiv(p.C, ROTATE_TILE) * cdiv(p.K, ROTATE_TILE)
    return LaunchConfig(grid=(tiles, p.R, p.S), block=(ROTATE_THREADS, 1, 1))


def dgrad_names(args: tuple) -> tuple:
    """Day 16's launch arguments with its tensors renamed for dgrad (`DGRAD_NAMES`: dy, the
    workspace, dx), and its Cin and bias pointers null (the plain epilogue reads neither)."""
    out = []
    for a in args:
        if isinstance(a, TensorMap):
            a = replace(a, name=DGRAD_NAMES[a.name])
        elif isinstance(a, Buffer):
            a = replace(a, name=DGRAD_NAMES[a.name]) if a.name in DGRAD_NAMES else NULL
        out.append(a)
    return tuple(out)


def compact_offset(p: Conv2dProblem) -> int:
    """Byte offset of the compact y (a strided 1 x 1 layer's GEMM output) in the workspace: past
    w', rounded up to ``WORKSPACE_ALIGN``."""
    return cdiv(p.K * p.R * p.S * p.C * p.itemsize, WORKSPACE_ALIGN) * WORKSPACE_ALIGN


def compact_names(args: tuple, offset: int) -> tuple:
    """`dgrad_names` of day 16's arguments, but y (its map and pointer) is the workspace at
    ``offset``: a strided 1 x 1 layer's GEMM stores its compact P x Q output there."""
    out = []
    for a, renamed in zip(args, dgrad_names(args)):
        if isinstance(a, (TensorMap, Buffer)) and a.name == "y":
            renamed = replace(a, name="workspace", offset=offset)
        out.append(renamed)
    return tuple(out)


def scatter_launch(p: Conv2dProblem) -> LaunchConfig:
    """``dgrad_scatter_strided``: a grid-stride loop over N·H·W·ceil(C / 8) vectors of 8 channels,
    256 threads a block, at most ``SCATTER_BLOCKS_PER_SM`` x ``SCATTER_SMS`` blocks."""
    vectors = p.N * p.H * p.W * cdiv(p.C, 8)
    blocks = max(1, min(cdiv(vectors, SCATTER_THREADS), SCATTER_BLOCKS_PER_SM * SCATTER_SMS))
    return LaunchConfig(grid=(blocks, 1, 1), block=(SCATTER_THREADS, 1, 1))


def dgrad_launches(p: Conv2dProblem, epilogue: Epilogue, cfg: WgmmaConfig | None) -> list[KernelLaunch]:
    """``rotate`` (``dgrad_rotate_filter`` on w -> workspace, with K, C, R, S; from ``CU_FILE``),
    then ``fprop``: day 16's launch of ``cfg`` on `fprop_problem`, its tensors renamed
    (`dgrad_names`), built from day 16's file (``FPROP_CU_FILE``). A strided 1 x 1 layer: the
    ``fprop`` stores the compact y in the workspace (`compact_names`, at `compact_offset`), and
    ``scatter`` (``dgrad_scatter_strided``, from ``CU_FILE``: y, dx, N, H, W, C, P, Q, the
    strides and paddings) writes every element of dx.

    Raises:
        ValueError: a fused epilogue (the variant fuses none), or a problem without an fprop
            equivalent or configuration (`dgrad_reason` says why).
    """
    if not epilogue.is_plain:
        raise ValueError(f"dgrad_wgmma fuses no epilogue: it computes the plain dgrad; got {epilogue}")
    if cfg is None:
        raise ValueError(f"no configuration: {shape_reason(p) or 'none given'}")
    fp = fprop_problem(p)
    rotate = KernelLaunch("rotate", ROTATE_ENTRY, rotate_launch(p),
                          (Buffer("w"), Buffer("workspace"), *(np.int32(v) for v in (p.K, p.C, p.R, p.S))))
    (main,) = wgmma_launches(fp, PLAIN, cfg)
    if not strided_1x1(p):
        return [rotate, replace(main, name="fprop", args=dgrad_names(main.args), cu_file=FPROP_CU_FILE)]
    off = compact_offset(p)
    ints = (p.N, p.H, p.W, p.C, p.P, p.Q, *p.stride, *p.padding)
    scatter = KernelLaunch("scatter", SCATTER_ENTRY, scatter_launch(p),
                           (Buffer("workspace", off), Buffer("dx"), *(np.int32(v) for v in ints)))
    return [rotate, replace(main, name="fprop", args=compact_names(main.args, off), cu_file=FPROP_CU_FILE), scatter]


def dgrad_covers(p: Conv2dProblem, launch: LaunchConfig, cfg: WgmmaConfig) -> np.ndarray:
    """Writes per dx element (NHWC, flat) of the last launch: the ``fprop``'s, day 16's model
    (`covers`) of the equivalent fprop, whose y [N][H][W][C] is dx element for element; a strided
    1 x 1 layer's ``scatter`` (`scatter_writes`)."""
    if strided_1x1(p):
        return scatter_writes(p, launch)
    return covers(fprop_problem(p), launch, cfg)


def scatter_writes(p: Conv2dProblem, launch: LaunchConfig | None = None) -> np.ndarray:
    """Writes per dx element (NHWC, flat) by ``dgrad_scatter_strided`` on ``launch`` (default
    `scatter_launch`): thread t of G = grid·block takes vectors t, t + G, ... below
    N·H·W·ceil(C / 8); vector i writes channels 8 (i mod ceil(C / 8)) .. + 7 (< C) of pixel
    i div ceil(C / 8)."""
    launch = launch or scatter_launch(p)
    cvec, threads = cdiv(p.C, 8), launch.grid[0] * launch.block[0]
    vectors = p.N * p.H * p.W * cvec
    counts = np.zeros(p.N * p.H * p.W * p.C, dtype=np.int64)
    i = np.arange(vectors)
    i = i[(i % threads) < min(threads, vectors)]  # thread i mod G takes vector i in its loop
    for e in range(8):
        c = (i % cvec) * 8 + e
        ok = c < p.C
        np.add.at(counts, (i[ok] // cvec) * p.C + c[ok], 1)
    return counts


def scatter_model(p: Conv2dProblem, y: torch.Tensor) -> torch.Tensor:
    """dx as ``dgrad_scatter_strided`` computes it from the compact y [N][P][Q][C], by its index
    arithmetic: pixel (h, w) takes y[(h + ph) / sh][(w + pw) / sw] where sh divides h + ph and sw
    divides w + pw, zeros elsewhere. Returns dx [N][H][W][C] in y's dtype."""
    (sh, sw), (ph, pw) = p.stride, p.padding
    h, w = torch.arange(p.H) + ph, torch.arange(p.W) + pw
    hit = ((h % sh == 0)[:, None] & (w % sw == 0)[None, :])
    src = y[:, (h // sh).clamp(max=p.P - 1)][:, :, (w // sw).clamp(max=p.Q - 1)]
    return torch.where(hit[None, :, :, None], src, torch.zeros((), dtype=y.dtype))


def rotate_writes(p: Conv2dProblem, launch: LaunchConfig | None = None) -> np.ndarray:
    """Writes per element of w' ([C][R][S][K], flat) by ``dgrad_rotate_filter`` on ``launch``
    (default `rotate_launch`), by the kernel's store arithmetic: block (x, r', s') writes rows
    c0 .. c0 + 63 (< C), filters k0 .. k0 + 63 (< K) at ((c R + r') S + s') K + k, with
    c0 = 64·(x mod ceil(C / 64)) and k0 = 64·(x div ceil(C / 64)).

    Raises:
        ValueError: a launch whose blocks would write outside w' (a grid past its tiles or taps).
    """
    launch = launch or rotate_launch(p)
    ctiles, size = cdiv(p.C, ROTATE_TILE), p.C * p.R * p.S * p.K
    counts = np.zeros(size, dtype=np.int64)
    gx, gy, gz = launch.grid
    span = np.arange(ROTATE_TILE)
    for x in range(gx):
        c0, k0 = ROTATE_TILE * (x % ctiles), ROTATE_TILE * (x // ctiles)
        c, k = (c0 + span)[c0 + span < p.C], (k0 + span)[k0 + span < p.K]
        for rr in range(gy):
            for sr in range(gz):
                off = ((c[:, None] * p.R + rr) * p.S + sr) * p.K + k[None, :]
                if off.size and (off.min() < 0 or off.max() >= size or rr >= p.R or sr >= p.S):
                    raise ValueError(f"block ({x}, {rr}, {sr}) of grid {launch.grid} writes outside w' "
                                     f"({size} elements)")
                np.add.at(counts, off.ravel(), 1)
    return counts


def rotate_model(p: Conv2dProblem, w: torch.Tensor) -> torch.Tensor:
    """w' as ``dgrad_rotate_filter`` computes it, by its own index arithmetic: for every block
    (x, r', s') and thread t, the load of slab row k = k0 + t / 8 (+ 32), channels c0 + 8 (t % 8)
    .. + 7, from w's flat offset ((k R + R−1−r') S + S−1−s') C + c (zeros past K and C), then the
    store of row c = c0 + t / 8 (+ 32), filters k0 + 8 (t % 8) .. + 7, at ((c R + r') S + s') K + k
    (nothing past C and K). Elements no block writes stay NaN.

    Args:
        w: the filter, KRSC, any dtype (computed in float64).

    Returns:
        w', [C][R][S][K] float64.
    """
    K, C, R, S, T = p.K, p.C, p.R, p.S, ROTATE_TILE
    src = w.double().reshape(-1)
    out = torch.full((C * R * S * K,), float("nan"), dtype=torch.float64)
    (gx, gy, gz), ctiles = rotate_launch(p).grid, cdiv(C, T)
    t = torch.arange(ROTATE_THREADS)
    ch, row = t % 8, t // 8
    e = torch.arange(8)
    for x in range(gx):
        c0, k0 = T * (x % ctiles), T * (x // ctiles)
        for rr in range(gy):
            for sr in range(gz):
                tile = torch.zeros(T, T, dtype=torch.float64)  # [k][c]
                for u in range(2):
                    kr = row + 32 * u
                    k, c = k0 + kr, c0 + 8 * ch
                    cs = c[:, None] + e[None, :]  # the thread's 8 channels
                    ok = (k[:, None] < K) & (cs < C)
                    off = ((k[:, None] * R + (R - 1 - rr)) * S + (S - 1 - sr)) * C + cs
                    vals = torch.where(ok, src[torch.where(ok, off, 0)], torch.zeros((), dtype=torch.float64))
                    tile[kr[:, None], 8 * ch[:, None] + e[None, :]] = vals
                for u in range(2):
                    cr = row + 32 * u
                    c, k = c0 + cr, k0 + 8 * ch
                    ks = k[:, None] + e[None, :]
                    ok = (c[:, None] < C) & (ks < K)
                    off = ((c[:, None] * R + rr) * S + sr) * K + ks
                    vals = tile[8 * ch[:, None] + e[None, :], cr[:, None]]
                    out[off[ok]] = vals[ok]
    return out.reshape(C, R, S, K)


def workspace_bytes(p: Conv2dProblem) -> int:
    """The rotated filter w': K·R·S·C elements of ``p``'s dtype; a strided 1 x 1 layer adds the
    compact y, N·P·Q·C elements, from `compact_offset`."""
    if strided_1x1(p):
        return compact_offset(p) + p.N * p.P * p.Q * p.C * p.itemsize
    return p.K * p.R * p.S * p.C * p.itemsize


def dgrad_tensor_check(p: Conv2dProblem, tensors: dict) -> str | None:
    """The alignments the kernels need, None or the reason: dy 16-byte aligned (the fprop's im2col
    map: the copy engine's global address), dx too when C % 8 == 0 (its tiled map: the epilogue's
    TMA stores; the threads store it otherwise), w when C % 8 == 0 (the rotate kernel's 16-byte
    loads). The workspace (w') is the harness's allocation, aligned."""
    reason = alignment_reason(tensors, {"dy": VEC_BYTES, **({"dx": VEC_BYTES} if p.C % 8 == 0 else {})},
                              "the copy engine's (TMA) global addresses")
    if reason is None and p.C % 8 == 0:
        reason = alignment_reason(tensors, {"w": VEC_BYTES}, "the rotate kernel's 16-byte loads")
    return reason


def make_dgrad_wgmma(name: str = "dgrad_wgmma", config: WgmmaConfig | str | None = None) -> Variant:
    """A day-17 variant (not registered) running day 16's ``config`` (a `WgmmaConfig` or its name)
    for the fprop of every problem, or with None day 16's rule on it (`choose_config`).

    Raises:
        ValueError: a configuration day 16's ``.cu`` file does not instantiate.
    """
    if isinstance(config, str):
        if config not in BY_NAME:
            raise ValueError(f"no entry {config!r} in day 16's kernel; it has: {', '.join(BY_NAME)}")
        config = BY_NAME[config]
    if config is not None and config.compiled not in ENTRIES:
        raise ValueError(f"{config.name} is not instantiated in day 16's kernel; it has: {', '.join(BY_NAME)}")

    def config_fn(p: Conv2dProblem) -> WgmmaConfig | None:
        return choose_config(p) if config is None or shape_reason(p) else config

    return Variant(
        name=name,
        day=17,
        cu_file=CU_FILE,
        summary="dgrad (stride 1) on Hopper: the filter turned around and transposed, then day 16's wgmma/TMA "
        "fprop over dy" + (f" ({config.name})" if config else ""),
        config_fn=config_fn,
        supports_fn=dgrad_reason,
        launches_fn=dgrad_launches,
        covers_fn=dgrad_covers,
        op="dgrad",
        dtypes=("fp16", "bf16"),
        layouts=("NHWC",),
        accum="fp32",
        workspace_fn=lambda p, cfg: workspace_bytes(p),
        tensor_check_fn=lambda p, tensors, ep, cfg: dgrad_tensor_check(p, tensors),
        min_cc=HOPPER_CC,
        min_cc_why="day 16's wgmma, setmaxnreg and the bulk tensor copy in im2col mode",
        arch_suffix="a",
        configs_fn=None if config is not None else lambda: [make_dgrad_wgmma(f"{name}[{c.name}]", c)
                                                            for c in ENTRIES],
    )


DGRAD_WGMMA = register(make_dgrad_wgmma())
