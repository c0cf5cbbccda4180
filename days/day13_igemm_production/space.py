"""Day 13's search space for day 15's tuner: every tile description the kernel can build, each
built alone (`tune_defines`; a search's tiles share nvcc runs through `tune_entry_line`), and
the threadblock swizzle as a runtime variation.

A configuration is named ``<tile>_sw<swizzle>``, e.g. ``128x128x64_w2x2_s3_b1_sw2``. The tiles
are the grid `TILE_GRID` (block tile, warps, stages, resident blocks) filtered by
`TileDescription.reason`: the kernel's own static rules, nothing fitted. Each candidate's
predicted time is `helpers.tune.gemm_tile_us` of its tile on the problem's GEMM; the prior is
day 13's rule (`choose`). Problems the optimized iterator cannot take (C % 8 != 0, R or S > 16)
have one candidate, the rule's.
"""

from __future__ import annotations

import itertools
import math
import re
from functools import cache

from helpers.problem import Conv2dProblem
from helpers.tune import Candidate, GemmTile, Machine, Space, gemm_tile_us, register_space
from helpers.variants import Variant, get

from ..kit import cdiv
from .rule import choose, choose_iterator, choose_swizzle
from .tiles import MAX_SMEM_PER_BLOCK, TileDescription, tune_entry_line
from .variant import make_production

VARIANT = "igemm_production"
# (BM, BN, BK) x (warps_m, warps_n) x stages x min_blocks, before the kernel's rules filter it.
TILE_GRID = (
    tuple(itertools.product((64, 128, 256), (64, 128, 256), (32, 64))),
    ((1, 2), (2, 1), (2, 2), (2, 4), (4, 2), (4, 4)),
    (2, 3, 4, 5),
    (1, 2),
)
MAX_SWIZZLE = 3


@cache
def tiles(smem_limit: int = MAX_SMEM_PER_BLOCK) -> tuple[TileDescription, ...]:
    """Every tile of `TILE_GRID` the kernel can build alone within ``smem_limit`` bytes."""
    out = []
    for (bm, bn, bk), (wm, wn), st, mb in itertools.product(*TILE_GRID):
        t = TileDescription(bm, bn, bk, wm, wn, st, mb)
        if t.reason(smem_limit=smem_limit, instantiated=False) is None:
            out.append(t)
    return tuple(out)


def config_name(tile: TileDescription, swizzle: int) -> str:
    return f"{tile.name}_sw{swizzle}"


def parse_config(config: str) -> tuple[TileDescription, int]:
    """``"128x64x32_w2x2_s4_b1_sw2"`` -> (that tile, 2).

    Raises:
        ValueError: not a configuration name.
    """
    m = re.fullmatch(r"(.+)_sw(\d)", config)
    if not m:
        raise ValueError(f"a {VARIANT} configuration looks like '128x64x32_w2x2_s4_b1_sw2'; got {config!r}")
    return TileDescription.parse(m.group(1)), int(m.group(2))


@cache
def variant_for(config: str) -> Variant:
    """The variant of a configuration: its tile built alone, its swizzle (one object per name)."""
    tile, sw = parse_config(config)
    return make_production(f"{VARIANT}[{config}]", tile=tile, swizzle=sw, alone=True)


def dram_bytes(p: Conv2dProblem) -> int:
    """Bytes an fprop must move through DRAM: w and y once, and of x what the taps touch: all of
    it, or N·P·Q·C·R·S elements when that is less (a strided 1x1 reads a quarter of x)."""
    x = min(p.x_numel, p.N * p.P * p.Q * p.C * p.R * p.S)
    return p.itemsize * (x + p.w_numel + p.y_numel)


def gemm_tile(p: Conv2dProblem, t: TileDescription) -> GemmTile:
    """The model's view of ``t`` on ``p``: GEMM sizes, R·S·ceil(C/BK) steps, shared memory,
    `dram_bytes`, and
    registers estimated as the accumulators, the fragments (twice with fragment double
    buffering), three per loader row and 30 more, capped by ``__launch_bounds__``."""
    g = p.gemm
    wm, wn = t.warp_tile
    frags = (wm // 16) * 4 + (wn // 8) * 2
    rows_per_pass = t.threads // (t.bk // 8)
    loader_rows = t.bm // rows_per_pass + t.bn // rows_per_pass
    cap = min(255, 65536 // (t.threads * t.min_blocks))
    regs = min(cap, t.accumulators_per_thread + frags * (2 if t.fragment_double_buffering() else 1)
               + 3 * loader_rows + 30)
    return GemmTile(m=g.m, n=g.n, k=g.k, bm=t.bm, bn=t.bn, bk=t.bk, warp_m=wm, warp_n=wn, threads=t.threads,
                    stages=t.stages, shared_bytes=t.shared_bytes, regs=regs,
                    steps=p.R * p.S * cdiv(p.C // p.groups, t.bk), dram_bytes=dram_bytes(p))


def candidates(p: Conv2dProblem, machine: Machine) -> list[Candidate]:
    """Every buildable tile with its default swizzle (`choose_swizzle`), the model's time each,
    in families by block shape (BM x BN x BK); the rule's tile is the prior. Without the optimized
    iterator: the rule's configuration only (built from the ``.cu`` file's entries)."""
    rule = choose(p)
    if choose_iterator(p) != "optimized":
        return [Candidate(f"rule:{rule.tile.name}_{rule.iterator}_sw{rule.swizzle}", get(VARIANT), math.nan, True)]
    out = []
    for t in tiles():
        cfg = config_name(t, choose_swizzle(p, t))
        us = gemm_tile_us(gemm_tile(p, t), machine)
        out.append(Candidate(cfg, variant_for(cfg), us, t == rule.tile, family=f"{t.bm}x{t.bn}x{t.bk}"))
    return out


def variations(config: str, p: Conv2dProblem) -> list[str]:
    """The other swizzles of the configuration's tile that change the block order: 0 ..
    min(`MAX_SWIZZLE`, ceil(log2(filter tiles)))."""
    if config.startswith("rule:"):
        return []
    tile, sw = parse_config(config)
    n_tiles = cdiv(p.K, tile.bn)
    top = min(MAX_SWIZZLE, math.ceil(math.log2(n_tiles))) if n_tiles > 1 else 0
    return [config_name(tile, s) for s in range(top + 1) if s != sw]


def _variant_for(config: str, p: Conv2dProblem) -> Variant:
    return get(VARIANT) if config.startswith("rule:") else variant_for(config)


SPACE = register_space(Space(VARIANT, candidates, variations, _variant_for,
                             summary="tile descriptions built alone x threadblock swizzle", merge=tune_entry_line))
