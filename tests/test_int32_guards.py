"""The kernels' 32-bit arithmetic (days 01-12): every `int` expression that a problem inside the
int32 arguments could push past INT32_MAX is refused by the variant's ``supports``, with a reason
that names it, and nothing just inside the limit is.

Each case gives a problem just past a limit, one just inside it, words of the reason, and an
emulation of the kernel's expression at its extreme thread (the C arithmetic, wrapped to 32 bits
after every operation, as the GPU computes it) next to the exact value: the emulation wraps past
the limit and not inside it. A few cases also emulate what the wrap does (a loop that never ends,
a count that goes negative, a tile that is never filled). The problems just past are claimed by
the registry before these guards (see the commit); most would fit an H200 (8-24 GiB tensors).
"""

from __future__ import annotations

import numpy as np
import pytest

from days.day07_general import dw_config, dw_geometry
from days.kit import axis_reach, cdiv
from helpers.problem import Conv2dProblem
from helpers.suites import SUITES, suite
from helpers.variants import INT32_MAX, MAX_GRID, get

BIG = 2**31  # smem_limit: only the arithmetic is tested here


def i32(v: int) -> int:
    """v wrapped to a 32-bit two's-complement int (what the GPU's integer unit computes)."""
    return (v + 2**31) % 2**32 - 2**31


