"""Day 07: full ``conv2d`` semantics (``general``) and a fast ``depthwise``.

* ``general`` (``07_general.cu``): any batch, stride, padding, dilation, filter shape and groups.
  Output pixels of the whole batch form one flat list (grid x); blocks of ``GEN_KPT`` output
  channels of one group run along grid z (capped at 65,535 and grid-strided).
* ``depthwise`` (``07_depthwise.cu``): groups = C = K. A block stages an input tile (halo and
  zero padding included) in shared memory with float4 loads, then each thread computes
  ``DW_QPT`` consecutive outputs of a row. The tile shape (planes per block, output rows per
  tile, row segments per tile) is chosen here by `dw_config` and passed to the kernel.

As on the earlier days, each entry has a ``covers`` model written from its kernel's mapping;
it counts the writes per output element with vectorised numpy, so it stays cheap for the
edge suite's K = 70,000 and P = 600,000 problems.
"""

from __future__ import annotations

import numpy as np

from helpers.problem import Conv2dProblem
from helpers.variants import INT32_MAX, MAX_GRID, LaunchConfig, Variant, register

from .kit import (
    FULL_SIZES,
    cdiv,
    ceil_div_reason,
    grid_stride_items,
    input_reach_reason,
    int32_reason,
    pack,
    single_kernel,
    stride_loop_reason,
)


def _round4(v: int) -> int:
    return (v + 3) // 4 * 4


def _next_pow2(v: int) -> int:
    return 1 if v <= 1 else 1 << (v - 1).bit_length()


# ---- day 07: general -------------------------------------------------------------------------
GEN_DEFINES = {"GEN_BLOCK": 256, "GEN_PPT": 4, "GEN_KPT": 8, "GEN_TAPS": 128}


