"""Day 20's search spaces for day 15's tuner: the GEMM tile of ``winograd_f2`` and ``winograd_f4``.

The pipeline's choice is the block tile of its n² batched GEMMs (`WinoConfig`, one of the
compiled `GEMM_TILES`), made by a first rule (`default_tile`) that no GPU run has fitted; the
tuner times the tiles instead. Every tile is in the same build (one module for the variant's four
entries), so a candidate costs a timing, no compile. A configuration is named as its tile,
``"128x64"`` (BM x BN). There are no variations (no runtime argument changes the work).

The model (`candidate_us`): the three transforms move their tensors through DRAM once each
(`transform_bytes`, plus a launch each), the same for every tile; the GEMM is
`helpers.tune.gemm_tile_us` of the batched SGEMM on CUDA cores (`gemm_tile`). Day 21's fused
variants have spaces of their own (`days.day21_winograd_fused.space_candidates`).
"""

from __future__ import annotations

import functools

from helpers.problem import Conv2dProblem
from helpers.tune import Candidate, GemmTile, Machine, Space, gemm_tile_us, register_space
from helpers.variants import Variant

from .pipeline import (
    FLOAT_BYTES,
    GEMM_BK,
    GEMM_THREADS,
    GEMM_TILES,
    REGISTERED_MS,
    Geometry,
    WinoConfig,
    default_tile,
    make_winograd,
)


def parse_config(config: str) -> WinoConfig:
    """``"128x64"`` -> WinoConfig(128, 64).

    Raises:
        ValueError: not ``<BM>x<BN>``, or a tile `GEMM_TILES` does not compile.
    """
    try:
        bm, bn = (int(v) for v in config.split("x"))
    except ValueError:
        raise ValueError(f"a Winograd GEMM tile is named like '128x64'; got {config!r}") from None
    return WinoConfig(bm, bn)


@functools.cache
def space_variant(m: int, config: str) -> Variant:
    """``winograd_f<m>`` with the GEMM tile ``config`` forced (one object per name)."""
    return make_winograd(m, f"winograd_f{m}[{config}]", parse_config(config))


def gemm_tile(p: Conv2dProblem, m: int, cfg: WinoConfig) -> GemmTile:
    """The model's view of the n² GEMMs of F(m) on ``p`` with tile ``cfg``: each (Mg, Ng, Kg) of
    `Geometry.gemm`, a batch of n², fp32 on CUDA cores; 256 threads, thread tile BM/16 x BN/16, a
    warp 2 x 16 threads (thread (tid / 16, tid % 16)), so its tile is BM/8 x BN; the
    double-buffered shared tiles (A's rows padded by 4 floats); the accumulators plus about 64
    registers; DRAM: U and V read once, M written once."""
    g = Geometry.of(p, m)
    mg, ng, kg = g.gemm
    tm, tn = cfg.bm // 16, cfg.bn // 16
    shared = 2 * GEMM_BK * (cfg.bm + 4 + cfg.bn) * FLOAT_BYTES
    dram = FLOAT_BYTES * (g.elements("U") + g.elements("V") + g.elements("M"))
    return GemmTile(m=mg, n=ng, k=kg, bm=cfg.bm, bn=cfg.bn, bk=GEMM_BK, warp_m=2 * tm, warp_n=16 * tn,
                    threads=GEMM_THREADS, stages=2, shared_bytes=shared, regs=min(255, tm * tn + 64),
                    dram_bytes=dram, batch=g.positions, element_bytes=FLOAT_BYTES, cuda_cores=True)


def transform_bytes(p: Conv2dProblem, m: int) -> int:
    """Bytes the three transforms move: w read and U written, x read and V written, M read and
    y written (each once; the input transform's overlapping tiles are read from cache)."""
    g = Geometry.of(p, m)
    w = p.K * p.C * p.R * p.S
    x, y = p.N * p.C * p.H * p.W, p.N * p.K * p.P * p.Q
    return FLOAT_BYTES * (w + g.elements("U") + x + g.elements("V") + g.elements("M") + y)


def candidate_us(p: Conv2dProblem, m: int, cfg: WinoConfig, machine: Machine) -> float:
    """Predicted µs of a run: the transforms' bytes at the DRAM rate plus three launches, and the
    GEMM's `gemm_tile_us`."""
    return transform_bytes(p, m) / (machine.dram_gbps * 1e3) + 3 * machine.launch_us + gemm_tile_us(
        gemm_tile(p, m, cfg), machine)


def space_candidates(m: int, p: Conv2dProblem, machine: Machine) -> list[Candidate]:
    """Every compiled GEMM tile, the model's time each, one family; the rule's tile (`default_tile`)
    is the prior."""
    rule = default_tile(p, m)
    return [Candidate(cfg.name, space_variant(m, cfg.name), candidate_us(p, m, cfg, machine), cfg == rule)
            for cfg in (WinoConfig(bm, bn) for bm, bn in GEMM_TILES)]


SPACES = {
    m: register_space(Space(f"winograd_f{m}", functools.partial(space_candidates, m), lambda config, p: [],
                            lambda config, p, m=m: space_variant(m, config),
                            summary="the batched GEMM's block tile (one build)"))
    for m in REGISTERED_MS
}