def cdiv_c(a: int, b: int) -> int:
    """C's integer division (truncates toward zero), for wrapped negative numerators."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def coord(n_out: int, st: int, pad: int, taps: int, dil: int) -> tuple[list[int], list[int]]:
    """``p*st - pad + r*dil`` at p = n_out - 1, r = taps - 1 (where every part is largest), as
    the kernels evaluate it: (wrapped, exact) values of p*st, p*st - pad, r*dil and the sum."""
    p, r = n_out - 1, taps - 1
    a, b = i32(p * st), i32(r * dil)
    c = i32(a - pad)
    return [a, c, b, i32(c + b)], [p * st, p * st - pad, r * dil, p * st - pad + r * dil]


def nchw(**k) -> Conv2dProblem:
    k.setdefault("N", 1)
    k.setdefault("C", 1)
    k.setdefault("K", 1)
    return Conv2dProblem(**k)


def same(H: int, W: int = 1, R: int = 1, S: int = 1, **k) -> Conv2dProblem:
    return nchw(H=H, W=W, R=R, S=S, padding="same", **k)


def dw(**k) -> Conv2dProblem:
    c = k.pop("C", 1)
    k.setdefault("H", 1)
    k.setdefault("W", 1)
    k.setdefault("R", 1)
    k.setdefault("S", 1)
    return nchw(C=c, K=c, groups=c, **k)


# ---- emulations: (wrapped, exact) of the kernel's expression at its extreme -----------------------


def ceil_div(a: int, b: int) -> tuple[list[int], list[int]]:
    """``CEIL_DIV(a, b) = (a + b - 1) / b`` in int: (wrapped, exact) of the sum and the count."""
    t = i32(a + b - 1)
    return [t, cdiv_c(t, b)], [a + b - 1, cdiv(a, b)]


def same_rows(p, rows):  # days 01-06: h = p - pad_h + r over output rows < rows
    return coord(rows, 1, p.padding[0], p.R, 1)


def same_cols(p, cols):
    return coord(cols, 1, p.padding[1], p.S, 1)


def tap_offset(r, s, S):  # wkc[r * S + s]
    return [i32(i32(r * S) + s)], [r * S + s]


def naive_tap(p):
    return tap_offset(min(p.R - 1, p.H - 1 + p.padding[0]), min(p.S - 1, p.W - 1 + p.padding[1]), p.S)


def z_out_loop(p):  # p += gridDim.y * blockDim.y from the last row P - 1
    step = min(cdiv(p.P, 8), MAX_GRID[1]) * 8
    return [i32(p.P - 1 + step)], [p.P - 1 + step]


def z_out_channel(p):  # wk + c * R * S for c = C - 1
    c = p.C - 1
    return [i32(i32(c * p.R) * p.S)], [c * p.R * p.S]


def tiles_y(p):  # CEIL_DIV(H, TILE) = (H + 15) / 16
    return ceil_div(p.H, 16)


def tiled_rows(p):
    return same_rows(p, cdiv(p.P, 16) * 16)


def halo_threads_rows(p):  # h = ty0 * TILE - pad_h + ty, ty < TILE + R - 1
    ty0, ty = cdiv(p.H, 16) - 1, 16 + p.R - 2
    return [i32(i32(ty0 * 16 - p.padding[0]) + ty)], [ty0 * 16 - p.padding[0] + ty]


def blocked_tile(p):  # (TP, TK) of the registered blocked variant
    kt, kg = (8, 4) if p.K >= 32 else (8, 1) if p.K >= 8 else (4, 1) if p.K >= 4 else (1, 1)
    return (8 // kg) * 4, kg * kt


def blocked_k_tiles(p):
    tk = blocked_tile(p)[1]
    return ceil_div(p.K, tk)


def blocked_row_loop(p):  # p0 += gridDim.y * TP from the last row tile's start
    tp = blocked_tile(p)[0]
    last, step = (cdiv(p.P, tp) - 1) * tp, min(cdiv(p.P, tp), MAX_GRID[1]) * tp
    return [i32(last + step)], [last + step]


def blocked_cols(p):  # ww = q0 - pad + rem % XW, XW = 32 + S - 1
    q0, j = (cdiv(p.Q, 32) - 1) * 32, 32 + p.S - 2
    return [i32(i32(q0 - p.padding[1]) + j)], [q0 - p.padding[1] + j]


def gemm_tile_images(p):  # n += gridDim.z from N - 1
    step = min(p.N, MAX_GRID[2])
    return [i32(p.N - 1 + step)], [p.N - 1 + step]


def general_crs(p):
    return [i32(i32(p.C_per_group * p.R) * p.S)], [p.C_per_group * p.R * p.S]


def general_taps_loop(p):  # j0 += GEN_TAPS from the last round's start
    crs = p.C_per_group * p.R * p.S
    last = (cdiv(crs, 128) - 1) * 128
    return [i32(last + 128)], [last + 128]


def general_kblocks(p):
    return ceil_div(p.K // p.groups, 8)


def general_gk_loop(p):
    g = p.groups * cdiv(p.K // p.groups, 8)
    return [i32(g - 1 + min(g, MAX_GRID[2]))], [g - 1 + min(g, MAX_GRID[2])]


def full_rows(p, taps=None):  # hb = p*sh - ph, then hb + r*dh (days 07-11)
    return coord(p.P, p.stride[0], p.padding[0], taps or p.R, p.dilation[0])


def general_idle_rows(p):  # a thread past the last pixel has hb = H
    return [i32(p.H + i32((p.R - 1) * p.dilation[0]))], [p.H + (p.R - 1) * p.dilation[0]]


def dw_tile(p):
    pl, tp, nseg = dw_config(p)
    return pl, tp, dw_geometry(p, pl, tp, nseg)


def dw_ct(p):
    tq = dw_tile(p)[2]["TQ"]
    return ceil_div(p.Q, tq)


def dw_st(p):
    tp = dw_tile(p)[1]
    return ceil_div(p.P, tp)


def dw_cols(p):  # the last column tile: w0 = q0*sw - pw, its last chunk (w0 + TW - 1) >> 2
    g = dw_tile(p)[2]
    q0 = (cdiv(p.Q, g["TQ"]) - 1) * g["TQ"]
    a = i32(q0 * p.stride[1])
    w0 = i32(a - p.padding[1])
    end = i32(w0 + g["TW"] - 1)
    x0 = q0 * p.stride[1] - p.padding[1]  # exact w0
    exact = [q0 * p.stride[1], x0, x0 + g["TW"] - 1, (x0 + g["TW"] - 1) // 4 * 4 + 3]
    return [a, w0, end, i32((end >> 2) * 4 + 3)], exact


def dw_rows(p):  # the last strip: h0 = p0*sh - ph, rows h0 .. h0 + TH - 1
    _, tp, g = dw_tile(p)
    p0 = (cdiv(p.P, tp) - 1) * tp
    a = i32(p0 * p.stride[0])
    h0 = i32(a - p.padding[0])
    return [a, h0, i32(h0 + g["TH"] - 1)], [p0 * p.stride[0], p0 * p.stride[0] - p.padding[0],
                                           p0 * p.stride[0] - p.padding[0] + g["TH"] - 1]


def dw_row_step(p):
    pitch = dw_tile(p)[2]["TW"] + 8
    return [i32(p.dilation[0] * pitch)], [p.dilation[0] * pitch]


def dw_channels(p):
    """Every block's largest c0 + pl (c0 = nc0 % C), over the whole grid (numpy int64)."""
    pl = dw_tile(p)[0]
    nc = p.N * p.C
    nc0 = np.arange(cdiv(nc, pl), dtype=np.int64) * pl
    top = int((nc0 % p.C + np.minimum(pl, nc - nc0) - 1).max())
    return [i32(top)], [top]