def general_launch(p: Conv2dProblem) -> LaunchConfig:
    d = GEN_DEFINES
    m = p.N * p.P * p.Q
    kblocks = cdiv(p.K // p.groups, d["GEN_KPT"])
    grid = (cdiv(m, d["GEN_BLOCK"] * d["GEN_PPT"]), 1, min(p.groups * kblocks, MAX_GRID[2]))
    return LaunchConfig(grid=grid, block=(d["GEN_BLOCK"], 1, 1))


def general_supports(p: Conv2dProblem) -> str | None:
    """Every problem (the dtype/layout checks live in `Variant.supports`) within the kernel's
    32-bit ints: ``int CRS = Cg*R*S`` and the tap-round loop ``j0 += GEN_TAPS`` over it;
    ``kblocks = CEIL_DIV(K/groups, GEN_KPT)`` and the channel-block loop ``gk += gridDim.z`` over
    groups * kblocks; the input coordinates p*sh - ph + r*dh and q*sw - pw + s*dw; and hb + r*dh
    of the threads past the last pixel, whose hb is H. None, or the reason."""
    d = GEN_DEFINES
    crs = p.C_per_group * p.R * p.S
    taps = d["GEN_TAPS"]
    if crs > INT32_MAX:
        wrapped = (crs + 2**31) % 2**32 - 2**31
        return int32_reason("CRS = Cg*R*S", crs, f"the taps per output; it wraps to {wrapped}")
    reason = stride_loop_reason("GEN_TAPS", (cdiv(crs, taps) - 1) * taps, taps, "j0")
    if reason:
        return reason
    kg = p.K // p.groups
    reason = ceil_div_reason("kblocks", kg, d["GEN_KPT"])
    if reason:
        return reason
    gk = p.groups * cdiv(kg, d["GEN_KPT"])
    reason = stride_loop_reason("gridDim.z", gk - 1, min(gk, MAX_GRID[2]), "gk") or input_reach_reason(p)
    if reason:
        return reason
    if (p.N * p.P * p.Q) % (d["GEN_BLOCK"] * d["GEN_PPT"]) and p.R > 1:  # threads past the last pixel exist
        return int32_reason("hb + r*dh with hb = H (a thread past the last pixel)",
                            p.H + (p.R - 1) * p.dilation[0], "its row test")
    return None


def general_covers(p: Conv2dProblem, cfg: LaunchConfig) -> np.ndarray:
    block, ppt, kpt = cfg.block[0], GEN_DEFINES["GEN_PPT"], GEN_DEFINES["GEN_KPT"]
    # Pixels: thread t of block bx owns m = bx*block*ppt + i*block + t, i < ppt; stored if m < M.
    M = p.N * p.P * p.Q
    bx, i, t = np.ogrid[: cfg.grid[0], :ppt, :block]
    m = (bx * (block * ppt) + i * block + t).ravel()
    pix = np.bincount(m[m < M], minlength=M)
    # Channels: gk = blockIdx.z, step gridDim.z; channel g*Kg + kb*kpt + kk stored if local < Kg.
    kg = p.K // p.groups
    kblocks = cdiv(kg, kpt)
    gk = grid_stride_items(p.groups * kblocks, cfg.grid[2])
    local = (gk % kblocks)[:, None] * kpt + np.arange(kpt)[None, :]
    k = (gk // kblocks)[:, None] * kg + local
    chans = np.bincount(k[local < kg], minlength=p.K)
    pq = p.P * p.Q
    return (pix.reshape(p.N, 1, pq) * chans.reshape(1, p.K, 1)).ravel()


register(
    Variant(
        name="general",
        day=7,
        cu_file="07_general.cu",
        summary="every conv2d option (batch, stride, padding, dilation, any filter, groups); "
        "4 pixels x 8 output channels per thread, filters staged in shared memory",
        supports_fn=general_supports,
        launches_fn=single_kernel("conv2d_general", general_launch, f"x w y {FULL_SIZES} groups"),
        covers_fn=general_covers,
        defines=dict(GEN_DEFINES),
    )
)


# ---- day 07: depthwise -----------------------------------------------------------------------
DW_DEFINES = {"DW_BLOCK": 256, "DW_QPT": 4, "DW_FILL": 4}  # DW_MIN_BLOCKS: the .cu default per arch
DW_SEG_MAX = 64  # row segments per tile: at most 64 * DW_QPT = 256 output columns
DW_ROWS_PER_THREAD = 4  # aim for ~4 row segments per thread
DW_SMEM_TARGET = 32 * 1024  # a soft limit that leaves room for 5-7 blocks per SM
DW_SMEM_MAX = 48 * 1024  # the hard limit (no opt-in needed on any GPU)
DW_MIN_GRID = 256  # do not pack planes so tightly that fewer blocks than this remain


def dw_geometry(p: Conv2dProblem, PL: int, TP: int, NSEG: int) -> dict:
    """Tile sizes of the depthwise kernel for ``PL`` planes x ``TP`` rows x ``NSEG`` segments.

    The same formulas as the kernel: TQ output columns, TH x TW input tile per plane (TW a
    multiple of 4), RSP weights per plane, the most 4-column chunks a tile row can touch, the
    dynamic shared memory in bytes.
    """
    sh, sw = p.stride
    dh, dw = p.dilation
    qpt = DW_DEFINES["DW_QPT"]
    tq = NSEG * qpt
    th = (TP - 1) * sh + (p.R - 1) * dh + 1
    tw = _round4((tq - 1) * sw + (p.S - 1) * dw + 1)
    rsp = _round4(p.R * p.S)
    return {
        "TQ": tq,
        "TH": th,
        "TW": tw,
        "RSP": rsp,
        "max_chunks": tw // 4 + 1,  # a tile row starting at any column meets at most this many
        "smem": 4 * (PL * th * (tw + 8) + PL * rsp),  # row pitch tw + 8 (4 spare columns each side)
    }


def dw_config(p: Conv2dProblem) -> tuple[int, int, int]:
    """``(PL, TP, NSEG)``: planes per block, output rows per tile, DW_QPT-column segments per row.

    1. Columns: all of a row if it has at most DW_SEG_MAX segments, else equal column tiles.
    2. Rows: about DW_ROWS_PER_THREAD segments per thread; a plane that is smaller than that is
       taken whole, several planes per block (but at least DW_MIN_GRID blocks if there are
       enough planes); a larger plane is cut into equal strips.
    3. Shared memory over DW_SMEM_TARGET: fewer planes, then fewer rows, then fewer columns.
    """
    block, qpt = DW_DEFINES["DW_BLOCK"], DW_DEFINES["DW_QPT"]
    nc = p.N * p.C
    nseg_all = cdiv(p.Q, qpt)
    nseg = cdiv(nseg_all, cdiv(nseg_all, DW_SEG_MAX))
    while nseg > 1 and dw_geometry(p, 1, 1, nseg)["max_chunks"] > block:  # wide strides/filters
        nseg = cdiv(nseg, 2)
    rows_target = DW_ROWS_PER_THREAD * (block // _next_pow2(nseg))
    if p.P <= rows_target:
        tp = p.P
        pl = max(1, min(nc, rows_target // p.P, max(1, nc // DW_MIN_GRID)))
    else:
        tp = cdiv(p.P, cdiv(p.P, rows_target))
        pl = 1
    while dw_geometry(p, pl, tp, nseg)["smem"] > DW_SMEM_TARGET:
        if pl > 1:
            pl = max(1, DW_SMEM_TARGET // dw_geometry(p, 1, tp, nseg)["smem"])
        elif tp > 1:
            tp = cdiv(tp, 2)
            tp = cdiv(p.P, cdiv(p.P, tp))  # equal strips
        elif nseg > 1:
            nseg = cdiv(nseg, 2)
        else:
            break  # the smallest tile; `depthwise_supports` refuses it past DW_SMEM_MAX
    return pl, tp, nseg


def depthwise_supports(p: Conv2dProblem) -> str | None:
    if not (p.groups == p.C == p.K):
        return f"needs groups = C = K (depthwise, channel multiplier 1); got C={p.C}, K={p.K}, groups={p.groups}"
    pl, tp, nseg = dw_config(p)
    g = dw_geometry(p, pl, tp, nseg)
    if g["smem"] > DW_SMEM_MAX or g["max_chunks"] > DW_DEFINES["DW_BLOCK"]:
        rr = p.dilation[0] * (p.R - 1) + 1
        ss = p.dilation[1] * (p.S - 1) + 1
        return (
            f"the dilated {rr}x{ss} filter with stride {p.stride} needs a {g['TH']}x{g['TW']} input tile "
            f"even for {tp} output row(s) x {g['TQ']} columns ({g['smem']} B of shared memory); the kernel "
            f"allows {DW_SMEM_MAX} B and rows of at most {4 * (DW_DEFINES['DW_BLOCK'] - 1)} columns"
        )
    return depthwise_int32_reason(p, pl, tp, g)


def depthwise_int32_reason(p: Conv2dProblem, pl: int, tp: int, g: dict) -> str | None:
    """The depthwise kernel's 32-bit ints for the tile of `dw_config` (``pl`` planes, ``tp`` rows,
    geometry ``g`` from `dw_geometry`): ``CT = CEIL_DIV(Q, TQ)`` and ``ST = CEIL_DIV(P, TP)``;
    the input rows h0 + i (i < TH) of the last strip and the columns of the last column tile's
    4-column chunks (``(w0 + TW - 1) >> 2``, up to ``wc + 3``), with the products p0*sh, q0*sw;
    the row step ``dh * pitch``; and the filter channel ``(c0 + pl) % C`` of a block whose planes
    run into the next image (c0 + pl can reach 2^31 when C + PL - 2 > INT32_MAX). None, or the
    reason."""
    tq = g["TQ"]
    reason = ceil_div_reason("CT", p.Q, tq) or ceil_div_reason("ST", p.P, tp)
    if reason:
        return reason
    (sh, sw), (ph, pw), dh = p.stride, p.padding, p.dilation[0]
    p0, q0 = (cdiv(p.P, tp) - 1) * tp, (cdiv(p.Q, tq) - 1) * tq  # the last strip's first row, last tile's column
    w_end = q0 * sw - pw + g["TW"] - 1  # w0 + TW - 1
    reason = (
        int32_reason("the last strip's input row p0*sh - ph + i (i < TH)", max(p0 * sh, p0 * sh - ph + g["TH"] - 1),
                     "the tile fill's rows")
        or int32_reason("the last column tile's input column: q0*sw, then (w0 + TW - 1) and its chunks up to wc + 3",
                        max(q0 * sw, w_end // 4 * 4 + 3), "the chunk count n_ch would go negative: no fill")
        or int32_reason("the row step dh*pitch", dh * (g["TW"] + 8), "the filter-row step in the tile")
    )
    if reason:
        return reason
    if p.N > 1 and p.C + pl - 2 > INT32_MAX:
        # Block planes nc0 .. nc0 + npl - 1 take channels (c0 + pl) % C, c0 = nc0 % C: the value 2^31 is
        # reached at plane n*C + 2^31 (in image n + 1) when the block holding it starts in image n, i.e.
        # when (n*C + 2^31) % PL > 2^31 - C; periodic in n with a period dividing PL.
        for n in range(min(p.N - 1, pl)):
            if (n * p.C + 2**31) % pl > 2**31 - p.C:
                return int32_reason(
                    f"the filter channel c0 + pl of a block of PL = {pl} planes from image {n} into {n + 1}",
                    2**31,
                    "(c0 + pl) % C would be negative: a weight read before w",
                )
    return None


def depthwise_launch(p: Conv2dProblem) -> LaunchConfig:
    pl, tp, nseg = dw_config(p)
    g = dw_geometry(p, pl, tp, nseg)
    blocks = cdiv(p.N * p.C, pl) * cdiv(p.P, tp) * cdiv(p.Q, g["TQ"])
    return LaunchConfig(grid=(blocks, 1, 1), block=(DW_DEFINES["DW_BLOCK"], 1, 1), shared_bytes=g["smem"])


def depthwise_args(p: Conv2dProblem) -> tuple:
    """x, w, y, the full sizes and groups, then the tile shape ``PL, TP, NSEG`` from `dw_config`."""
    pl, tp, nseg = dw_config(p)
    return pack(p, f"x w y {FULL_SIZES} groups PL TP NSEG", PL=np.int32(pl), TP=np.int32(tp), NSEG=np.int32(nseg))


def depthwise_covers(p: Conv2dProblem, cfg: LaunchConfig) -> np.ndarray:
    """Writes per output element, from the kernel's block and thread mapping.

    A block (plane group pg, strip st, column tile ct) writes plane pg*PL + pl, row st*TP + tp,
    columns ct*TQ + sg*DW_QPT + u for every (pl, tp, sg) some thread visits, when inside the
    output. The count factorises over planes, rows and columns given the per-block visit
    counts, so it is computed as small matrix products instead of a loop over blocks.
    """
    block, qpt = cfg.block[0], DW_DEFINES["DW_QPT"]
    pl_n, tp_n, nseg = dw_config(p)
    tq = nseg * qpt
    nc = p.N * p.C
    ct_n, st_n = cdiv(p.Q, tq), cdiv(p.P, tp_n)
    # Block decode, as in the kernel: blockIdx.x = (pg * ST + st) * CT + ct. With div/mod this is
    # a bijection onto [0, n_pg) x [0, ST) x [0, CT) exactly when grid x is their product.
    n_pg = cdiv(nc, pl_n)
    if cfg.grid[0] != n_pg * st_n * ct_n:
        raise AssertionError(f"grid x {cfg.grid[0]} != {n_pg} plane groups x {st_n} strips x {ct_n} column tiles")
    # Items a block's threads visit: thread t takes segment sg = t % GS of output rows
    # t // GS, + block // GS, ... (rows counted over the block's PL*TP rows).
    gs = _next_pow2(nseg)
    visits = np.zeros((pl_n * tp_n, nseg), dtype=np.int64)
    for t in range(block):
        sg = t % gs
        if sg < nseg:
            visits[t // gs :: block // gs, sg] += 1
    visits = visits.reshape(pl_n, tp_n, nseg)
    # Per-dimension incidence: A[nc, pl] = #pg with pg*PL + pl = nc, etc., over the blocks' values.
    a = np.zeros((nc, pl_n))
    pgs, pls = np.meshgrid(np.arange(n_pg), np.arange(pl_n), indexing="ij")
    ncs = pgs * pl_n + pls
    np.add.at(a, (ncs[ncs < nc], pls[ncs < nc]), 1)
    brow = np.zeros((p.P, tp_n))
    sts, tps = np.meshgrid(np.arange(st_n), np.arange(tp_n), indexing="ij")
    ps = sts * tp_n + tps
    np.add.at(brow, (ps[ps < p.P], tps[ps < p.P]), 1)
    ccol = np.zeros((p.Q, nseg))
    cts, sgs, us = np.meshgrid(np.arange(ct_n), np.arange(nseg), np.arange(qpt), indexing="ij")
    qs = cts * tq + sgs * qpt + us
    np.add.at(ccol, (qs[qs < p.Q], sgs[qs < p.Q]), 1)
    # count[nc, p, q] = sum_{pl, tp, sg} visits[pl, tp, sg] * A[nc, pl] * B[p, tp] * Cc[q, sg]
    t1 = np.einsum("lts,qs->ltq", visits, ccol)  # [pl, tp, q]
    t2 = np.einsum("pt,ltq->lpq", brow, t1)  # [pl, p, q]
    counts = a @ t2.reshape(pl_n, -1)  # [nc, p*q]
    return np.rint(counts).astype(np.int64).ravel()


register(
    Variant(
        name="depthwise",
        day=7,
        cu_file="07_depthwise.cu",
        summary="depthwise (groups = C = K): input tile + halo staged once in shared memory with "
        "float4 loads, 4 outputs per thread from registers; 3x3 stride 1/2 unrolled",
        supports_fn=depthwise_supports,
        launches_fn=single_kernel("conv2d_depthwise", depthwise_launch, depthwise_args),
        covers_fn=depthwise_covers,
        defines=dict(DW_DEFINES),
    )
)
