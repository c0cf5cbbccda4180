"""Day 18's variant: unit-stride dgrad on day 16's Hopper kernel (``kernels/conv2d/18_dgrad_wgmma.cu``
holds day 18's own kernel, the filter's rotation; day 16's is built from day 16's file).

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

A strided layer (stride (sh, sw) > 1) runs by phases (`phases`, `axis_phases`): dx rows h with
h mod sh = a are reached only by the taps r with sh | a + ph − r·dh, so phase (a, b)'s pixels
are a stride-1 fprop over dy with those T x U taps turned around (`Taps`, `rotate_model`), the
phase's dilation and lower padding, and the phase's extent as its P x Q (`phase_problem`, its
dy map `phase_x_map`). Each phase with taps gets a ``rotate`` and an ``fprop`` launch, its filter
and its compact y [N][Ha][Wb][C] in the workspace (`filter_offsets`, `phase_offset`); then
``scatter`` (``dgrad_scatter_strided``) writes all of dx in one pass, each pixel from its phase's
y, zeros where the phase has no tap (`scatter_model`, `scatter_writes`). A strided 1 x 1 layer is
a GEMM (one phase with a tap) whose output the scatter spreads over dx.

Refused, with the reason: a stride above 8, a phase whose fprop would need negative padding (a
crop; day 14's ``dgrad`` runs those), groups,
padding past the dilated filter (padding' < 0, a crop), K % 8 != 0 (dy's pixels are the fprop's
input rows, which the copy engine reads in 16-byte strides), and whatever day 16 refuses for the
equivalent fprop (`dgrad_reason`, its reasons in dgrad's terms). A fused epilogue is refused (the
variant fuses none): dgrad's bias or residual would be day 16's, but nothing here needs it yet.

`make_dgrad_wgmma` builds the variant with a configuration forced (each of day 16's entries);
the registered ``dgrad_wgmma`` takes day 16's rule (`choose_config`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np
import torch

from helpers.epilogue import PLAIN, Epilogue
from helpers.problem import Conv2dProblem
from helpers.tma import ELEMENT_BYTES, TensorMap
from helpers.tune import Candidate, Machine, Space, gemm_tile_us, register_space
from helpers.variants import INT32_MAX, Buffer, KernelLaunch, LaunchConfig, Variant, register

from .day16_igemm_wgmma import (
    BY_NAME,
    ENTRIES,
    HOPPER_CC,
    WgmmaConfig,
    choose,
    covers,
    gemm_tile,
    group_rows,
    parse_config,
    problem_reason,
    space_variations,
    wgmma_launches,
    x_map,
)
from .day16_igemm_wgmma import CU_FILE as FPROP_CU_FILE
from .kit import VEC_BYTES, alignment_reason, cdiv

CU_FILE = "18_dgrad_wgmma.cu"  # rotate and scatter; the fprop launch is built from FPROP_CU_FILE (day 16's)
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


def strided(p: Conv2dProblem) -> bool:
    """A stride other than 1: dx by phases (`phases`), each an fprop into the workspace, then the scatter."""
    return p.stride != (1, 1)


@dataclass(frozen=True)
class AxisPhase:
    """Phase ``a`` of one axis of a strided dgrad: dx rows h = a + stride·i, i < ``extent``, are
    reached by the taps ``taps`` (ascending r with stride | a + pad − r·dil) alone; as a stride-1
    fprop over dy they are the taps turned around, ``dil`` apart, with lower padding ``pad``."""

    a: int
    extent: int
    taps: tuple
    pad: int
    dil: int

    @property
    def step(self) -> int:
        """Taps of w between two of the phase's taps (1 for a single tap)."""
        return self.taps[1] - self.taps[0] if len(self.taps) > 1 else 1


