"""Day 14's dgrad variant: day 13's kernel run once per filter phase (``14_dgrad.cu``).

A run is one launch per phase pair (φh, φw) that has dx rows and taps on both axes: the fprop of
`phase_conv` over dy with that phase's filter, its rows stored at dx pixels (n, φh + sh·i,
φw + sw·j); then, if any dx pixel gets no tap (a phase without taps on an axis: stride larger than
the dilated filter), one launch of ``dgrad_zero_phases`` that writes all those pixels as zeros
(`zero_masks`). With the optimized iterator (`in_place`: K and C multiples of 8) the phase GEMMs
read B straight from w: GEMM-K row (jh, jw, k) is w[k][r(jh)][s(jw)][:], r(jh) = r_first −
jh·r_step (`phase_taps`, `in_place_b`); the analytic and few-channels iterators read the phase
filters that one launch of ``dgrad_filter_phases`` first writes into the workspace
(`filter_phases`). `dgrad_plan` computes the phases and their arguments; the tile, iterator and
swizzle come from day 13's rule applied to the GEMM of the largest phase (`phase_gemm_problem`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch
import torch.nn.functional as F

from helpers.epilogue import PLAIN, Epilogue
from helpers.problem import Conv2dProblem
from helpers.variants import INT32_MAX, Buffer, KernelLaunch, LaunchConfig, Variant, register

from ..day13_igemm_production import (
    FEW_CHANNELS_MAX_C,
    MAX_MASKED_TAPS,
    ProductionConfig,
    TileDescription,
    choose_swizzle,
    choose_tile,
    read_entries,
)
from ..kit import TENSOR_CORE_CC, VEC_BYTES, alignment_reason, cdiv, gemm_writes, tile_visits
from .model import AxisPhase, dgrad_phases

CU_FILE = "14_dgrad.cu"
TRANSPOSE_TILE = 64  # dgrad_filter_phases: 64 x 64 slabs, blocks of 256 threads
ZERO_THREADS = 256  # dgrad_zero_phases: threads per block along a dx row
MAX_ZERO_STRIDE = 32  # dgrad_zero_phases: one bit per phase of an axis in a 32-bit mask


@cache
def instantiated() -> dict[str, tuple[str, ...]]:
    """{tile name: iterators} of the ``DGRAD_ENTRY(...)`` lines of ``14_dgrad.cu`` (day 13's reader)."""
    return read_entries(CU_FILE, "DGRAD_ENTRY")


def dgrad_iterator(p: Conv2dProblem) -> str:
    """Day 13's iterator for the phases' GEMM-K = (jh, jw, k): ``optimized`` (16-byte copies of
    dy's K channels, and of w's C channels: B read in place) if K % 8 == 0, C % 8 == 0 and
    R, S <= 16, else ``few_channels`` if K <= 8, else ``analytic`` (both on the phase filters)."""
    if p.K % 8 == 0 and p.C % 8 == 0 and max(p.R, p.S) <= MAX_MASKED_TAPS:
        return "optimized"
    return "few_channels" if p.K <= FEW_CHANNELS_MAX_C else "analytic"


def phase_gemm_problem(p: Conv2dProblem) -> Conv2dProblem:
    """An fprop problem with the GEMM-M and GEMM-N of dgrad's largest phase (φ = (0, 0)):
    N·ceil(H/sh)·ceil(W/sw) pixels, C outputs, K channels, a 1x1 filter: what day 13's tile rule
    and swizzle rule read."""
    return Conv2dProblem(N=p.N, C=p.K, H=cdiv(p.H, p.stride[0]), W=cdiv(p.W, p.stride[1]), K=p.C, R=1, S=1,
                         dtype=p.dtype, layout="NHWC")


def choose_config(p: Conv2dProblem) -> ProductionConfig:
    """Day 13's rule (`choose_tile`, `choose_swizzle`) on `phase_gemm_problem`, with `dgrad_iterator`."""
    g, it = phase_gemm_problem(p), dgrad_iterator(p)
    tile = choose_tile(g, it)
    return ProductionConfig(tile, it, choose_swizzle(g, tile))


def in_place(p: Conv2dProblem) -> bool:
    """Whether the phase GEMMs read B from w in place (the optimized iterator: no filter launch, no
    workspace) rather than from the phase filters ``dgrad_filter_phases`` writes."""
    return dgrad_iterator(p) == "optimized"


@dataclass(frozen=True)
class PhaseLaunch:
    """One phase pair of a dgrad run: the axis phases, the fprop it is (Jh x Jw taps, padding
    −o_min, dilation d' per axis), I x J output rows, where its filter starts in the workspace
    (elements; the transposed path), and its taps in w per axis (`phase_taps`: tap j is filter row
    ``first[0] − j·step[0]``, column ``first[1] − j·step[1]``; the in-place path)."""

    rows: AxisPhase
    cols: AxisPhase
    pad: tuple[int, int]
    dil: tuple[int, int]
    filter_offset: int
    first: tuple[int, int]
    step: tuple[int, int]

    @property
    def taps(self) -> tuple[int, int]:
        return len(self.rows.taps), len(self.cols.taps)

    @property
    def pixels(self) -> tuple[int, int]:
        return self.rows.rows, self.cols.rows


def phase_conv(a: AxisPhase, stride: int, dil: int) -> tuple[int, int]:
    """(padding, dilation) of one axis phase with taps as a unit-stride fprop over dy: the taps in
    order of ascending dy offset o_min + j·d', d' = dil / gcd(stride, dil), padding −o_min."""
    return -min(a.offsets), dil // math.gcd(stride, dil)


def phase_taps(a: AxisPhase, stride: int, dil: int) -> tuple[int, int]:
    """(first, step) of one axis phase with taps: its taps by ascending dy offset are the filter
    positions first − j·step, j = 0 .. J − 1, with first its largest tap and step = stride /
    gcd(stride, dil) (taps of one phase differ in r·dil by multiples of stride)."""
    return max(a.taps), stride // math.gcd(stride, dil)


def dgrad_plan(p: Conv2dProblem) -> list[PhaseLaunch]:
    """The phase pairs (φh, φw) of ``p`` that have dx rows and taps on both axes (one GEMM launch
    each; `zero_masks` covers the others), in row-major phase order, with their fprop arguments,
    their taps in w (`phase_taps`) and filter offsets: phase (φh, φw) starts after the filters of
    every earlier pair, (Σ_{a<φh} Jh(a))·S·C·K + Jh(φh)·(Σ_{b<φw} Jw(b))·C·K elements, as the
    filter kernel writes them."""
    ph_h, ph_w = dgrad_phases(p)
    out = []
    before_h = 0
    for a in ph_h:
        before_w = 0
        for b in ph_w:
            if a.rows and b.rows and a.taps and b.taps:
                (pad_h, dil_h), (pad_w, dil_w) = phase_conv(a, p.stride[0], p.dilation[0]), \
                    phase_conv(b, p.stride[1], p.dilation[1])
                (r0, r_step), (s0, s_step) = phase_taps(a, p.stride[0], p.dilation[0]), \
                    phase_taps(b, p.stride[1], p.dilation[1])
                off = (before_h * p.S + len(a.taps) * before_w) * p.C * p.K
                out.append(PhaseLaunch(a, b, (pad_h, pad_w), (dil_h, dil_w), off, (r0, s0), (r_step, s_step)))
            before_w += len(b.taps)
        before_h += len(a.taps)
    return out


def zero_masks(p: Conv2dProblem) -> tuple[int, int]:
    """(zh, zw), the arguments of ``dgrad_zero_phases``: bit φ set for each phase φ of the H (W)
    axis that has dx rows but no taps. dx pixel (n, h, w) gets no tap iff bit h mod sh of zh or bit
    w mod sw of zw is set (the taps of a phase pair are the product of its axes' taps); (0, 0):
    every pixel gets one, and the run has no zero launch."""
    return tuple(sum(1 << a.phase for a in axis if a.rows and not a.taps) for axis in dgrad_phases(p))


def zero_pixels(p: Conv2dProblem) -> np.ndarray:
    """(H, W) bool: the dx pixels ``dgrad_zero_phases`` writes (in every image), by the kernel's
    own test on `zero_masks`."""
    zh, zw = zero_masks(p)
    rows = np.array([zh >> (h % p.stride[0]) & 1 for h in range(p.H)], dtype=bool)
    cols = np.array([zw >> (w % p.stride[1]) & 1 for w in range(p.W)], dtype=bool)
    return rows[:, None] | cols[None, :]


def filter_phases(p: Conv2dProblem, w: torch.Tensor) -> torch.Tensor:
    """The phase filters as ``dgrad_filter_phases`` writes them, simulated: a flat tensor of
    K·R·S·C elements where tap (r, s) of filter k, channel c sits at
    base + c·(Jh·Jw·K) + (jh·Jw + jw)·K + k, with jh (jw) the tap's rank among its phase's taps by
    ascending dy offset and base the phase's `dgrad_plan` offset.

    Args:
        w: (K, C, R, S) logical KCRS, any dtype (kept).
    """
    out = torch.zeros(p.K * p.R * p.S * p.C, dtype=w.dtype, device=w.device)
    k, c = torch.arange(p.K, device=w.device), torch.arange(p.C, device=w.device)

    def place(r: int, taps: int, stride: int, pad: int, dil: int) -> tuple[int, int, int, int]:
        phase = lambda t: (t * dil - pad) % stride  # noqa: E731 - the kernel's tap_phase
        same = [t for t in range(taps) if phase(t) == phase(r)]
        return phase(r), sum(t > r for t in same), len(same), sum(phase(t) < phase(r) for t in range(taps))

    for r in range(p.R):
        _, rank_h, taps_h, before_h = place(r, p.R, p.stride[0], p.padding[0], p.dilation[0])
        for s in range(p.S):
            _, rank_w, taps_w, before_w = place(s, p.S, p.stride[1], p.padding[1], p.dilation[1])
            base = (before_h * p.S + taps_h * before_w) * p.C * p.K
            idx = base + c[:, None] * (taps_h * taps_w * p.K) + (rank_h * taps_w + rank_w) * p.K + k[None, :]
            out[idx] = w[:, :, r, s].T
    return out


def in_place_b(p: Conv2dProblem, ph: PhaseLaunch) -> np.ndarray:
    """(Jh·Jw·K, C) int64: the element of w (KRSC, flat) that the in-place B loader reads for GEMM-K
    index gk = (jh·Jw + jw)·K + k and GEMM-N index gn = c of phase ``ph``, by the kernel's own
    arithmetic (``PhaseFilter::row`` of ``14_dgrad.cu`` from the launch's R, S, r_first, r_step,
    s_first, s_step, plus the column): k·R·S·C + (r_first·S + s_first)·C − jh·r_step·S·C −
    jw·s_step·C + c."""
    (jh_n, jw_n), (r0, s0), (r_step, s_step) = ph.taps, ph.first, ph.step
    first, k_stride, jh_stride, jw_stride = (r0 * p.S + s0) * p.C, p.R * p.S * p.C, r_step * p.S * p.C, s_step * p.C
    jh, jw, k = np.meshgrid(np.arange(jh_n), np.arange(jw_n), np.arange(p.K), indexing="ij")
    row = k.astype(np.int64) * k_stride + (first - jh * jh_stride - jw * jw_stride)
    return row.reshape(-1, 1) + np.arange(p.C)[None, :]


def simulate(p: Conv2dProblem, dy: torch.Tensor, w: torch.Tensor, from_w: bool | None = None) -> torch.Tensor:
    """dx from the launches' own arguments, in float64: per `dgrad_plan` entry its phase filter,
    read from w by `in_place_b` (the in-place path) or cut from `filter_phases` at the launch's
    offset (the transposed path), and the unit-stride fprop it launches (dy padded by the phase's
    padding, which may be negative: a crop; dilation d'; the first I x J outputs) stored at rows
    φh + sh·i, columns φw + sw·j, then zeros at `zero_pixels`. What the kernels compute, with the
    rounding left out; dx starts as NaN, so a pixel no launch writes shows.

    Args:
        dy: (N, K, P, Q) logical NCHW; w: (K, C, R, S) logical KCRS.
        from_w: True for the in-place path, False for the transposed one, None for the one the
            variant takes on ``p`` (`in_place`).

    Returns:
        dx, (N, C, H, W) float64.
    """
    from_w = in_place(p) if from_w is None else from_w
    w64 = w.double()
    wt = None if from_w else filter_phases(p, w64)
    w_flat = w64.permute(0, 2, 3, 1).reshape(-1)  # KRSC, as the kernel reads it
    dy64 = dy.double()
    dx = torch.full((p.N, p.C, p.H, p.W), float("nan"), dtype=torch.float64, device=dy.device)
    for ph in dgrad_plan(p):
        (i, j), (jh, jw) = ph.pixels, ph.taps
        if from_w:  # B[gk][gn] -> the [C][Jh][Jw][K] filter of the phase's fprop
            filt = w_flat[torch.from_numpy(in_place_b(p, ph)).to(w.device)].T.reshape(p.C, jh, jw, p.K)
        else:
            filt = wt[ph.filter_offset : ph.filter_offset + p.C * jh * jw * p.K].reshape(p.C, jh, jw, p.K)
        reach_h, reach_w = (jh - 1) * ph.dil[0], (jw - 1) * ph.dil[1]
        src = F.pad(dy64, (ph.pad[1], j + reach_w, ph.pad[0], i + reach_h))  # right/bottom: zeros enough for I x J
        out = F.conv2d(src, filt.permute(0, 3, 1, 2), dilation=ph.dil)[:, :, :i, :j]
        dx[:, :, ph.rows.phase :: p.stride[0], ph.cols.phase :: p.stride[1]] = out
    dx[:, :, torch.from_numpy(zero_pixels(p)).to(dy.device)] = 0
    return dx


def workspace_bytes(p: Conv2dProblem) -> int:
    """The phase filters of the transposed path: every tap once, K·R·S·C elements of 2 bytes; none
    when the phase GEMMs read w in place (`in_place`)."""
    return 0 if in_place(p) else 2 * p.K * p.R * p.S * p.C


def dgrad_reason(p: Conv2dProblem, cfg: ProductionConfig | None = None) -> str | None:
    """None if the variant runs ``p``, else why not: groups, the zero kernel's phase masks (stride
    <= 32 where a pixel gets no tap), the instantiated tile, and the 32-bit arithmetic of the phase
    kernels (the phase GEMM-K Jh·Jw·K walk, the in-place B offsets R·S·C and r_step·S·C, the I·J and
    P·Q pixel indices, the dy rows a phase reaches; the zero kernel's is bounded by its grid).
    ``cfg`` is the phase GEMMs' configuration (None: the rule's, `choose_config`)."""
    if p.groups != 1:
        return f"needs groups = 1; got {p.groups}"
    if any(zero_masks(p)) and max(p.stride) > MAX_ZERO_STRIDE:
        return (f"needs stride <= {MAX_ZERO_STRIDE} on both axes where dx pixels get no tap (the zero kernel "
                f"takes each axis's phases without taps as a 32-bit mask); got stride {p.stride}")
    cfg = cfg or choose_config(p)
    if cfg.iterator not in instantiated().get(cfg.tile.name, ()):
        return f"{CU_FILE} has no entry for tile {cfg.tile.name} with the {cfg.iterator} iterator"
    if p.K * p.R * p.S + 2 * cfg.tile.bk > INT32_MAX:
        return f"GEMM-K = K*R*S = {p.K * p.R * p.S} plus two BK steps does not fit the kernel's 32-bit walk"
    big = max(max(p.R, p.stride[0]) * p.S * p.C, p.stride[1] * p.C)  # r_step <= stride_h, s_step <= stride_w
    if in_place(p) and big > INT32_MAX:
        return f"the in-place B offsets (R*S*C, r_step*S*C, s_step*C: up to {big}) do not fit the kernel's 32-bit ints"
    if p.P * p.Q > INT32_MAX:
        return f"P*Q = {p.P * p.Q} dy pixels per image do not fit the kernel's 32-bit pixel index"
    for ph in dgrad_plan(p):
        i, j = ph.pixels
        if i * j > INT32_MAX:
            return f"a phase's I*J = {i * j} dx pixels per image do not fit the kernel's 32-bit pixel index"
        for n_out, taps, pad, dil, size in ((i, ph.taps[0], ph.pad[0], ph.dil[0], p.P),
                                            (j, ph.taps[1], ph.pad[1], ph.dil[1], p.Q)):
            if n_out + max(taps - 1, 0) * dil + abs(pad) + size > INT32_MAX:
                return "a phase's dy reach (rows + filter reach + padding + size) does not fit 32-bit offsets"
    return None


def zero_launch(p: Conv2dProblem) -> tuple[LaunchConfig, int]:
    """(launch, elements per run) of ``dgrad_zero_phases``: grid x one block per dx row (n, h),
    grid y and ``ZERO_THREADS`` threads over the row's W pixels' runs of 8 channels (C % 8 == 0,
    else single elements)."""
    per = 8 if p.C % 8 == 0 else 1
    return LaunchConfig(grid=(p.N * p.H, cdiv(p.W * (p.C // per), ZERO_THREADS), 1), block=(ZERO_THREADS, 1, 1)), per


def dgrad_launches(p: Conv2dProblem, epilogue: Epilogue, cfg: ProductionConfig | None = None) -> list[KernelLaunch]:
    """On the transposed path (not `in_place`) first ``filter`` (dgrad_filter_phases on w ->
    workspace); then per `dgrad_plan` entry ``phase_<φh>_<φw>``: day 13's kernel on dy, B (w itself
    in place, else the phase filter, ``Buffer("workspace", offset)``) and dx (``dgrad_unit_*`` with
    unit stride: day 13's dense rows), with the phase's taps in w (R, S, first, step per axis);
    then, if some dx pixel gets no tap, ``zero``: ``dgrad_zero_phases`` on dx with `zero_masks`,
    those pixels set to 0. ``cfg``: the phase GEMMs' configuration (None: the rule's, `choose_config`)."""
    cfg = cfg or choose_config(p)
    t, i32, u32 = cfg.tile, np.int32, np.uint32
    from_w = in_place(p)
    out = []
    if not from_w:
        filt = LaunchConfig(grid=(cdiv(p.C, TRANSPOSE_TILE), cdiv(p.K, TRANSPOSE_TILE), p.R * p.S),
                            block=(256, 1, 1))
        out.append(KernelLaunch("filter", f"dgrad_filter_phases_{p.dtype}", filt,
                                (Buffer("w"), Buffer("workspace"), *map(i32, (p.K, p.C, p.R, p.S, *p.stride,
                                                                               *p.padding, *p.dilation)))))
    unit = "unit_" if p.stride == (1, 1) else ""
    entry = f"dgrad_{unit}{t.name}_{cfg.iterator}_{p.dtype}"
    for ph in dgrad_plan(p):
        i, j = ph.pixels
        where = f"{ph.rows.phase}_{ph.cols.phase}"
        m_tiles, n_tiles = cdiv(p.N * i * j, t.bm), cdiv(p.C, t.bn)
        lg = cfg.swizzle
        launch = LaunchConfig(grid=(m_tiles << lg, cdiv(n_tiles, 1 << lg), 1), block=(t.threads, 1, 1),
                              shared_bytes=t.shared_bytes)
        b = Buffer("w") if from_w else Buffer("workspace", 2 * ph.filter_offset)
        (r0, s0), (r_step, s_step) = ph.first, ph.step
        args = (Buffer("dy"), b, Buffer("dx"),
                *map(i32, (p.N, p.K, p.P, p.Q, p.C, *ph.taps, i, j, *ph.pad, *ph.dil, p.H, p.W, *p.stride,
                           ph.rows.phase, ph.cols.phase, p.R, p.S, r0, r_step, s0, s_step, lg)))
        out.append(KernelLaunch(f"phase_{where}", entry, launch, args))
    zh, zw = zero_masks(p)
    if zh or zw:
        out.append(KernelLaunch("zero", "dgrad_zero_phases", zero_launch(p)[0],
                                (Buffer("dx"), *map(i32, (p.H, p.W, p.C, *p.stride)), u32(zh), u32(zw))))
    return out


def dgrad_covers(p: Conv2dProblem, launch: LaunchConfig, cfg: ProductionConfig | None = None) -> np.ndarray:
    """Writes per dx element (NHWC, flat) of every launch that writes dx: phase (φh, φw) writes its
    GEMM tiles (`tile_visits`, `gemm_writes` of N·I·J rows by C) at dx pixels (n, φh + sh·i,
    φw + sw·j); ``zero`` writes, in the rows (n, h) and runs of a row its grid reaches, the
    `zero_pixels`. ``launch`` is the last launch's configuration (the one
    `helpers.variants.Variant.with_output_launch` may change); the others come from `dgrad_launches`.
    ``cfg``: the phase GEMMs' configuration (None: the rule's, `choose_config`)."""
    cfg = cfg or choose_config(p)
    t = cfg.tile
    counts = np.zeros((p.N, p.H, p.W, p.C), dtype=np.int64)
    configs = {k.name: k.config for k in dgrad_launches(p, PLAIN, cfg)}
    configs[list(configs)[-1]] = launch
    for ph in dgrad_plan(p):
        i, j = ph.pixels
        m = p.N * i * j
        where = f"{ph.rows.phase}_{ph.cols.phase}"
        visits = tile_visits(configs[f"phase_{where}"].grid, cdiv(m, t.bm), cdiv(p.C, t.bn), cfg.swizzle)
        w = gemm_writes(m, p.C, t.bm, t.bn, visits).reshape(p.N, i, j, p.C)
        counts[:, ph.rows.phase :: p.stride[0], ph.cols.phase :: p.stride[1], :] += w
    if "zero" in configs:  # block x = dx row (n, h), (block y, thread) = run of the row
        _, per = zero_launch(p)
        gx, gy, _ = configs["zero"].grid
        row_hit = (np.arange(p.N * p.H) < gx).reshape(p.N, p.H, 1, 1)
        run_hit = (np.arange(p.W * (p.C // per)) < gy * ZERO_THREADS).reshape(1, 1, p.W, p.C // per)
        hit = row_hit & run_hit & zero_pixels(p)[None, :, :, None]
        counts += hit.astype(np.int64).repeat(per, axis=3)
    return counts.ravel()


def dgrad_tensor_check(p: Conv2dProblem, tensors: dict, epilogue: Epilogue) -> str | None:
    """The 16-byte alignments the kernels' vector accesses need, None or the reason: dy and w for
    the optimized iterator's cp.async copies (w read in place); w also on the transposed path when
    C and K are multiples of 8 (``dgrad_filter_phases`` then reads w in 16-byte loads: with R or
    S > 16, past the optimized iterator's tap masks); dx when C % 8 == 0 (16-byte stores)."""
    if in_place(p):
        need = {"dy": VEC_BYTES, "w": VEC_BYTES}
    elif p.C % 8 == 0 and p.K % 8 == 0:
        need = {"w": VEC_BYTES}
    else:
        need = {}
    why = "the 16-byte cp.async copies" if in_place(p) else "the filter kernel's 16-byte loads"
    reason = alignment_reason(tensors, need, why)
    if reason is None and p.C % 8 == 0:
        reason = alignment_reason(tensors, {"dx": VEC_BYTES}, "the epilogue's 16-byte stores")
    return reason


def make_dgrad(name: str = "dgrad", tile: TileDescription | str | None = None, swizzle: int | None = None) -> Variant:
    """A dgrad variant (not registered) with the phase GEMMs' tile and/or swizzle forced (None: the
    rule, `choose_config`); the iterator is always `dgrad_iterator`'s. A forced tile the ``.cu``
    file does not instantiate with a problem's iterator is refused per problem, with the reason.

    Raises:
        ValueError: a tile name that does not parse, or a swizzle outside 0..4.
    """
    t = TileDescription.parse(tile) if isinstance(tile, str) else tile
    if swizzle is not None and not 0 <= swizzle <= 4:
        raise ValueError(f"swizzle = {swizzle}: log2 of the filter tiles per A tile, 0 .. 4")

    def config_fn(p: Conv2dProblem) -> ProductionConfig:
        rule = choose_config(p)
        tt = t or rule.tile
        if swizzle is not None:
            sw = swizzle
        else:
            sw = rule.swizzle if t is None else choose_swizzle(phase_gemm_problem(p), tt)
        return ProductionConfig(tt, rule.iterator, sw)

    forced = ", ".join(f"{k}={v}" for k, v in (("tile", t.name if t else None), ("swizzle", swizzle)) if v is not None)
    return Variant(
        name=name,
        day=14,
        cu_file=CU_FILE,
        summary="dgrad: day 13's kernel once per filter phase over dy, w read in place (or transposed first)"
        + (f" ({forced})" if forced else ""),
        config_fn=config_fn,
        supports_fn=dgrad_reason,
        launches_fn=dgrad_launches,
        covers_fn=dgrad_covers,
        op="dgrad",
        dtypes=("fp16", "bf16"),
        layouts=("NHWC",),
        accum="fp32",
        workspace_fn=lambda p, cfg: workspace_bytes(p),
        tensor_check_fn=lambda p, tensors, ep, cfg: dgrad_tensor_check(p, tensors, ep),
        min_cc=TENSOR_CORE_CC,
        min_cc_why="day 13's cp.async, mma.sync m16n8k16 with bf16, ldmatrix",
    )


DGRAD = register(make_dgrad())

__all__ = ["CU_FILE", "DGRAD", "PhaseLaunch", "choose_config", "dgrad_iterator", "dgrad_plan", "filter_phases",
           "make_dgrad",
           "in_place", "in_place_b", "instantiated", "phase_conv", "phase_gemm_problem", "phase_taps", "simulate",
           "workspace_bytes", "zero_masks", "zero_pixels"]
