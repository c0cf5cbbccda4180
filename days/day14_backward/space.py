"""Day 14's search spaces for day 15's tuner: ``wgrad`` (every ``WGRAD_ENTRY`` tile of
``14_wgrad.cu`` times split factors, parallel split-K) and ``dgrad`` (every ``DGRAD_ENTRY`` tile
with the problem's iterator times the threadblock swizzle).

**wgrad.**
A configuration is named ``<tile>_k<splits>``, e.g. ``128x64x32_w2x2_s4_k23``. All tiles live in
one module (one build); the split factor is a launch argument. The candidates are each tile at
split factors 1, 2, 4, ... up to the steps of GEMM-K allow `MIN_SLICE_STEPS` per slice, plus the
rule's own factor (`choose_splits`); the family is the tile, so each tile's best-predicted split
is timed. The winner's variations are the split factors between its neighbours in that ladder.
The model (`helpers.tune.gemm_tile_us`) sees the GEMM M = K, N = C·R·S, GEMM-K = N·P·Q split
``splits`` ways, and the partials' traffic (each slice writes, the reduction reads, K·C·R·S fp32
values) as extra DRAM bytes, plus the reduction's launch.

**dgrad.** A configuration is named as day 13's, ``<tile>_sw<swizzle>``. All tiles live in one module;
the swizzle is a launch argument (the variations). The model sees each phase GEMM as the largest
phase's (M = N·⌈H/sh⌉·⌈W/sw⌉, N = C, GEMM-K = K·⌈R/sh⌉·⌈S/sw⌉), once per phase launch.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from functools import cache

from helpers.problem import Conv2dProblem
from helpers.tune import Candidate, GemmTile, Machine, Space, gemm_tile_us, register_space
from helpers.variants import Variant

from ..day13_igemm_production import TileDescription
from ..day13_igemm_production import space as fprop_space
from ..kit import cdiv
from .dgrad import choose_config, dgrad_plan, instantiated, make_dgrad, phase_gemm_problem
from .wgrad import MIN_SLICE_STEPS, WgradTile, choose_wgrad, make_wgrad, tiles

VARIANT = "wgrad"


def config_name(tile: WgradTile, splits: int) -> str:
    return f"{tile.name}_k{splits}"


def parse_config(config: str) -> tuple[WgradTile, int]:
    """``"128x64x32_w2x2_s4_k23"`` -> (that tile, 23).

    Raises:
        ValueError: not a configuration name, or a tile ``14_wgrad.cu`` does not instantiate.
    """
    m = re.fullmatch(r"(.+)_k(\d+)", config)
    if not m or m.group(1) not in tiles():
        raise ValueError(f"a {VARIANT} configuration looks like '128x64x32_w2x2_s4_k23' (a WGRAD_ENTRY tile); "
                         f"got {config!r}")
    return tiles()[m.group(1)], int(m.group(2))


@cache
def variant_for(config: str) -> Variant:
    """The parallel split-K variant of a configuration (one object per name)."""
    tile, splits = parse_config(config)
    return make_wgrad(f"{VARIANT}[{config}]", tile=tile, splits=splits)


def max_splits(p: Conv2dProblem, tile: WgradTile) -> int:
    """The most slices that leave each at least `MIN_SLICE_STEPS` GEMM-K steps (at least 1)."""
    return max(1, cdiv(p.N * p.P * p.Q, tile.bk) // MIN_SLICE_STEPS)


def ladder(p: Conv2dProblem, tile: WgradTile) -> list[int]:
    """1, 2, 4, ... up to `max_splits`, and the rule's factor."""
    top = max_splits(p, tile)
    out = {1 << i for i in range(top.bit_length()) if 1 << i <= top}
    out.add(choose_wgrad(p, tile=tile).splits)
    return sorted(out)