def axis_phases(size: int, stride: int, pad: int, dil: int, taps: int) -> list[AxisPhase]:
    """The ``stride`` phases of one axis (dx ``size`` long, the filter ``taps`` long): phase a's
    rows h = a + stride·i take dy row i + (a + pad − r·dil) / stride from each tap r with
    stride | a + pad − r·dil; turned around (t = T − 1 − j for the j-th such r) that is the
    stride-1 fprop with dilation step·dil / stride and lower padding (r_last·dil − a − pad) / stride."""
    out = []
    for a in range(stride):
        rs = tuple(r for r in range(taps) if (a + pad - r * dil) % stride == 0)
        step = rs[1] - rs[0] if len(rs) > 1 else 1
        out.append(AxisPhase(a=a, extent=max(0, cdiv(size - a, stride)), taps=rs,
                             pad=(rs[-1] * dil - a - pad) // stride if rs else 0,
                             dil=step * dil // stride if len(rs) > 1 else 1))
    return out


def phases(p: Conv2dProblem) -> list[tuple[AxisPhase, AxisPhase]]:
    """Every phase (rows, columns) of ``p``, rows first: (a, b) for a < sh, b < sw."""
    rows = axis_phases(p.H, p.stride[0], p.padding[0], p.dilation[0], p.R)
    cols = axis_phases(p.W, p.stride[1], p.padding[1], p.dilation[1], p.S)
    return [(r, c) for r in rows for c in cols]


def active(ph: tuple[AxisPhase, AxisPhase]) -> bool:
    """A phase with taps on both axes and pixels: it gets a rotate and an fprop launch."""
    return all(a.taps and a.extent for a in ph)


def shape_reason(p: Conv2dProblem) -> str | None:
    """None if ``p`` is a dgrad that `fprop_problem` turns into an fprop, else why not: groups,
    stride other than 1 with a filter other than 1 x 1, padding' < 0 (stride 1)."""
    if p.groups != 1:
        return f"needs groups = 1; got {p.groups}"
    if strided(p):
        if max(p.stride) > 8:
            return f"stride {p.stride}: the scatter kernel walks at most 8 phases per axis"
        if not any(map(active, phases(p))):
            return ("no dy pixel reaches any dx pixel (every phase lacks a tap or is empty): dx is all zeros, "
                    "which day 14's dgrad writes")
        for ph in filter(active, phases(p)):
            pads = (ph[0].pad, ph[1].pad)
            size = [x.extent - 2 * x.pad + x.dil * (len(x.taps) - 1) for x in ph]
            if min(size) < 1:
                return (f"phase {(ph[0].a, ph[1].a)}: its padding {pads} leaves no image for day 16's fprop; "
                        "day 14's dgrad runs it")
            if min(pads) < 0:
                return (f"phase {(ph[0].a, ph[1].a)} would need padding {pads} (a crop), which day 16's fprop does "
                        "not take; day 14's dgrad runs it")
        return None
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
    dilation; its P' x Q' is H x W. A strided layer: the fprop of its phase with the most taps
    (`phase_problem`; day 16's rule picks the configuration on it).

    Raises:
        ValueError: a problem `shape_reason` refuses (the message is the reason).
    """
    reason = shape_reason(p)
    if reason:
        raise ValueError(f"no fprop equivalent: {reason}")
    if strided(p):
        return phase_problem(p, max(filter(active, phases(p)), key=lambda ph: len(ph[0].taps) * len(ph[1].taps)))
    return Conv2dProblem(N=p.N, C=p.K, H=p.P, W=p.Q, K=p.C, R=p.R, S=p.S, padding=rotated_padding(p),
                         dilation=p.dilation, dtype=p.dtype, layout=p.layout)


def phase_problem(p: Conv2dProblem, ph: tuple[AxisPhase, AxisPhase]) -> Conv2dProblem:
    """Phase ``ph``'s fprop as a problem day 16 plans: over dy's channels (C' = K), K' = C filters
    of T x U taps, the phase's dilation and lower padding, and an image of Hv x Wv chosen so its
    output is the phase's extent (Hv = extent − 2·pad + dil·(T − 1)); `phase_x_map` puts dy's real
    size in the im2col map."""
    r, c = ph
    hv, wv = (x.extent - 2 * x.pad + x.dil * (len(x.taps) - 1) for x in (r, c))
    return Conv2dProblem(N=p.N, C=p.K, H=hv, W=wv, K=p.C, R=len(r.taps), S=len(c.taps), padding=(r.pad, c.pad),
                         dilation=(r.dil, c.dil), dtype=p.dtype, layout=p.layout)


def phase_x_map(p: Conv2dProblem, ph: tuple[AxisPhase, AxisPhase], cfg: WgmmaConfig):
    """The im2col map of dy for phase ``ph``: day 16's map of `phase_problem`, but over dy as it is
    (dims K, Q, P, N) with the box from (−pad_w, −pad_h) to the phase's last pixel, (extent − 1 −
    pad) per axis, relative to (Q − 1, P − 1); rows past dy read as zeros."""
    r, c = ph
    desc = x_map(phase_problem(p, ph), cfg)
    e = ELEMENT_BYTES[p.dtype]
    return replace(desc, dims=(p.K, p.Q, p.P, p.N), strides=(p.K * e, p.Q * p.K * e, p.P * p.Q * p.K * e),
                   upper=(c.extent - 1 - c.pad - (p.Q - 1), r.extent - 1 - r.pad - (p.P - 1)))


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
    scatter_ints = (max(p.H + 2 * p.padding[0], p.W + 2 * p.padding[1]) + max(p.stride),  # phase_extent's sums
                    p.N * p.H + SCATTER_BLOCKS_PER_SM * SCATTER_SMS,  # the row loop, one grid past the last row
                    p.W * cdiv(p.C, 8) + SCATTER_THREADS)  # a row's vector loop, one block past the last
    if strided(p) and max(scatter_ints) > INT32_MAX:
        return (f"N, H, W, C = {p.N}, {p.H}, {p.W}, {p.C}: the scatter kernel's int indices (H and W plus twice "
                "the padding and a stride, its N H rows plus a grid, a row's W ceil(C / 8) vectors plus a block) "
                "do not fit")
    if strided(p) and cfg is not None:
        for ph in filter(active, phases(p)):
            fp = phase_problem(p, ph)
            why = problem_reason(fp, cfg) or phase_x_map(p, ph, cfg).reason()
            if why:
                return f"day 16's fprop of phase {(ph[0].a, ph[1].a)} ({fp.name}) refuses it: {reworded(why)}"
        return None
    fp = fprop_problem(p)
    if cfg is None:
        return "no day-16 configuration for the equivalent fprop"
    why = problem_reason(fp, cfg)
    if why:
        return f"day 16's fprop over dy (C' = K = {p.K}, K' = C = {p.C}, padding' {fp.padding}) refuses it: " \
               f"{reworded(why)}"
    return None


@dataclass(frozen=True)
class Taps:
    """The taps of w one rotated filter holds: r = rb + j·rstep (j < T), s = sb + i·sstep (i < U);
    ``Taps.all(p)`` is the whole filter (unit stride)."""

    T: int
    U: int
    rb: int = 0
    rstep: int = 1
    sb: int = 0
    sstep: int = 1

    @classmethod
    def all(cls, p: Conv2dProblem) -> Taps:
        return cls(T=p.R, U=p.S)

    @classmethod
    def of(cls, ph: tuple[AxisPhase, AxisPhase]) -> Taps:
        r, c = ph
        return cls(T=len(r.taps), U=len(c.taps), rb=r.taps[0], rstep=r.step, sb=c.taps[0], sstep=c.step)

    def args(self) -> tuple:
        return self.T, self.U, self.rb, self.rstep, self.sb, self.sstep


def rotate_launch(p: Conv2dProblem, taps: Taps | None = None) -> LaunchConfig:
    """``dgrad_rotate_filter``: grid (ceil(C / 64)·ceil(K / 64), T, U) (block x: the c-tile
    x % ceil(C / 64), the k-tile x / ceil(C / 64); y, z: the tap (t, u) of w'), 256 threads."""
    taps = taps or Taps.all(p)
    tiles = cdiv(p.C, ROTATE_TILE) * cdiv(p.K, ROTATE_TILE)
    return LaunchConfig(grid=(tiles, taps.T, taps.U), block=(ROTATE_THREADS, 1, 1))


def rotate(p: Conv2dProblem, name: str, taps: Taps, offset: int = 0) -> KernelLaunch:
    """The ``dgrad_rotate_filter`` launch writing ``taps``' filter into the workspace at ``offset``."""
    ints = (p.K, p.C, p.R, p.S, *taps.args())
    return KernelLaunch(name, ROTATE_ENTRY, rotate_launch(p, taps),
                        (Buffer("w"), Buffer("workspace", offset), *(np.int32(v) for v in ints)))


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


def aligned(nbytes: int) -> int:
    return cdiv(nbytes, WORKSPACE_ALIGN) * WORKSPACE_ALIGN


def filter_offsets(p: Conv2dProblem) -> dict[tuple[int, int], int]:
    """Byte offset in the workspace of each active phase's rotated filter (T·U·K·C elements),
    each ``WORKSPACE_ALIGN``-aligned, in (a, b) order."""
    out, off = {}, 0
    for ph in filter(active, phases(p)):
        out[(ph[0].a, ph[1].a)] = off
        off += aligned(len(ph[0].taps) * len(ph[1].taps) * p.K * p.C * p.itemsize)
    return out


def compact_offset(p: Conv2dProblem) -> int:
    """Byte offset of the phases' compact outputs in the workspace: past the filters, aligned."""
    return sum(aligned(len(ph[0].taps) * len(ph[1].taps) * p.K * p.C * p.itemsize)
               for ph in filter(active, phases(p)))


def phase_offset(p: Conv2dProblem, ph: tuple[AxisPhase, AxisPhase]) -> int:
    """Byte offset of phase ``ph``'s y [N][Ha][Wb][C] past `compact_offset`: N·C·(rows_before·W +
    Ha·cols_before) elements, the phases back to back in (a, b) order, as the scatter kernel
    computes it."""
    r, c = ph
    rows_before = sum(cdiv(p.H - a, p.stride[0]) for a in range(r.a))
    cols_before = sum(cdiv(p.W - b, p.stride[1]) for b in range(c.a))
    return p.N * p.C * (rows_before * p.W + r.extent * cols_before) * p.itemsize


def phase_names(args: tuple, filter_at: int, y_at: int, xdesc) -> tuple:
    """`dgrad_names` of day 16's arguments for one phase: x's map is ``xdesc`` (dy as it is), w's
    map the workspace at ``filter_at`` (the phase's rotated filter), y (its map and pointer) the
    workspace at ``y_at`` (the phase's compact output)."""
    out = []
    for a, renamed in zip(args, dgrad_names(args)):
        if isinstance(a, TensorMap) and a.name == "x":
            renamed = TensorMap("dy", xdesc)
        elif isinstance(a, TensorMap) and a.name == "w":
            renamed = TensorMap("workspace", a.desc, filter_at)
        elif isinstance(a, (TensorMap, Buffer)) and a.name == "y":
            renamed = replace(a, name="workspace", offset=y_at)
        out.append(renamed)
    return tuple(out)


def scatter_launch(p: Conv2dProblem) -> LaunchConfig:
    """``dgrad_scatter_strided``: one block per dx row (n, h) in a grid-stride loop over the N·H
    rows, 256 threads a block, at most ``SCATTER_BLOCKS_PER_SM`` x ``SCATTER_SMS`` blocks."""
    blocks = max(1, min(p.N * p.H, SCATTER_BLOCKS_PER_SM * SCATTER_SMS))
    return LaunchConfig(grid=(blocks, 1, 1), block=(SCATTER_THREADS, 1, 1))


@dataclass(frozen=True)
class Divisor:
    """n // d by a multiply-high, an add and a shift, for 0 <= n < 2^31 and 1 <= d < 2^31, as
    ``dgrad_scatter_strided``'s ``Divisor`` computes it (the GPU has no integer division
    instruction): s = ceil(log2 d), m = floor(2^32 (2^s - d) / d) + 1, n // d = (umulhi(n, m) + n) >> s.

    Source: T. Granlund and P. L. Montgomery, "Division by invariant integers using
    multiplication", PLDI 1994, section 4 (the round-up multiplier, n + umulhi kept in 32 bits
    because n < 2^31)."""

    d: int

    @property
    def shift(self) -> int:
        return (self.d - 1).bit_length()

    @property
    def multiplier(self) -> int:
        return (2**32 * (2**self.shift - self.d)) // self.d + 1

    def __post_init__(self):
        if not 1 <= self.d < 2**31:
            raise ValueError(f"Divisor({self.d}): the kernel divides by 1 <= d < 2^31")

    def div(self, n):
        """n // d the kernel's way; n an int or an integer numpy array with 0 <= n < 2^31.

        Raises:
            ValueError: n outside 0 .. 2^31 - 1 (the kernel's 32-bit sum would overflow).
        """
        n = np.asarray(n, dtype=np.int64)
        if n.size and (n.min() < 0 or n.max() >= 2**31):
            raise ValueError("Divisor.div: the kernel takes 0 <= n < 2^31")
        q = (((n * self.multiplier) >> 32) + n) >> self.shift
        return int(q) if q.ndim == 0 else q


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
    if not strided(p):
        (main,) = wgmma_launches(fprop_problem(p), PLAIN, cfg)
        return [rotate(p, "rotate", Taps.all(p)),
                replace(main, name="fprop", args=dgrad_names(main.args), cu_file=FPROP_CU_FILE)]
    out, filters, base = [], filter_offsets(p), compact_offset(p)
    for ph in filter(active, phases(p)):
        key = (ph[0].a, ph[1].a)
        (main,) = wgmma_launches(phase_problem(p, ph), PLAIN, cfg)
        args = phase_names(main.args, filters[key], base + phase_offset(p, ph), phase_x_map(p, ph, cfg))
        out += [rotate(p, f"rotate{key}", Taps.of(ph), filters[key]),
                replace(main, name=f"fprop{key}", args=args, cu_file=FPROP_CU_FILE)]
    ints = (p.N, p.H, p.W, p.C, *p.stride, *p.padding, *p.dilation, p.R, p.S)
    return out + [KernelLaunch("scatter", SCATTER_ENTRY, scatter_launch(p),
                               (Buffer("workspace", base), Buffer("dx"), *(np.int32(v) for v in ints)))]


def dgrad_covers(p: Conv2dProblem, launch: LaunchConfig, cfg: WgmmaConfig) -> np.ndarray:
    """Writes per dx element (NHWC, flat) of the last launch: the ``fprop``'s, day 16's model
    (`covers`) of the equivalent fprop, whose y [N][H][W][C] is dx element for element; a strided
    1 x 1 layer's ``scatter`` (`scatter_writes`)."""
    if strided(p):
        return scatter_writes(p, launch)
    return covers(fprop_problem(p), launch, cfg)


def scatter_writes(p: Conv2dProblem, launch: LaunchConfig | None = None) -> np.ndarray:
    """Writes per dx element (NHWC, flat) by ``dgrad_scatter_strided`` on ``launch`` (default
    `scatter_launch`), by its loops: block x takes rows x, x + G, ... below N·H (G blocks); in each,
    thread t of B takes vectors t, t + B, ... below W·ceil(C / 8), vector v writes channels
    8 (v mod ceil(C / 8)) .. + 7 (< C) of pixel v div ceil(C / 8), both by `Divisor`."""
    launch = launch or scatter_launch(p)
    (blocks, _, _), (threads, _, _) = launch.grid, launch.block
    if threads != SCATTER_THREADS:
        raise ValueError(f"block {launch.block}: the kernel's vector loop steps by SCATTER_THREADS = {SCATTER_THREADS}")
    cvec = cdiv(p.C, 8)
    counts = np.zeros(p.N * p.H * p.W * p.C, dtype=np.int64)
    rows = np.concatenate([np.arange(x, p.N * p.H, blocks) for x in range(min(blocks, p.N * p.H))])
    v = np.concatenate([np.arange(t, p.W * cvec, threads) for t in range(min(threads, p.W * cvec))])
    w = Divisor(cvec).div(v)
    for e in range(8):
        c = (v - w * cvec) * 8 + e
        ok = c < p.C
        flat = (rows[:, None] * p.W + w[ok][None, :]) * p.C + c[ok][None, :]
        np.add.at(counts, flat.ravel(), 1)
    return counts


def scatter_model(p: Conv2dProblem, ys: torch.Tensor) -> torch.Tensor:
    """dx as ``dgrad_scatter_strided`` computes it from the phases' compact outputs ``ys`` (the
    workspace past `compact_offset`, flat, N·H·W·C elements), by its index arithmetic: pixel
    (h, w) of phase (a, b) = (h mod sh, w mod sw) takes element (n, h / sh, w / sw) of that phase's
    y [N][Ha][Wb][C] at `phase_offset`, or 0 where the phase has no tap. Returns dx [N][H][W][C]."""
    dx = torch.zeros(p.N, p.H, p.W, p.C, dtype=ys.dtype)
    (sh, sw) = p.stride
    for ph in phases(p):
        r, c = ph
        if not (r.taps and c.taps) or not (r.extent and c.extent):
            continue
        start = phase_offset(p, ph) // p.itemsize
        y = ys[start:start + p.N * r.extent * c.extent * p.C].view(p.N, r.extent, c.extent, p.C)
        dx[:, r.a::sh, c.a::sw] = y
    return dx


def rotate_writes(p: Conv2dProblem, launch: LaunchConfig | None = None, taps: Taps | None = None) -> np.ndarray:
    """Writes per element of w' ([C][R][S][K], flat) by ``dgrad_rotate_filter`` on ``launch``
    (default `rotate_launch`), by the kernel's store arithmetic: block (x, r', s') writes rows
    c0 .. c0 + 63 (< C), filters k0 .. k0 + 63 (< K) at ((c R + r') S + s') K + k, with
    c0 = 64·(x mod ceil(C / 64)) and k0 = 64·(x div ceil(C / 64)).

    Raises:
        ValueError: a launch whose blocks would write outside w' (a grid past its tiles or taps).
    """
    taps = taps or Taps.all(p)
    launch = launch or rotate_launch(p, taps)
    ctiles, size = cdiv(p.C, ROTATE_TILE), p.C * taps.T * taps.U * p.K
    counts = np.zeros(size, dtype=np.int64)
    gx, gy, gz = launch.grid
    span = np.arange(ROTATE_TILE)
    for x in range(gx):
        c0, k0 = ROTATE_TILE * (x % ctiles), ROTATE_TILE * (x // ctiles)
        c, k = (c0 + span)[c0 + span < p.C], (k0 + span)[k0 + span < p.K]
        for rr in range(gy):
            for sr in range(gz):
                off = ((c[:, None] * taps.T + rr) * taps.U + sr) * p.K + k[None, :]
                if off.size and (off.min() < 0 or off.max() >= size or rr >= taps.T or sr >= taps.U):
                    raise ValueError(f"block ({x}, {rr}, {sr}) of grid {launch.grid} writes outside w' "
                                     f"({size} elements)")
                np.add.at(counts, off.ravel(), 1)
    return counts


def rotate_model(p: Conv2dProblem, w: torch.Tensor, taps: Taps | None = None) -> torch.Tensor:
    """w' as ``dgrad_rotate_filter`` computes it, by its own index arithmetic: for every block
    (x, r', s') and thread t, the load of slab row k = k0 + t / 8 (+ 32), channels c0 + 8 (t % 8)
    .. + 7, from w's flat offset ((k R + R−1−r') S + S−1−s') C + c (zeros past K and C), then the
    store of row c = c0 + t / 8 (+ 32), filters k0 + 8 (t % 8) .. + 7, at ((c R + r') S + s') K + k
    (nothing past C and K). Elements no block writes stay NaN.

    Args:
        w: the filter, KRSC, any dtype (computed in float64).

        taps: the taps it holds (`Taps`; default all: w turned around, unit stride).

    Returns:
        w', [C][T][U][K] float64.
    """
    K, C, R, S, T = p.K, p.C, p.R, p.S, ROTATE_TILE
    taps = taps or Taps.all(p)
    src = w.double().reshape(-1)
    out = torch.full((C * taps.T * taps.U * K,), float("nan"), dtype=torch.float64)
    (gx, gy, gz), ctiles = rotate_launch(p, taps).grid, cdiv(C, T)
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
                    r, s = taps.rb + (taps.T - 1 - rr) * taps.rstep, taps.sb + (taps.U - 1 - sr) * taps.sstep
                    off = ((k[:, None] * R + r) * S + s) * C + cs
                    vals = torch.where(ok, src[torch.where(ok, off, 0)], torch.zeros((), dtype=torch.float64))
                    tile[kr[:, None], 8 * ch[:, None] + e[None, :]] = vals
                for u in range(2):
                    cr = row + 32 * u
                    c, k = c0 + cr, k0 + 8 * ch
                    ks = k[:, None] + e[None, :]
                    ok = (c[:, None] < C) & (ks < K)
                    off = ((c[:, None] * taps.T + rr) * taps.U + sr) * K + ks
                    vals = tile[8 * ch[:, None] + e[None, :], cr[:, None]]
                    out[off[ok]] = vals[ok]
    return out.reshape(C, taps.T, taps.U, K)


def workspace_bytes(p: Conv2dProblem) -> int:
    """The rotated filter w': K·R·S·C elements of ``p``'s dtype; a strided layer: each active
    phase's filter (`filter_offsets`), then the phases' compact outputs, N·H·W·C elements in all
    (`compact_offset`)."""
    if strided(p):
        return compact_offset(p) + p.N * p.H * p.W * p.C * p.itemsize
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
    """A day-18 variant (not registered) running day 16's ``config`` (a `WgmmaConfig` or its name)
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
        day=18,
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


# ---- day 15's search space: day 16's entries for the fprop(s) of the run, and the tile order --------


@functools.cache
def space_variant(config: str) -> Variant:
    """The variant running day 16's configuration name ``config`` for every fprop of its run (one
    object per name; `days.day16_igemm_wgmma.parse_config` raises on a name it cannot build)."""
    return make_dgrad_wgmma(f"dgrad_wgmma[{config}]", parse_config(config))


def space_candidates(p: Conv2dProblem, machine: Machine) -> list[Candidate]:
    """Every day-16 entry at the tile order of the equivalent fprop (`fprop_problem`), in families
    by schedule; the model's time: day 16's model of each active phase's fprop, one launch per
    phase for the rotation, and for a strided layer the scatter (the compact y written and read
    back, dx written) at the machine's DRAM rate plus its launch. The rule (`choose_config`) is the
    prior. A problem without an fprop equivalent has none (the variant refuses it)."""
    if shape_reason(p):
        return []
    rule, q = choose_config(p), fprop_problem(p)
    runs = [phase_problem(p, ph) for ph in filter(active, phases(p))] if strided(p) else [q]
    extra = len(runs) * machine.launch_us
    if strided(p):
        extra += machine.launch_us + (2 * p.N * p.H * p.W * p.C * p.itemsize) / (machine.dram_gbps * 1e3)
    out = []
    for c in ENTRIES:
        cfg = replace(c, group_m=group_rows(q))
        us = sum(gemm_tile_us(gemm_tile(r, cfg), machine) for r in runs) + extra
        out.append(Candidate(cfg.name, space_variant(cfg.name), us, cfg == rule, family=cfg.mode))
    return out


SPACE = register_space(Space("dgrad_wgmma", space_candidates, space_variations, lambda cfg, p: space_variant(cfg),
                             summary="day 16's WGMMA_ENTRY schedules x tiles x tile order, for each fprop of the run",
                             sources=(FPROP_CU_FILE,)))