def mma_scalar_rows(p):  # rr = kg / (S*C) of the last step's last lane
    kg = cdiv(p.R * p.S * p.C, 32) * 32 - 1
    return full_rows(p, taps=kg // (p.S * p.C) + 1)


# ---- the cases --------------------------------------------------------------------------------

_SEVEN = 2**31 - 1
TOP_PAD = dict(H=1, W=1, R=1, S=1, padding=(2**30, 0))  # P = 3 rows, from p*sh = 2 * 2^30 - 2^30 on

CASES = [
    # day 01: h = p - pad_h + r over p < H (H - 1 + pad_h), and r*S + s of the taps inside the image
    ("naive", "rows", same(2**31 - 1, R=5), same(2**31 - 2, R=5), "p*sh - ph + r*dh", lambda p: same_rows(p, p.P)),
    ("naive", "cols", same(1, 2**31 - 1, S=5), same(1, 2**31 - 2, S=5), "q*sw - pw + s*dw",
     lambda p: same_cols(p, p.Q)),
    ("naive", "tap", same(2, R=3, S=858993461), same(2, R=3, S=858993459), "r*S + s", naive_tap),
    # day 02: the int row loop, c*R*S, coordinates, taps
    ("z_out", "loop", same(2146959369), same(2146959368), "wraps the kernel's 32-bit p loop", z_out_loop),
    ("z_out", "channel", same(1, C=238609296, R=3, S=3), same(1, C=238609295, R=3, S=3), "c*R*S", z_out_channel),
    ("z_out", "rows", same(2146959368, R=1048563), same(2146959368, R=1048561), "p*sh - ph + r*dh",
     lambda p: same_rows(p, p.P)),  # (a shorter image would be refused by the row loop first)
    ("z_out", "tap", same(2, R=3, S=858993461), same(2, R=3, S=858993459), "r*S + s", naive_tap),
    # days 03-05: tiles_y = CEIL_DIV(H, 16); coordinates over whole tiles; day 03's every-tap offset
    *[(v, "tiles_y", same(2**31 - 15), same(2**31 - 16), "tiles_y = CEIL_DIV", tiles_y)
      for v in ("shared", "shared_halo_strided", "shared_halo_threads", "acc_float", "acc_double", "acc_kahan")],
    *[(v, "rows", same(2**31 - 16, R=35), same(2**31 - 16, R=33), "p*sh - ph + r*dh", tiled_rows)
      for v in ("shared", "shared_halo_strided", "acc_float", "acc_double", "acc_kahan")],
    ("shared_halo_threads", "rows", same(2**31 - 16, R=35), same(2**31 - 16, R=33), "p*sh - ph + r*dh",
     halo_threads_rows),
    ("shared", "cols", same(1, 2**31 - 15, S=3), same(1, 2**31 - 16, S=3), "q*sw - pw + s*dw",
     lambda p: same_cols(p, cdiv(p.Q, 16) * 16)),
    ("shared", "tap", same(1, R=3, S=715827883), same(1, R=3, S=715827881), "r*S + s",
     lambda p: tap_offset(p.R - 1, p.S - 1, p.S)),
    # day 06, direct entries: k_tiles, the p0 loop, column coordinates; GEMM tile: the image loop
    ("blocked", "k_tiles", same(1, K=2**31 - 31, R=3, S=3), same(1, K=2**31 - 32, R=3, S=3), "k_tiles = CEIL_DIV",
     blocked_k_tiles),
    ("blocked", "loop", same(2145386529, R=3, S=3), same(2145386528, R=3, S=3), "wraps the kernel's 32-bit p0 loop",
     blocked_row_loop),
    ("blocked", "cols", same(1, 2**31 - 31, R=3, S=3), same(1, 2**31 - 32, R=3, S=3), "q*sw - pw + s*dw",
     blocked_cols),
    ("blocked", "images", same(1, N=2147418114, K=32), same(1, N=2147418113, K=32), "wraps the kernel's 32-bit n loop",
     gemm_tile_images),
    # day 07, general: int CRS, the tap-round loop, kblocks, the gk loop, coordinates, idle threads' rows
    ("general", "CRS", nchw(C=2048, H=1, W=1, R=1024, S=2049, padding=(512, 1024)),
     nchw(C=2048, H=1, W=1, R=1024, S=1023, padding=(512, 511)), "CRS = Cg*R*S", general_crs),
    ("general", "j0", nchw(C=2**31 - 127, H=1, W=1, R=1, S=1), nchw(C=2**31 - 128, H=1, W=1, R=1, S=1),
     "wraps the kernel's 32-bit j0 loop", general_taps_loop),
    ("general", "kblocks", nchw(K=2**31 - 7, H=1, W=1, R=1, S=1), nchw(K=2**31 - 8, H=1, W=1, R=1, S=1),
     "kblocks = CEIL_DIV", general_kblocks),
    ("general", "gk", dw(C=2147418114), dw(C=2147418113), "wraps the kernel's 32-bit gk loop", general_gk_loop),
    ("general", "rows", nchw(stride=(2**30, 1), **TOP_PAD), nchw(stride=(2**30 - 1, 1), **TOP_PAD),
     "p*sh - ph + r*dh", full_rows),
    ("general", "idle", nchw(H=2**30 + 1, W=1, R=2, S=1, dilation=(2**30 - 1, 1)),
     nchw(H=2**30, W=1, R=2, S=1, dilation=(2**30 - 1, 1)), "hb + r*dh with hb = H", general_idle_rows),
    # day 07, depthwise: CT, ST, the last column tile's chunks, the last strip's rows, dh*pitch, channels
    ("depthwise", "CT", dw(W=2**31 - 255), dw(W=2**31 - 256), "CT = CEIL_DIV", dw_ct),
    ("depthwise", "ST", dw(H=2147483137), dw(H=2147483136), "ST = CEIL_DIV", dw_st),
    ("depthwise", "cols", dw(W=2147483437, S=301), dw(W=2147483436, S=301), "the last column tile's input column",
     dw_cols),
    ("depthwise", "rows", dw(stride=(2**30, 1), padding=(2**30, 0)), dw(stride=(2**30 - 1, 1), padding=(2**30, 0)),
     "the last strip's input row", dw_rows),
    ("depthwise", "row_step", dw(dilation=(178956971, 1)), dw(dilation=(178956970, 1)), "dh*pitch", dw_row_step),
    ("depthwise", "channels", dw(N=3, C=_SEVEN), dw(N=2, C=_SEVEN), "the filter channel c0 + pl", dw_channels),
    # days 08-11: h0 + r*dh, h0 = p*sh - ph (im2col_nhwc: h = p*sh - ph + r*dh)
    *[(v, "rows", nchw(stride=(2**30, 1), **TOP_PAD), nchw(stride=(2**30 - 1, 1), **TOP_PAD), "p*sh - ph + r*dh",
       full_rows) for v in ("im2col", "igemm_simt_analytic", "igemm_simt", "igemm_wmma", "igemm_mma")],
    # day 12 (C % 8 == 0 only): the tap masks' h0 + r*dh, h0 = p*sh - ph
    ("igemm_pipelined", "rows", nchw(C=8, stride=(2**30, 1), **TOP_PAD), nchw(C=8, stride=(2**30 - 1, 1), **TOP_PAD),
     "p*sh - ph + r*dh", full_rows),
    # day 11, scalar path (C % 8 != 0): rr = kg / (S*C) of the last step's lanes past GEMM-K
    ("igemm_mma", "scalar_rr", nchw(H=69273668, W=1, R=2, S=1, dilation=(69273667, 1)),
     nchw(H=69273667, W=1, R=2, S=1, dilation=(69273666, 1)), "p*sh - ph + r*dh", mma_scalar_rows),
]

IDS = [f"{v}-{what}" for v, what, *_ in CASES]


@pytest.mark.parametrize("name, what, past, inside, words, emulate", CASES, ids=IDS)
def test_int32_guard_refuses_just_past_and_accepts_just_inside(name, what, past, inside, words, emulate):
    v = get(name)
    past, inside = v.adapt(past), v.adapt(inside)
    reason = v.supports(past, smem_limit=BIG)
    assert reason is not None and words in reason and "INT32_MAX" in reason, reason
    assert v.supports(inside, smem_limit=BIG) is None, (name, what, v.supports(inside, smem_limit=BIG))
    wrapped, exact = emulate(past)
    assert wrapped != exact and max(exact) > INT32_MAX, (wrapped, exact)  # the hazard is real just past
    wrapped, exact = emulate(inside)
    assert wrapped == exact and max(exact) <= INT32_MAX, (wrapped, exact)  # and absent just inside


def test_past_problems_pass_the_int32_argument_checks():
    """Every size of every problem here fits an int32 argument: only the kernels' arithmetic refuses them."""
    for _, _, past, inside, *_ in CASES:
        for p in (past, inside):
            assert max(p.N, p.C, p.H, p.W, p.K, p.R, p.S, p.P, p.Q, *p.stride, *p.padding, *p.dilation) <= INT32_MAX


# ---- what the wraps do ----------------------------------------------------------------------------


def row_loop_after(last: int, n: int, step: int, cap: int = 100_000) -> tuple[int, int]:
    """Run ``for (int i = last; i < n; i += step)`` as the GPU does (32-bit wrap): (iterations,
    iterations at a negative index), at most ``cap``."""
    i, runs, negative = last, 0, 0
    while i < n and runs < cap:
        runs, negative = runs + 1, negative + (i < 0)
        i = i32(i + step)
    return runs, negative


@pytest.mark.parametrize(
    "p, last, step",
    [(same(2146959369), 2146959368, 65535 * 8),  # z_out: p from P - 1 by gridDim.y * 8
     (same(2145386529, R=3, S=3), 2145386528, 65535 * 32)],  # blocked: p0 from the last tile by gridDim.y * TP
    ids=["z_out", "blocked"],
)
def test_row_loops_wrap_to_negative_rows(p, last, step):
    """Just past the limit, the thread of the last row (tile) does not stop after it: its next row is
    negative, passes ``< P``, and it runs thousands more iterations, half of them storing at negative
    rows (offsets (nk*P + p)*Q + q < 0 for the first planes); just inside, it stops."""
    runs, negative = row_loop_after(last, p.P, step)
    assert runs > 1000 and negative > 500, (runs, negative)
    assert row_loop_after(last - 1, p.P - 1, step) == (1, 0)  # the problem one row smaller


def test_tiles_and_k_tiles_counts_go_negative():
    """CEIL_DIV wraps: day 03-05 run no row tile (tiles_y < 0), day 06 no (n, k-tile) plane (N*k_tiles < 0),
    general no channel block (groups*kblocks < 0): every output is left unwritten."""
    assert tiles_y(same(2**31 - 15))[0][1] < 0
    assert blocked_k_tiles(same(1, K=2**31 - 31, R=3, S=3))[0][1] < 0
    assert general_kblocks(nchw(K=2**31 - 7, H=1, W=1, R=1, S=1))[0][1] < 0
    assert dw_ct(dw(W=2**31 - 255))[0][1] < 0
    assert dw_st(dw(H=2147483137))[0][1] < 0


def test_general_wrapped_crs_reads_a_fraction_of_the_taps():
    """The issue's problem: CRS wraps to 2,097,152 of its 4,297,064,448 taps."""
    wrapped, exact = general_crs(nchw(C=2048, H=1, W=1, R=1024, S=2049, padding=(512, 1024)))
    assert (wrapped[0], exact[0]) == (2097152, 4297064448)


def test_general_tap_round_loop_does_not_end():
    p = nchw(C=2**31 - 127, H=1, W=1, R=1, S=1)
    crs = p.C
    j0 = (cdiv(crs, 128) - 1) * 128  # the last round, j0 < CRS
    assert j0 < crs and i32(j0 + 128) < crs  # ... and the next j0 is negative, still < CRS


def test_depthwise_last_column_tile_is_never_filled():
    """Just past: (w0 + TW - 1) wraps negative, so n_ch = (end >> 2) - (w0 >> 2) + 1 <= 0 and no
    thread loads the last column tile, whose outputs q0 .. Q-1 are still computed (from stale
    shared memory)."""
    p = dw(W=2147483437, S=301)
    wrapped, _ = dw_cols(p)
    w0, end = wrapped[1], wrapped[2]
    n_ch = (end >> 2) - (w0 >> 2) + 1
    q0 = (cdiv(p.Q, dw_tile(p)[2]["TQ"]) - 1) * dw_tile(p)[2]["TQ"]
    assert n_ch <= 0 and q0 < p.Q


def test_depthwise_channel_wrap_reads_before_w():
    """N = 3, C = 2^31 - 1: a block from image 1 into image 2 reaches c0 + pl = 2^31, which wraps,
    and (c0 + pl) % C in C is negative: the weight of channel -1."""
    p = dw(N=3, C=_SEVEN)
    pl = dw_tile(p)[0]
    v = p.C + 2**31  # the plane where c0 + pl = 2^31
    nc0 = v // pl * pl
    c0 = nc0 % p.C
    assert nc0 // p.C == 1 and c0 + (v - nc0) == 2**31
    wrapped = i32(c0 + (v - nc0))
    assert wrapped - cdiv_c(wrapped, p.C) * p.C < 0  # C's %: the sign of the dividend


def test_day11_vec_path_and_wmma_keep_the_scalar_only_limit():
    """The rr past R-1 is only formed by day 11's scalar path: with C % 8 == 0 (vec path) and on
    day 10 the same rows are accepted."""
    past = nchw(H=69273668, W=1, R=2, S=1, dilation=(69273667, 1))
    assert get("igemm_wmma").supports(get("igemm_wmma").adapt(past), smem_limit=BIG) is None
    vec = get("igemm_mma").adapt(nchw(C=8, K=8, H=69273668, W=1, R=2, S=1, dilation=(69273667, 1)))
    assert get("igemm_mma").supports(vec, smem_limit=BIG) is None


def test_general_idle_row_limit_only_with_idle_threads():
    """Threads past the last pixel exist only when N*P*Q is not a multiple of 1024 pixels per block."""
    p = nchw(N=1024, H=2**30 + 1, W=1, R=2, S=1, dilation=(2**30 - 1, 1))
    assert (p.N * p.P * p.Q) % 1024 == 0
    assert get("general").supports(p, smem_limit=BIG) is None


def test_tap_offset_limit_follows_the_taps_each_kernel_forms():
    """Days 01-02 form r*S + s only for taps inside the image; day 03 for every tap. A 1x1 image
    under a 3 x 715,827,883 filter (R*S > 2^31) is fine for the first two, refused by day 03."""
    p = same(1, R=3, S=715827883)
    assert get("naive").supports(p, smem_limit=BIG) is None
    assert get("z_out").supports(p, smem_limit=BIG) is None
    assert "r*S + s" in get("shared").supports(p, smem_limit=BIG)


def test_axis_reach():
    assert axis_reach(3, 2**30, 2**30, 1, 1) == 2**31  # p*sh alone
    assert axis_reach(1, 5, 0, 4, 2**29) == 3 * 2**29  # r*dil alone
    assert axis_reach(10, 1, 2, 5, 1) == 9 - 2 + 4
    assert axis_reach(1, 1, 7, 1, 1) == 0  # -pad is the smallest value, never the largest


@pytest.mark.parametrize("suite_name", sorted(SUITES))
def test_guards_refuse_no_committed_suite_problem_for_int32(suite_name):
    """No problem of a committed suite is refused for 32-bit arithmetic by any variant."""
    from helpers.variants import all_variants

    for p in suite(suite_name):
        for v in all_variants(max_day=12):
            reason = v.supports(v.adapt(p), smem_limit=BIG)
            assert reason is None or "INT32_MAX" not in reason, (p.name, v.name, reason)