def gemm_tile(p: Conv2dProblem, tile: WgradTile, splits: int) -> GemmTile:
    """The model's view: M = K, N = C·R·S, GEMM-K = N·P·Q in ``splits`` slices; registers
    estimated as the accumulators plus 80; DRAM: x and dy once, dw, and with more than one slice
    the partials written and read back (8 bytes per dw element per slice)."""
    g = p.gemm
    wm, wn = tile.bm // tile.warps_m, tile.bn // tile.warps_n
    regs = min(255, wm * wn // 32 + 80)
    kn = p.K * p.C * p.R * p.S
    partials = 8 * splits * kn if splits > 1 else 0
    return GemmTile(m=g.m, n=g.n, k=g.k, bm=tile.bm, bn=tile.bn, bk=tile.bk, warp_m=wm, warp_n=wn,
                    threads=tile.threads, stages=tile.stages, shared_bytes=tile.shared_bytes, regs=regs,
                    steps=cdiv(cdiv(g.k, tile.bk), splits), splits=splits, dram_bytes=p.min_bytes,
                    extra_bytes=partials)


def candidates(p: Conv2dProblem, machine: Machine) -> list[Candidate]:
    """Every tile at every split of its `ladder`; the rule's (tile, splits) is the prior. The
    reduction of a split run costs one more launch (``machine.launch_us``)."""
    rule = choose_wgrad(p)
    out = []
    for tile in tiles().values():
        for s in ladder(p, tile):
            us = gemm_tile_us(gemm_tile(p, tile, s), machine) + (machine.launch_us if s > 1 else 0.0)
            cfg = config_name(tile, s)
            out.append(Candidate(cfg, variant_for(cfg), us, tile == rule.tile and s == rule.splits, family=tile.name))
    return out


def between_splits(s: int, top: int, tried: list[int]) -> list[int]:
    """The split factors about 0.7x and 1.4x of ``s`` (between its neighbours in a ladder of
    powers of 2), within 1 .. ``top`` and not in ``tried``: a split-K space's variations (day 14's
    and day 19's wgrad)."""
    return sorted({f for f in (round(s / math.sqrt(2)), round(s * math.sqrt(2)))
                   if 1 <= f <= top and f != s and f not in tried})


def variations(config: str, p: Conv2dProblem) -> list[str]:
    """Split factors between the configuration's neighbours in its tile's `ladder` (`between_splits`)."""
    tile, s = parse_config(config)
    return [config_name(tile, f) for f in between_splits(s, max_splits(p, tile), ladder(p, tile))]


SPACE = register_space(Space(VARIANT, candidates, variations, lambda cfg, p: variant_for(cfg),
                             summary="WGRAD_ENTRY tiles x split factors (parallel split-K)"))


# ---- dgrad ------------------------------------------------------------------------------------------


@cache
def dgrad_variant_for(config: str) -> Variant:
    """The dgrad variant of a configuration ``<tile>_sw<swizzle>`` (one object per name)."""
    tile, sw = fprop_space.parse_config(config)
    return make_dgrad(f"dgrad[{config}]", tile=tile, swizzle=sw)


def dgrad_gemm_tile(p: Conv2dProblem, tile: TileDescription) -> GemmTile:
    """The model's view of one phase GEMM: day 13's `fprop_space.gemm_tile` of the largest phase
    (`phase_gemm_problem`) with ⌈R/sh⌉·⌈S/sw⌉ taps, its share of the tensors' bytes."""
    g = phase_gemm_problem(p)
    taps = cdiv(p.R, p.stride[0]) * cdiv(p.S, p.stride[1])
    phases = max(len(dgrad_plan(p)), 1)
    base = fprop_space.gemm_tile(g, tile)
    return replace(base, k=base.k * taps, steps=taps * cdiv(p.K, tile.bk), dram_bytes=p.min_bytes // phases)


def dgrad_candidates(p: Conv2dProblem, machine: Machine) -> list[Candidate]:
    """Every ``DGRAD_ENTRY`` tile instantiated with the problem's iterator, at its default swizzle;
    the rule's (`choose_config`) is the prior; each its own family."""
    rule = choose_config(p)
    g = phase_gemm_problem(p)
    out = []
    phases = max(len(dgrad_plan(p)), 1)
    for name, its in instantiated().items():
        if rule.iterator not in its:
            continue
        t = TileDescription.parse(name)
        cfg = fprop_space.config_name(t, fprop_space.choose_swizzle(g, t))
        us = phases * gemm_tile_us(dgrad_gemm_tile(p, t), machine)
        out.append(Candidate(cfg, dgrad_variant_for(cfg), us, t == rule.tile, family=name))
    return out


def dgrad_variations(config: str, p: Conv2dProblem) -> list[str]:
    """The other swizzles of the tile: 0 .. min(3, ⌈log2(C / BN)⌉)."""
    return fprop_space.variations(config, replace(phase_gemm_problem(p), name=""))


DGRAD_SPACE = register_space(Space("dgrad", dgrad_candidates, dgrad_variations, lambda cfg, p: dgrad_variant_for(cfg),
                                   summary="DGRAD_ENTRY tiles x threadblock swizzle"))
