"""Day 13's variant: the launch of one `ProductionConfig` (tile, iterator, swizzle), its fused
epilogue (``cin``, ``bias`` and the `helpers.epilogue.Epilogue` scalars go through
`helpers.launch.prepare` by name), its refusals and its coverage model; `make_production` builds
one with any choice forced, and the registered ``igemm_production`` is the automatic one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

import numpy as np

from helpers.epilogue import Epilogue, scalars
from helpers.problem import Conv2dProblem
from helpers.variants import INT32_MAX, KernelLaunch, LaunchConfig, Variant, register

from ..kit import (
    FULL_SIZES,
    TENSOR_CORE_CC,
    VEC_BYTES,
    alignment_reason,
    cdiv,
    gemm_writes,
    groups_one_reason,
    implicit_gemm_int32_reason,
    pack,
    tile_visits,
)
from .rule import ITERATORS, ProductionConfig, choose, iterator_reason
from .tiles import CU_FILE, INSTANTIATED, TileDescription, tune_defines


def config_reason(p: Conv2dProblem, cfg: ProductionConfig) -> str | None:
    """None if ``cfg`` runs ``p``, else why not (tile, iterator, swizzle, 32-bit limits)."""
    reason = groups_one_reason(p) or implicit_gemm_int32_reason(p) or int32_walk_reason(p, cfg.tile.bk)
    if reason:
        return reason
    reason = cfg.tile.reason(smem_limit=2**31, instantiated=not cfg.alone)  # the device's limit: `Variant.supports`
    if reason:
        return f"tile {cfg.tile.name}: {reason}"
    reason = iterator_reason(p, cfg.iterator)
    if reason:
        return reason
    if cfg.alone and cfg.iterator != "optimized":
        return f"a tile built alone uses the optimized iterator; this problem needs {cfg.iterator}"
    if not cfg.alone and cfg.iterator not in INSTANTIATED[cfg.tile.name]:
        why_not = "; ".join(
            f"{it}: {r}" for it in INSTANTIATED[cfg.tile.name] if (r := iterator_reason(p, it)) is not None
        )
        return (
            f"tile {cfg.tile.name} is not instantiated with the {cfg.iterator} iterator; "
            f"it is with: {', '.join(INSTANTIATED[cfg.tile.name])}" + (f" ({why_not})" if why_not else "")
        )
    if not 0 <= cfg.swizzle <= 4:
        return f"swizzle = {cfg.swizzle}: log2 of the filter tiles per A tile, 0 .. 4"
    return None


def int32_walk_reason(p: Conv2dProblem, bk: int) -> str | None:
    """This kernel's own 32-bit limits, beyond `days.kit.implicit_gemm_int32_reason`: its GEMM-K walks step
    by BK (``CEIL_DIV(C, BK)``, ``c0 += BK``, ``t * BK``), so R·S·C + 2·BK must fit an int; and
    the input row and column it tests, origin + tap offset (p·sh − ph + r·dh), must fit one too,
    or the wrapped sum would pass the bounds test while the 64-bit address points elsewhere.
    None, or the reason."""
    if p.R * p.S * p.C + 2 * bk > INT32_MAX:
        return f"GEMM-K = R*S*C = {p.R * p.S * p.C} plus two BK = {bk} steps does not fit the kernel's 32-bit walk"
    axes = (("rows", p.P, p.stride[0], p.padding[0], p.R, p.dilation[0], p.H),
            ("columns", p.Q, p.stride[1], p.padding[1], p.S, p.dilation[1], p.W))
    for what, n_out, st, pad, taps, dil, size in axes:
        reach = (n_out - 1) * st + (taps - 1) * dil + pad + size
        if reach > INT32_MAX:
            return f"input {what}: output origin + filter reach + padding + size = {reach} does not fit 32-bit offsets"
    return None


def production_launches(p: Conv2dProblem, epilogue: Epilogue, cfg: ProductionConfig) -> list[KernelLaunch]:
    """One launch of ``cfg``'s entry on x, w, y, the sizes N, C, H, W, K, R, S, P, Q, strides,
    paddings, dilations (int32), the Cin and bias pointers (0 for none), alpha, beta (float32),
    relu and swz_log, the swizzle (int32)."""
    args = pack(p, f"x w y {FULL_SIZES} cin bias alpha beta relu swz_log", **scalars(epilogue),
                swz_log=np.int32(cfg.swizzle))
    defines = tuple(sorted(tune_defines(cfg.tile, p.dtype).items())) if cfg.alone else ()
    return [KernelLaunch("main", cfg.entry(p.dtype), cfg.launch(p), args, defines)]


def covers(p: Conv2dProblem, launch: LaunchConfig, cfg: ProductionConfig) -> np.ndarray:
    """Writes per element of Y[m][k] (NHWC, flat) of the launch: block (bx, by) computes output tile
    (bx >> s, (by << s) + (bx & (2^s - 1))) and writes its rows < M, columns < K once; blocks past
    the last filter tile write nothing."""
    t = cfg.tile
    visits = tile_visits(launch.grid, cdiv(p.gemm.m, t.bm), cdiv(p.K, t.bn), cfg.swizzle)
    return gemm_writes(p.gemm.m, p.K, t.bm, t.bn, visits)


def tensor_check(p: Conv2dProblem, tensors: dict, epilogue: Epilogue, cfg: ProductionConfig) -> str | None:
    """x and w 16-byte aligned for the optimized iterator (cp.async of 16 bytes); y 16-byte
    aligned when K % 8 == 0 (16-byte stores), and so is cin when it is read (beta != 0).
    None or the reason."""
    need = {"x": VEC_BYTES, "w": VEC_BYTES} if cfg.iterator == "optimized" else {}
    reason = alignment_reason(tensors, need, "the 16-byte cp.async copies")
    if reason is None and p.K % 8 == 0:
        cin = {"cin": VEC_BYTES} if epilogue.beta != 0 else {}
        reason = alignment_reason(tensors, {"y": VEC_BYTES, **cin}, "the epilogue's 16-byte stores and Cin reads")
    return reason


def make_production(
    name: str = "igemm_production",
    tile: TileDescription | str | None = None,
    iterator: str | None = None,
    swizzle: int | None = None,
    alone: bool = False,
) -> Variant:
    """A day-13 variant (not registered) with any of tile, iterator, swizzle forced; None = `choose`.
    With ``alone`` the forced tile (optimized iterator) is built by itself (`tune_defines`), so it
    need not be one of the ``.cu`` file's entries: how day 15's tuner tries any valid tile.

    Raises:
        ValueError: a forced tile that is invalid or not instantiated (the reason says which), an
            unknown iterator, a forced (tile, iterator) pair the ``.cu`` file does not instantiate,
            or a swizzle outside 0..4. Problems the forced choice cannot run are refused per problem
            by `Variant.supports`, with the reason.
    """
    if alone and (tile is None or iterator not in (None, "optimized")):
        raise ValueError("alone builds one forced tile with the optimized iterator: pass tile= (and no other iterator)")
    if tile is not None:
        t = TileDescription.parse(tile) if isinstance(tile, str) else tile
        reason = t.reason(instantiated=not alone)
        if reason:
            raise ValueError(f"tile {t.name}: {reason}")
        tile = t
    if iterator is not None and iterator not in ITERATORS:
        raise ValueError(f"iterator {iterator!r}: choose one of {', '.join(ITERATORS)}")
    if alone:
        iterator = "optimized"
    elif tile is not None and iterator is not None and iterator not in INSTANTIATED[tile.name]:
        raise ValueError(
            f"tile {tile.name} is not instantiated with the {iterator} iterator; "
            f"it is with: {', '.join(INSTANTIATED[tile.name])}"
        )
    if swizzle is not None and not 0 <= swizzle <= 4:
        raise ValueError(f"swizzle = {swizzle}: log2 of the filter tiles per A tile, 0 .. 4")
    chosen = partial(choose, tile=tile, iterator=iterator, swizzle=swizzle)
    config_fn: Callable[[Conv2dProblem], ProductionConfig] = chosen
    if alone:
        config_fn = lambda p: replace(chosen(p), alone=True)  # noqa: E731 - the forced tile, built by itself
    forced = ", ".join(f"{k}={v.name if k == 'tile' else v}" for k, v in
                       (("tile", tile), ("iterator", iterator), ("swizzle", swizzle)) if v is not None)
    return Variant(
        name=name,
        day=13,
        cu_file=CU_FILE,
        summary="the production kernel: cp.async pipeline, tile descriptions, three iterators, swizzle, fused epilogue"
        + (f" ({forced}{', built alone' if alone else ''})" if forced else ""),
        config_fn=config_fn,
        supports_fn=config_reason,
        launches_fn=production_launches,
        covers_fn=covers,
        dtypes=("fp16", "bf16"),
        layouts=("NHWC",),
        accum="fp32",
        operands=("cin", "bias"),
        fused_epilogue=True,
        tensor_check_fn=tensor_check,
        min_cc=TENSOR_CORE_CC,
        min_cc_why="cp.async, mma.sync m16n8k16 with bf16, ldmatrix",
    )


register(make_production())
