"""Day 08: ``im2col`` — lower the convolution to a matrix, then one SGEMM.

``kernels/conv2d/08_im2col.cu`` holds two kernels, launched one after the other (two
`helpers.variants.KernelLaunch` es, ``"im2col"`` then ``"gemm"``):

1. ``im2col_nhwc`` copies the receptive field of every output pixel into one row of the lowered
   matrix ``col`` (the variant's workspace): M = N·P·Q rows, GEMM-K = R·S·C columns in (r, s, c)
   order with c fastest, the order of a KRSC filter row; zero where a tap falls in the padding.
2. ``sgemm_nt_128x128`` / ``sgemm_nt_128x64`` compute Y = col · Wᵀ, where W is the KRSC filter
   viewed as a K × R·S·C matrix and Y the NHWC output viewed as M × K. A tiled SGEMM on CUDA
   cores: 128 × BN block tiles, BK = 8, 8 × 8 (or 8 × 4) outputs per thread, both operands
   staged transposed in shared memory, the next step's global loads in flight during the FMAs.

Tensors (fp32, layout "NHWC"): x (N, H, W, C), w (K, R, S, C), y (N, P, Q, K); groups = 1; any
stride, padding, dilation and filter shape. The workspace holds M·R·S·C floats — about R·S /
(stride_h·stride_w) times the input — and is refused above `WORKSPACE_CAP` bytes.

Sources: im2col ("unfolding" the input so a convolution becomes one matrix product) is from
K. Chellapilla, S. Puri, P. Simard, "High Performance Convolutional Neural Networks for Document
Processing", IWFHR 2006. The SGEMM tiling (block tile in shared memory, thread tile in registers,
outer products along K, double buffering) follows NVIDIA's CUTLASS documentation, "Efficient
GEMM in CUDA" (docs/efficient_gemm.md).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from helpers import gpu
from helpers.launch import bind, compile_launches, prepare
from helpers.problem import Conv2dProblem
from helpers.variants import INT32_MAX, MAX_GRID, Buffer, KernelLaunch, LaunchConfig, Variant, register

from .kit import cdiv, chunks16, gemm_writes, grid_stride_counts, grid_stride_items, input_reach_reason, pack

IM2COL_DEFINES = {"IM2COL_BLOCK": 256}
GEMM_BM, GEMM_BK, GEMM_THREADS = 128, 8, 256  # the .cu's fixed tile; BN is 128 or 64 (two entries)
WORKSPACE_CAP = 8 * 2**30  # bytes: the largest lowered matrix `im2col` allocates (8 GiB)
MAX_COL_ELEMENTS = 2**32 - 1  # im2col_nhwc's flat index is a 32-bit unsigned integer
MAX_GEMM_DIM = INT32_MAX - GEMM_BM  # tile starts + 127 must stay in int32 inside the SGEMM


# ---- sizes -----------------------------------------------------------------------------------


def lowered_shape(p: Conv2dProblem) -> tuple[int, int]:
    """``(M, GEMM-K)`` = ``(N·P·Q, R·S·C)``: rows and columns of the lowered matrix."""
    return p.N * p.P * p.Q, p.R * p.S * p.C


def lowered_bytes(p: Conv2dProblem) -> int:
    """Bytes of the lowered matrix (the workspace): M · R·S·C · itemsize (4 for fp32)."""
    m, gk = lowered_shape(p)
    return m * gk * p.itemsize


def input_bytes(p: Conv2dProblem) -> int:
    """Bytes of the input x, N·H·W·C · itemsize (what im2col reads)."""
    return p.x_numel * p.itemsize


def blowup(p: Conv2dProblem) -> float:
    """``lowered_bytes / input_bytes``: about R·S / (stride_h·stride_w) away from the borders
    (9 for a 3×3 stride-1 layer, 1/4 for a strided 1×1, which only reads every other pixel)."""
    return lowered_bytes(p) / input_bytes(p)


def col_view(p: Conv2dProblem, workspace: torch.Tensor) -> torch.Tensor:
    """The workspace bytes (`helpers.launch.Prepared.workspace`) as the (M, R·S·C) fp32 matrix."""
    return workspace.view(torch.float32).view(*lowered_shape(p))


# ---- the two steps ---------------------------------------------------------------------------


def im2col_vec(p: Conv2dProblem) -> int:
    """Columns per im2col thread: 4 (one float4) when C % 4 == 0, else 1. The kernel falls back to
    1 by itself if a pointer is not 16-byte aligned; the grid-stride loop covers either way."""
    return 4 if chunks16(p.C, p) else 1


def im2col_launch(p: Conv2dProblem) -> LaunchConfig:
    """One thread per `im2col_vec` columns of col: grid x = ceil(M·GK/V / IM2COL_BLOCK), capped."""
    m, gk = lowered_shape(p)
    block = IM2COL_DEFINES["IM2COL_BLOCK"]
    return LaunchConfig(grid=(min(cdiv(m * gk // im2col_vec(p), block), MAX_GRID[0]), 1, 1), block=(block, 1, 1))


def gemm_bn(p: Conv2dProblem) -> int:
    """Filters per block tile: 64 when K <= 64 (a 128-wide tile would be half empty), else 128."""
    return 64 if p.K <= 64 else 128


def gemm_entry(p: Conv2dProblem) -> str:
    return f"sgemm_nt_128x{gemm_bn(p)}"


def gemm_launch(p: Conv2dProblem) -> LaunchConfig:
    """Grid (ceil(K/BN), min(ceil(M/128), 65535), 1): x over filter tiles, y over pixel tiles
    (grid-strided past 65,535); 256 threads; static shared memory only."""
    m, _ = lowered_shape(p)
    return LaunchConfig(
        grid=(cdiv(p.K, gemm_bn(p)), min(cdiv(m, GEMM_BM), MAX_GRID[1]), 1), block=(GEMM_THREADS, 1, 1)
    )


def im2col_launches(p: Conv2dProblem, epilogue=None) -> list[KernelLaunch]:
    """im2col (x -> workspace: N, C, H, W, R, S, P, Q, strides, paddings, dilations), then the SGEMM
    (workspace, w -> y: GEMM-M, GEMM-N, GEMM-K = M, K, R·S·C)."""
    m, gk = lowered_shape(p)
    return [
        KernelLaunch("im2col", "im2col_nhwc", im2col_launch(p),
                     pack(p, "x workspace N C H W R S P Q stride_h stride_w pad_h pad_w dil_h dil_w")),
        KernelLaunch("gemm", gemm_entry(p), gemm_launch(p),
                     pack(p, "workspace w y GM GN GK", GM=np.int32(m), GN=np.int32(p.K), GK=np.int32(gk))),
    ]


def im2col_supports(p: Conv2dProblem) -> str | None:
    """groups = 1, and a lowered matrix within `WORKSPACE_CAP` and the kernels' index ranges; the
    input coordinates im2col_nhwc forms in int (`days.kit.input_reach_reason`)."""
    if p.groups != 1:
        return (
            f"needs groups=1; got {p.groups} (a grouped convolution is {p.groups} separate GEMMs; "
            "use `general` or `depthwise`, NCHW)"
        )
    m, gk = lowered_shape(p)
    nbytes = lowered_bytes(p)
    if nbytes > WORKSPACE_CAP:
        return (
            f"the lowered matrix would be M x R*S*C = {m:,} x {gk:,} fp32 = {nbytes / 2**30:.1f} GiB, over the "
            f"workspace cap of {WORKSPACE_CAP / 2**30:g} GiB (days.day08_im2col.WORKSPACE_CAP)"
        )
    if m * gk > MAX_COL_ELEMENTS:
        return f"the lowered matrix has {m * gk:,} elements; im2col_nhwc indexes it with 32 bits (< 2^32)"
    for nm, val in (("GEMM-M = N*P*Q", m), ("GEMM-N = K", p.K), ("GEMM-K = R*S*C", gk)):
        if val > MAX_GEMM_DIM:
            return f"{nm} = {val:,} is over {MAX_GEMM_DIM:,}, the SGEMM's int32 tile arithmetic"
    return input_reach_reason(p)  # im2col_nhwc's int h = p*sh - ph + r*dh, w = q*sw - pw + s*dw


def workspace_bytes(p: Conv2dProblem) -> int:
    """The workspace `prepare` allocates: the lowered matrix, `lowered_bytes`."""
    return lowered_bytes(p)


# ---- Python models of the kernels' writes ----------------------------------------------------


def _tile_hits(bn: int) -> tuple[np.ndarray, np.ndarray]:
    """How often the block's threads store each row (of 128) and each column (of BN) of a tile.

    The 256 threads are 16 x 16: thread (tm, tn) = (tid / 16, tid % 16) stores rows 4·tm + i and
    64 + 4·tm + i (i < 4) times columns 4·tn + 64·h + j (j < 4, h < BN/64), so the stores of
    (row, column) number row_hits[row] · col_hits[column].
    """
    t = np.arange(16)
    rows = np.concatenate([4 * t[:, None] + np.arange(4), 64 + 4 * t[:, None] + np.arange(4)], axis=1)
    cols = 4 * t[:, None, None] + 64 * np.arange(bn // 64)[None, :, None] + np.arange(4)[None, None, :]
    return np.bincount(rows.ravel(), minlength=GEMM_BM), np.bincount(cols.ravel(), minlength=bn)


def gemm_covers(p: Conv2dProblem, cfg: LaunchConfig) -> np.ndarray:
    """Writes per element of y (NHWC flat, = Y[m][k] row-major) by the SGEMM launch ``cfg``.

    Block (bx, by) takes filter tile bx and pixel tiles by, by + gridDim.y, ... (grid-stride);
    inside a tile the threads store `_tile_hits` (rows x columns), guarded by m < M, k < K.
    """
    m, _ = lowered_shape(p)
    bn = gemm_bn(p)
    row_hits, col_hits = _tile_hits(bn)
    m_tiles, n_tiles = cdiv(m, GEMM_BM), cdiv(p.K, bn)
    visits = np.outer(grid_stride_counts(m_tiles, 1, cfg.grid[1]),
                      np.bincount(np.arange(cfg.grid[0]), minlength=n_tiles)[:n_tiles])
    return gemm_writes(m, p.K, GEMM_BM, bn, visits, row_hits, col_hits)


def im2col_writes(p: Conv2dProblem, cfg: LaunchConfig | None = None, vec: int | None = None) -> np.ndarray:
    """Writes per element of col (flat, M·GK) by the im2col launch: the thread with flat index e
    (grid-stride) writes columns e·V .. e·V + V − 1 of the flat matrix."""
    cfg = cfg or im2col_launch(p)
    v = vec or im2col_vec(p)
    m, gk = lowered_shape(p)
    groups = m * gk // v
    e = grid_stride_items(groups, cfg.grid[0] * cfg.block[0])
    counts = np.bincount(e, minlength=groups)
    return np.repeat(counts, v)


# ---- references: the lowered matrix three ways -----------------------------------------------


def lower_emulate(p: Conv2dProblem, x: torch.Tensor | np.ndarray, vec: int | None = None) -> np.ndarray:
    """The lowered matrix computed with ``im2col_nhwc``'s own index arithmetic, in numpy.

    Every thread's flat index e is decoded as in the kernel — m = e / (GK/V), j = (e % (GK/V))·V,
    (r, s, c) from j, (n, p, q) from m, then the input position (h, w) — and col[m][j + i] is
    read from the flat NHWC input, or 0 outside the image. Args: x (N, H, W, C), any device.
    Returns an (M, R·S·C) float array (x's dtype).
    """
    xf = (x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)).reshape(-1)
    v = vec or im2col_vec(p)
    m_rows, gk = lowered_shape(p)
    gv = gk // v
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
    e = np.arange(m_rows * gv, dtype=np.int64)
    m = e // gv
    j = (e - m * gv) * v
    rs, c = j // p.C, j % p.C
    r, s = rs // p.S, rs % p.S
    n, pq = m // (p.P * p.Q), m % (p.P * p.Q)
    pp, q = pq // p.Q, pq % p.Q
    h, w = pp * sh - ph + r * dh, q * sw - pw + s * dw
    inside = (h >= 0) & (h < p.H) & (w >= 0) & (w < p.W)
    src = ((n * p.H + h) * p.W + w) * p.C + c
    col = np.zeros((m_rows * gv, v), dtype=xf.dtype)
    for i in range(v):  # the V consecutive channels of one thread
        col[inside, i] = xf[src[inside] + i]
    return col.reshape(m_rows, gk)


def lower_reference(p: Conv2dProblem, x: torch.Tensor) -> torch.Tensor:
    """The lowered matrix from ``torch.nn.functional.unfold``, reordered to im2col_nhwc's layout.

    unfold gives (N, C·R·S, P·Q) with (c, r, s) rows, c slowest; we permute to rows (n, p, q) and
    columns (r, s, c), c fastest. Args: x (N, H, W, C) on any device. Returns (M, R·S·C).
    """
    cols = F.unfold(p.to_nchw(x), (p.R, p.S), dilation=p.dilation, padding=p.padding, stride=p.stride)
    cols = cols.view(p.N, p.C, p.R, p.S, p.P * p.Q).permute(0, 4, 2, 3, 1)  # (N, PQ, R, S, C)
    return cols.reshape(*lowered_shape(p))


# ---- the steps on their own (GPU) --------------------------------------------------------------


def lower(p: Conv2dProblem, x: torch.Tensor) -> torch.Tensor:
    """Run only ``im2col_nhwc`` on x (N, H, W, C; CUDA) and return the (M, R·S·C) lowered matrix.

    Raises:
        see `helpers.launch.prepare` (an unsupported problem, bad tensors, no GPU).
    """
    w = torch.zeros(p.w_shape, dtype=p.torch_dtype, device=x.device)  # unused by the im2col step
    plan, _ = prepare("im2col", p, x, w)
    plan.kernels["im2col"]()
    torch.cuda.synchronize()
    return col_view(p, plan.workspace)


def sgemm_nt(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``out = a @ b.T`` with this day's SGEMM kernel alone (a: (M, GK), b: (GN, GK), out: (M, GN)).

    Args:
        a, b: 2-D contiguous fp32 CUDA tensors on one device, GEMM-K contiguous in both.
        out: a contiguous fp32 (M, GN) tensor on the same device, or None to allocate one.

    Raises:
        TypeError: not tensors, or not fp32.
        ValueError: wrong ranks or shapes, not contiguous, not on one CUDA device, or sizes past
            the kernel's int32 range; all before any launch.
    """
    named = (("a", a), ("b", b)) + ((("out", out),) if out is not None else ())
    for nm, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{nm} must be a torch.Tensor; got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise TypeError(f"{nm} must be torch.float32; got {t.dtype}")
        if t.dim() != 2 or not t.is_contiguous():
            raise ValueError(f"{nm} must be a contiguous 2-D tensor; got shape {tuple(t.shape)}, strides {t.stride()}")
    (m, gk), (gn, gk2) = a.shape, b.shape
    if gk != gk2:
        raise ValueError(f"a is {m} x {gk} and b is {gn} x {gk2}: their second dimensions (GEMM-K) must match")
    if out is not None and tuple(out.shape) != (m, gn):
        raise ValueError(f"out must have shape {(m, gn)}; got {tuple(out.shape)}")
    if min(m, gn, gk) < 1 or max(m, gn, gk) > MAX_GEMM_DIM:
        raise ValueError(f"sizes M={m}, N={gn}, K={gk} must be in 1..{MAX_GEMM_DIM}")
    for nm, t in named:
        if t.device.type != "cuda" or t.device != a.device:
            raise ValueError(f"{nm} is on {t.device}; a, b and out must be on one CUDA device")
    gpu.init()
    stream = gpu.launch_stream(torch.cuda.current_stream(a.device).cuda_stream)  # raises on a stream not ours
    if out is None:
        out = torch.empty(m, gn, dtype=torch.float32, device=a.device)
    bn = 64 if gn <= 64 else 128
    cfg = LaunchConfig(grid=(cdiv(gn, bn), min(cdiv(m, GEMM_BM), MAX_GRID[1]), 1), block=(GEMM_THREADS, 1, 1))
    args = (Buffer("a"), Buffer("b"), Buffer("out"), np.int32(m), np.int32(gn), np.int32(gk))
    launch = KernelLaunch("gemm", f"sgemm_nt_128x{bn}", cfg, args)
    compiled = compile_launches(IM2COL, [launch], gpu.device_info().arch)
    bind(compiled, {"a": a, "b": b, "out": out}, stream)["gemm"]()
    return out


IM2COL = register(
    Variant(
        name="im2col",
        day=8,
        cu_file="08_im2col.cu",
        summary="explicit lowering: im2col writes the M x R*S*C matrix to a workspace, then a tiled SGEMM "
        "(128 x 128/64 tiles, 8 x 8 per thread, double-buffered) multiplies it by the filters",
        supports_fn=im2col_supports,
        launches_fn=im2col_launches,
        covers_fn=gemm_covers,
        defines=dict(IM2COL_DEFINES),
        layouts=("NHWC",),
        workspace_fn=workspace_bytes,
    )
)
