"""Day 13's choices per problem: the input iterator, the tile description (the tile rule) and
the threadblock swizzle; `choose` makes all three into a `ProductionConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers.problem import Conv2dProblem
from helpers.variants import LaunchConfig

from ..kit import blocks, cdiv
from .tiles import TileDescription

ITERATORS = ("analytic", "optimized", "few_channels")
FEW_CHANNELS_MAX_C = 8
MAX_MASKED_TAPS = 16  # optimized: one bit per filter row (bits 0..15) and column (16..31) per A row


def iterator_reason(p: Conv2dProblem, iterator: str) -> str | None:
    """None if ``iterator`` handles ``p``'s channel count (and, for ``optimized``, its filter size:
    R, S <= `MAX_MASKED_TAPS`), else why not."""
    if iterator not in ITERATORS:
        return f"iterator {iterator!r}: choose one of {', '.join(ITERATORS)}"
    if iterator == "optimized" and p.C % 8:
        return f"the optimized iterator loads 8 channels (16 bytes) at a time: needs C % 8 == 0; got C = {p.C}"
    if iterator == "optimized" and max(p.R, p.S) > MAX_MASKED_TAPS:
        return (
            f"the optimized iterator keeps one bit per filter row and column (tap masks): needs "
            f"R, S <= {MAX_MASKED_TAPS}; got R = {p.R}, S = {p.S}"
        )
    if iterator == "few_channels" and p.C > FEW_CHANNELS_MAX_C:
        return f"the few_channels iterator is for C <= {FEW_CHANNELS_MAX_C}; got C = {p.C}"
    return None


def choose_iterator(p: Conv2dProblem) -> str:
    """``optimized`` if C % 8 == 0 and R, S <= `MAX_MASKED_TAPS`, ``few_channels`` if C <= 8,
    else ``analytic``."""
    if iterator_reason(p, "optimized") is None:
        return "optimized"
    return "few_channels" if p.C <= FEW_CHANNELS_MAX_C else "analytic"


# The tile rule (see `choose_tile`), fitted to sweeps of the optimized tile descriptions over the
# 38 ResNet-50 layers (N = 32 and 256, fp16) on the H200 (132 SMs). What won:
# * K <= 64: 128 x 64 x 32 (4 warps of 64 x 32; 159 registers, 3 blocks per SM): a 128-wide
#   filter tile would be half empty;
# * wherever 128 x 128 makes at least MIN_BLOCKS tiles: 128 x 128 x 64, 3 stages, with 4 warps of
#   64 x 64 and fragment double buffering (255 registers, 96 KiB of shared memory, 2 blocks per
#   SM): half the pipeline steps of BK = 32, so half the per-step copies, waits and barriers;
# * fewer tiles: 128 x 64 x 32, and below MIN_BLOCKS of those 64 x 64 x 64 (more, smaller
#   blocks with fewer pipeline steps each).
# Day 13's executed notebook (section 8) runs the sweep and compares the rule with the best tile
# per layer; the rule is fitted to these layers and this GPU (day 15 tunes per workload).
MIN_BLOCKS = 200


def choose_tile(p: Conv2dProblem, iterator: str | None = None) -> TileDescription:
    """The tile description ``igemm_production`` runs for ``p`` (the rule above).

    ``optimized``: K <= 64 -> 128x64x32_w2x2_s4_b1; else 128x128x64_w2x2_s3_b1 if it makes at
    least `MIN_BLOCKS` tiles, else 128x64x32_w2x2_s4_b1 if that does, else 64x64x64_w2x2_s4_b1.
    ``analytic``/``few_channels``: 128x64x32_w2x2_s4_b1 if it makes `MIN_BLOCKS` tiles, else
    64x64x32_w2x2_s4_b1.
    """
    it = iterator or choose_iterator(p)
    mid = TileDescription.parse("128x64x32_w2x2_s4_b1")
    if it != "optimized":
        return mid if blocks(p, mid) >= MIN_BLOCKS else TileDescription.parse("64x64x32_w2x2_s4_b1")
    big = TileDescription.parse("128x128x64_w2x2_s3_b1")
    if p.K > 64 and blocks(p, big) >= MIN_BLOCKS:
        return big
    if p.K <= 64 or blocks(p, mid) >= MIN_BLOCKS:
        return mid
    return TileDescription.parse("64x64x64_w2x2_s4_b1")


def choose_swizzle(p: Conv2dProblem, tile: TileDescription) -> int:
    """log2 of the filter tiles that consecutive blocks visit: 0 (no swizzle) for one filter
    tile, else 1 for two and 2 for more (4 filter tiles per A tile, CUTLASS's common choice)."""
    n_tiles = cdiv(p.K, tile.bn)
    return 0 if n_tiles == 1 else 1 if n_tiles == 2 else 2


@dataclass(frozen=True)
class ProductionConfig:
    """What one launch runs: a tile description, an iterator and a swizzle (log2); ``alone``: the
    tile is built by itself (`tune_defines`: any valid optimized tile, instantiated or not)."""

    tile: TileDescription
    iterator: str
    swizzle: int
    alone: bool = False

    def entry(self, dtype: str) -> str:
        return f"igemm_production_{self.tile.name}_{self.iterator}_{dtype}"

    def launch(self, p: Conv2dProblem) -> LaunchConfig:
        """grid (ceil(M/BM) << swizzle, ceil(ceil(K/BN) / 2^swizzle)), block (32·warps)."""
        t, lg = self.tile, self.swizzle
        m_tiles, n_tiles = cdiv(p.gemm.m, t.bm), cdiv(p.K, t.bn)
        return LaunchConfig(grid=(m_tiles << lg, cdiv(n_tiles, 1 << lg), 1), block=(t.threads, 1, 1),
                            shared_bytes=t.shared_bytes)


def choose(
    p: Conv2dProblem, tile: TileDescription | str | None = None, iterator: str | None = None, swizzle: int | None = None
) -> ProductionConfig:
    """The configuration for ``p``: each of ``tile`` (a `TileDescription` or its name),
    ``iterator`` and ``swizzle`` left None is chosen by `choose_tile`, `choose_iterator`,
    `choose_swizzle`. Nothing is validated here (see `config_reason`)."""
    it = iterator or choose_iterator(p)
    t = TileDescription.parse(tile) if isinstance(tile, str) else tile or choose_tile(p, it)
    sw = choose_swizzle(p, t) if swizzle is None else swizzle
    return ProductionConfig(t, it, sw)
