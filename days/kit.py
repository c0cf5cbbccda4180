"""The day kit: what several days' registry modules share, written once.

* arithmetic: `cdiv` (ceil-division, the grids' formula);
* launches: `pack` builds a kernel's argument list by name, from the problem's sizes, named
  tensors (`helpers.variants.Buffer`) and named extra values; `single_kernel` makes the
  ``launches_fn`` of a one-kernel `helpers.variants.Variant`;
* coverage models (how often a launch writes each output element): `grid_stride_counts` and
  `grid_stride_items` for grid-stride loops, `tile_visits` for a tile grid with an optional
  threadblock swizzle, `gemm_writes` for GEMM-shaped outputs (tile visits x the rows and columns
  a block stores);
* claims and requirements: `same_conv_reason` (days 01-06), `groups_one_reason`,
  `implicit_gemm_int32_reason` (days 09-13), `chunks16` (16-byte vector paths) and
  `alignment_reason` (pointers the vector paths need aligned);
* the kernels' 32-bit arithmetic, refused before a launch rather than wrapped in it:
  `int32_reason` (a product or sum in ``int``), `ceil_div_reason` (``CEIL_DIV`` of a size),
  `stride_loop_reason` (an ``int`` grid-stride loop), `axis_reach` and `input_reach_reason`
  (the input coordinate ``p*stride - pad + r*dilation``), `tap_offset_reason` (the filter
  offset ``r*S + s`` of days 01-03).

A day module imports `helpers` (the core) and this kit, and an earlier day only through its
public names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from helpers.epilogue import Epilogue
from helpers.problem import Conv2dProblem
from helpers.variants import INT32_MAX, Buffer, KernelLaunch, LaunchConfig

VEC_BYTES = 16  # one 16-byte vector access: a float4, or 8 fp16/bf16 values
TENSOR_CORE_CC = (8, 0)  # the tensor-core days (10-13): bf16 fragments, mma.sync + ldmatrix, cp.async


def cdiv(a: int, b: int) -> int:
    """Ceil-division of positive ints: ``cdiv(7, 2) == 4`` (the grids' ``CEIL_DIV``)."""
    return -(-a // b)


# ---- kernel arguments by name ------------------------------------------------------------------

# Problem scalars a kernel can take, by the name used in `pack`; every one is passed as np.int32.
PROBLEM_SCALARS = {
    "N": lambda p: p.N, "C": lambda p: p.C, "H": lambda p: p.H, "W": lambda p: p.W,
    "K": lambda p: p.K, "R": lambda p: p.R, "S": lambda p: p.S, "P": lambda p: p.P, "Q": lambda p: p.Q,
    "stride_h": lambda p: p.stride[0], "stride_w": lambda p: p.stride[1],
    "pad_h": lambda p: p.padding[0], "pad_w": lambda p: p.padding[1],
    "dil_h": lambda p: p.dilation[0], "dil_w": lambda p: p.dilation[1], "groups": lambda p: p.groups,
}
TENSORS = ("x", "w", "y", "dx", "dw", "dy", "workspace", "cin", "bias")  # names that become `Buffer`s

# The argument lists the days' kernels share (after this, a kernel's own names follow).
NCHW_SIZES = "N C H W K R S"
FULL_SIZES = "N C H W K R S P Q stride_h stride_w pad_h pad_w dil_h dil_w"


def pack(p: Conv2dProblem, names: str, **values) -> tuple:
    """A kernel's arguments in order, from a space-separated list of names.

    A tensor name (`TENSORS`) becomes ``Buffer(name)``, resolved to a pointer by
    `helpers.launch.prepare`; a problem scalar (`PROBLEM_SCALARS`: N, C, H, W, K, R, S, P, Q,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups: the names of
    `helpers.problem.Conv2dProblem.as_dict`) becomes ``np.int32``; any other name must be given in
    ``values``, already as the numpy scalar the kernel takes (``np.int32``, ``np.float32``).

    ``pack(p, "x w y N C H W K R S")`` -> ``(Buffer("x"), Buffer("w"), Buffer("y"), np.int32(p.N), ...)``.

    Raises:
        ValueError: a name that is none of these, a keyword ``values`` that the list does not use
            or that shadows a tensor or problem scalar.
        TypeError: a value that is not a numpy scalar.
    """
    clash = sorted(set(values) & (set(TENSORS) | set(PROBLEM_SCALARS)))
    if clash:
        raise ValueError(f"pack: values {clash} would shadow a tensor or problem scalar of the same name")
    loose = sorted(nm for nm, v in values.items() if not isinstance(v, np.generic))
    if loose:
        raise TypeError(f"pack: values {loose} must be numpy scalars (np.int32, np.float32), as pycuda needs")
    out: list = []
    used = set()
    for nm in names.split():
        if nm in values:
            out.append(values[nm])
            used.add(nm)
        elif nm in TENSORS:
            out.append(Buffer(nm))
        elif nm in PROBLEM_SCALARS:
            out.append(np.int32(PROBLEM_SCALARS[nm](p)))
        else:
            given = ", ".join(values) or "none"
            raise ValueError(f"pack: {nm!r} is not a tensor ({', '.join(TENSORS)}), a problem scalar "
                             f"({', '.join(PROBLEM_SCALARS)}) or a given value ({given})")
    unused = set(values) - used
    if unused:
        raise ValueError(f"pack: values {sorted(unused)} are not in the argument list {names!r}")
    return tuple(out)


@dataclass(frozen=True)
class single_kernel:  # noqa: N801 - used like a function: launches_fn=single_kernel(...)
    """The ``launches_fn`` of a one-kernel variant without a fused epilogue: one launch named
    ``"main"`` of ``entry`` (a name, or problem -> name) with ``launch(problem)`` on ``args`` (a
    `pack` name list, or problem -> argument tuple). A fixed ``entry`` name is also the
    variant's `helpers.variants.Variant.entry`."""

    entry: str | Callable[[Conv2dProblem], str]
    launch: Callable[[Conv2dProblem], LaunchConfig]
    args: str | Callable[[Conv2dProblem], tuple]

    def __call__(self, p: Conv2dProblem, epilogue: Epilogue) -> list[KernelLaunch]:
        name = self.entry if isinstance(self.entry, str) else self.entry(p)
        values = pack(p, self.args) if isinstance(self.args, str) else self.args(p)
        return [KernelLaunch("main", name, self.launch(p), values)]


# ---- coverage models ---------------------------------------------------------------------------


def grid_stride_counts(n_items: int, per_block: int, grid: int) -> np.ndarray:
    """How often a grid-stride loop over ``grid * per_block`` threads visits each of ``n_items``.

    Thread t starts at item t and steps by the thread count: ``for (i = t; i < n; i += grid*per_block)``.
    """
    counts = np.zeros(n_items, dtype=np.int64)
    for t in range(grid * per_block):
        counts[t :: grid * per_block] += 1
    return counts


def grid_stride_items(n_items: int, grid: int) -> np.ndarray:
    """Items visited by ``for (i = blockIdx; i < n_items; i += grid)`` over all blocks, with repeats."""
    starts = np.arange(grid)
    steps = np.arange(cdiv(n_items, grid))
    items = (starts[:, None] + steps[None, :] * grid).ravel()
    return items[items < n_items]


def tile_visits(grid: tuple[int, int, int], m_tiles: int, n_tiles: int, swizzle: int = 0) -> np.ndarray:
    """Visits per output tile, shape (m_tiles, n_tiles), of a GEMM grid whose block (bx, by)
    computes tile (bx >> s, (by << s) + (bx & (2^s - 1))) (s = ``swizzle``; s = 0 is block (bx, by)
    -> tile (bx, by)); blocks outside the tile grid compute nothing."""
    bx = np.arange(grid[0])[:, None]
    by = np.arange(grid[1])[None, :]
    tm = np.broadcast_to(bx >> swizzle, (grid[0], grid[1])).ravel()
    tn = ((by << swizzle) + (bx & ((1 << swizzle) - 1))).ravel()
    keep = (tm < m_tiles) & (tn < n_tiles)
    counts = np.zeros((m_tiles, n_tiles), dtype=np.int64)
    np.add.at(counts, (tm[keep], tn[keep]), 1)
    return counts


def gemm_writes(
    m: int,
    n: int,
    bm: int,
    bn: int,
    visits: np.ndarray,
    row_hits: np.ndarray | None = None,
    col_hits: np.ndarray | None = None,
) -> np.ndarray:
    """Writes per element of an m x n row-major output (flat) computed in bm x bn tiles.

    ``visits[i, j]`` is how often tile (i, j) is computed (`tile_visits`, or an outer product of
    per-axis counts); ``row_hits[r]`` (``col_hits[c]``) is how often the block's threads store row r
    (column c) of a tile, ones if None. Stores outside the m x n output are dropped, as the
    kernels' bounds tests do.
    """
    rows, cols = np.arange(m), np.arange(n)
    rh = np.ones(bm, dtype=np.int64) if row_hits is None else np.asarray(row_hits, dtype=np.int64)
    ch = np.ones(bn, dtype=np.int64) if col_hits is None else np.asarray(col_hits, dtype=np.int64)
    per_tile = np.asarray(visits, dtype=np.int64)[(rows // bm)[:, None], (cols // bn)[None, :]]
    return (per_tile * rh[rows % bm][:, None] * ch[cols % bn][None, :]).ravel()


def gemm_tile_launch(p: Conv2dProblem, bm: int, bn: int, threads: int, shared_bytes: int = 0) -> LaunchConfig:
    """One block per bm x bn output tile of the GEMM view, unswizzled (days 09-12): grid
    (ceil(GEMM-M / bm), ceil(GEMM-N / bn), 1) of ``threads``-thread blocks with ``shared_bytes``
    of dynamic shared memory (0: static shared memory only, days 09-11)."""
    return LaunchConfig(grid=(cdiv(p.gemm.m, bm), cdiv(p.gemm.n, bn), 1), block=(threads, 1, 1),
                        shared_bytes=shared_bytes)


def blocks(p: Conv2dProblem, tile) -> int:
    """Output tiles of ``p``'s GEMM view under a tile with ``bm`` x ``bn`` (days 09-13):
    ceil(GEMM-M / BM) · ceil(GEMM-N / BN), the blocks of an unswizzled launch."""
    return cdiv(p.gemm.m, tile.bm) * cdiv(p.gemm.n, tile.bn)


# ---- claims and requirements ---------------------------------------------------------------------


def same_conv_reason(p: Conv2dProblem) -> str | None:
    """The claim of days 01-06: stride 1, dilation 1, groups 1, odd filters, "same" padding."""
    if p.groups != 1:
        return f"needs groups=1; got {p.groups}"
    if p.stride != (1, 1):
        return f"needs stride 1; got {p.stride}"
    if p.dilation != (1, 1):
        return f"needs dilation 1; got {p.dilation}"
    if p.R % 2 == 0 or p.S % 2 == 0:
        return f"needs an odd filter (R and S odd); got R={p.R}, S={p.S}"
    want = ((p.R - 1) // 2, (p.S - 1) // 2)
    if p.padding != want:
        return f"needs 'same' padding {want} for a {p.R}x{p.S} filter; got {p.padding}"
    return None


def groups_one_reason(p: Conv2dProblem, instead: str = "use `general` or `depthwise`, fp32 NCHW") -> str | None:
    """None for groups = 1, else the reason (with where to go instead)."""
    return None if p.groups == 1 else f"needs groups=1; got {p.groups} ({instead})"


# GEMM-K = R*S*C is an int in the implicit-GEMM kernels, and so are their GEMM-K walks, which
# step by up to 32 channels (CEIL_DIV(C, 32), kg0 + 31 in day 11's scalar path).
MAX_GEMM_K = INT32_MAX - 31


def implicit_gemm_int32_reason(p: Conv2dProblem) -> str | None:
    """The implicit-GEMM kernels' (days 09-13) 32-bit arithmetic: GEMM-K = R*S*C at most
    `MAX_GEMM_K` (filter offsets and the GEMM-K walk), and P*Q < 2^31 (each thread decodes its
    output pixel as ``int pq = m % (P*Q)``). None, or the reason."""
    if p.R * p.S * p.C > MAX_GEMM_K:
        return (
            f"GEMM-K = R*S*C = {p.R * p.S * p.C} is over {MAX_GEMM_K}, the kernels' 32-bit filter offsets "
            "and GEMM-K loop"
        )
    if p.P * p.Q > INT32_MAX:
        return f"P*Q = {p.P * p.Q} output pixels per image do not fit the kernels' 32-bit pixel index"
    return None


def chunks16(channels: int, p: Conv2dProblem) -> bool:
    """Whether rows of ``channels`` elements of ``p``'s dtype split into whole 16-byte chunks
    (C % 4 == 0 for fp32, C % 8 == 0 for fp16/bf16): the condition of every 16-byte load path."""
    return channels % (VEC_BYTES // p.itemsize) == 0


def alignment_reason(tensors: dict, need: dict[str, int], why: str) -> str | None:
    """None if every tensor named in ``need`` (name -> bytes) that is present (not None) in
    ``tensors`` starts on that alignment, else the reason, naming the tensor and ``why``."""
    for nm, align in need.items():
        t = tensors.get(nm)
        if t is not None and t.data_ptr() % align:
            return (
                f"{nm}.data_ptr() is not {align}-byte aligned (a view with a storage offset?); {why} "
                f"need it: pass {nm}.clone()"
            )
    return None


# ---- the kernels' 32-bit arithmetic ------------------------------------------------------------
# `Variant.supports` refuses any single size past INT32_MAX; these refuse the int *expressions*
# of a kernel (products, CEIL_DIV, loop increments, input coordinates) that would pass it. Each
# names the expression and its value. `tests/test_int32_guards.py` emulates the kernels' int
# arithmetic on both sides of every limit.


def int32_reason(expr: str, value: int, why: str) -> str | None:
    """None if the kernel's ``int`` expression ``expr`` (its largest value: ``value``) fits, else
    the reason, with ``why`` (what the expression is, or what its wrapping breaks)."""
    if value <= INT32_MAX:
        return None
    return f"{expr} = {value} is past INT32_MAX = {INT32_MAX} in the kernel's 32-bit int ({why})"


def ceil_div_reason(expr: str, a: int, b: int) -> str | None:
    """``expr = CEIL_DIV(a, b)`` is ``(a + b - 1) / b`` in ``int``: None if ``a + b - 1`` fits,
    else the reason (the sum wraps negative, and so does the count: a loop up to it runs no
    iteration, a decode by it goes wrong)."""
    if a + b - 1 <= INT32_MAX:
        return None
    return (
        f"{expr} = CEIL_DIV({a}, {b}) forms {a} + {b - 1} = {a + b - 1} in 32 bits, past INT32_MAX = "
        f"{INT32_MAX}: the count wraps negative"
    )


def stride_loop_reason(step_expr: str, last: int, step: int, loop: str) -> str | None:
    """An ``int`` grid-stride loop ``for (i = start; i < n; i += step)``: the largest index it
    runs (``last``) plus ``step`` is formed in 32 bits and must fit; past INT32_MAX it wraps to a
    negative index that passes ``i < n``. None, or the reason (``step_expr`` names the step)."""
    if last + step <= INT32_MAX:
        return None
    return (
        f"{loop} + {step_expr} = {last} + {step} = {last + step} wraps the kernel's 32-bit {loop} loop "
        f"(past INT32_MAX = {INT32_MAX}): the index goes negative, still passes the loop test, and the loop "
        "runs on at negative offsets"
    )


def axis_reach(n_out: int, stride: int, pad: int, taps: int, dil: int) -> int:
    """The largest value of the int expression ``p*stride - pad + r*dil`` and of its parts
    ``p*stride`` and ``r*dil`` over output indices p < ``n_out`` and taps r < ``taps`` (what a
    kernel forms before its bounds test; the smallest, -pad, always fits)."""
    top, tap = (n_out - 1) * stride, (taps - 1) * dil
    return max(top, tap, top - pad + tap)


def input_reach_reason(
    p: Conv2dProblem, rows: int | None = None, cols: int | None = None, taps_r: int | None = None
) -> str | None:
    """The input row ``p*sh - ph + r*dh`` and column ``q*sw - pw + s*dw`` a kernel computes in
    ``int`` for its output rows p < ``rows`` (default P; a tiled kernel also runs the rows of its
    last, partial tile), columns q < ``cols`` (default Q) and filter rows r < ``taps_r``
    (default R): None if every value fits (`axis_reach`), else the reason. Past INT32_MAX the
    coordinate is a signed overflow (undefined behaviour in CUDA C++), whatever the bounds test
    after it would make of the wrapped value."""
    rows = p.P if rows is None else rows
    cols = p.Q if cols is None else cols
    taps_r = p.R if taps_r is None else taps_r
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
    for expr, n, st, pad, taps, dil, tap in (
        ("p*sh - ph + r*dh", rows, sh, ph, taps_r, dh, "r"), ("q*sw - pw + s*dw", cols, sw, pw, p.S, dw, "s")
    ):
        reach = axis_reach(n, st, pad, taps, dil)
        if reach > INT32_MAX:
            out = expr[0]
            return (
                f"input coordinate {expr} reaches {reach} for {out} < {n}, {tap} < {taps} (stride {st}, padding "
                f"{pad}, dilation {dil}): past INT32_MAX = {INT32_MAX}, the kernel's 32-bit coordinates"
            )
    return None


def tap_offset_reason(p: Conv2dProblem, every_tap: bool) -> str | None:
    """The filter offset ``r*S + s`` that days 01-03 index ``w`` with, an ``int``: up to R*S - 1
    when the kernel forms it for every tap (``every_tap``), else only for the taps inside the
    image, up to r = H - 1 + pad_h and s = W - 1 + pad_w ("same" padding). None, or the reason."""
    r_max, s_max = p.R - 1, p.S - 1
    if not every_tap:
        r_max, s_max = min(r_max, p.H - 1 + p.padding[0]), min(s_max, p.W - 1 + p.padding[1])
    return int32_reason(f"the filter offset r*S + s (r <= {r_max}, s <= {s_max})", r_max * p.S + s_max,
                        "w would be read at a wrapped, negative offset")
