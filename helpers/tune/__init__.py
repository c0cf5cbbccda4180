"""The per-workload tuner (day 15): search a variant's configurations per problem, keep the winner
in a persistent cache, and run a variant with the tuned choice.

A tunable variant plugs in a `Space` (`register_space`, from its day module): the candidates for
a problem (each a configuration name, the `Variant` that runs it and the cost model's predicted
time), the variations of a winner that need no new build (e.g. the threadblock swizzle, a
runtime argument), and how to rebuild a candidate from its name. `tune_problem` then:

1. enumerates the space and drops what the variant refuses on this GPU (`Variant.supports`);
2. **prunes by the model**: keeps the `KEEP` best-ranked candidates, the best-ranked of each
   family (day 13: block-tile shape) and the fitted rule's own pick (the prior), so the model's
   first choice is never dropped (`prune`);
3. **compiles** the survivors' kernels in parallel, one nvcc per CPU core
   (`helpers.compile.build_many`);
4. **times** each survivor briefly (`QUICK_REPS` repetitions, cold L2) and stops early on clear
   losers: a candidate slower than `LOSER` times the best so far gets no more repetitions; the
   close ones get `CLOSE_REPS` more; each output is poisoned with NaN before the candidate runs
   and checked against the float64 reference with the harness's bound (`helpers.reference.compare`,
   `helpers.reference.judge`): a candidate that leaves an element unwritten or computes it wrongly is
   dropped and counted, never chosen;
5. tries the winner's variations, then re-times the winner properly (`FINAL_TARGET_MS`), and the
   prior the same way (the rule's time to compare with: short timings run a few per cent fast).

Where timing is not wanted, `pick` answers with the model's first choice (step 2 alone: nothing
built or timed), cached as not timed, checked against the float64 reference by `tuned` on first
use and replaced by the next timed search (``python -m benchmarks.tune --no-time``).

`TuneCache` keeps each answer in a JSON file keyed by the GPU, its driver, the CUDA and nvcc
versions, the hash of the kernel's source (the ``.cu`` file and what it includes:
`helpers.compile.source_hash`), the variant and the problem: a warm cache answers without
timing, and an edited kernel misses. `tuned` is a variant that runs the cached choice (the rule's
where the cache has none, or where the choice fails `helpers.check.check`, run once per problem
and choice in a process).

The cost model (`gemm_tile_us`) is generic over implicit-GEMM tiles: waves of resident blocks over
the SMs (occupancy from shared memory, registers and threads), the tensor-core time of the
padded tile work at a rate that grows with the warp tile, the DRAM and L2 traffic, and a per-block
pipeline fill; `Machine` holds the rates it reads, measured on the GPU present by a short probe
run once per environment and cached (`probe.machine_for`, issue 46). ``H200`` is the machine of
the H200's committed runs (``benchmarks/results/nvidia-h200/machine.json``, `probe.committed`),
for the model without that GPU (day 15's figures replay the H200's sweeps).

The package by layer: `machine` (the cost model), `space` (search spaces and pruning), `cache`
(the persistent cache), `probe` (the measured machine) and `search` (the search, `tune`,
`tuned`); the names below are theirs (`probe.measure` stays under its module: `measure` here is
the search's step 4).

Sources: the tuning practice surveyed in issue #16 (CUTLASS's profiler; per-shape caches, parallel
builds and top-k prescreening in public autotuners), NVIDIA's CUDA C++ Best Practices Guide
("Occupancy", "Calculating occupancy").
"""

from __future__ import annotations

from . import probe
from .cache import CACHE_ENV, TuneCache, TuneCacheWarning, default_cache_path, problem_key, valid_entry
from .machine import (
    COVER_WARPS,
    EPILOGUE_US,
    FITTED,
    LOAD_LATENCY_US,
    WARP_TILE_COST,
    GemmTile,
    Machine,
    gemm_tile_us,
    occupancy,
)
from .probe import committed, machine_for
from .search import (
    CACHED,
    CLOSE_REPS,
    FINAL_TARGET_MS,
    LOSER,
    QUICK_REPS,
    Reference,
    Search,
    Trial,
    check_winner,
    enumerate_search,
    measure,
    pick,
    sweep,
    tune,
    tune_problem,
    tuned,
)
from .space import KEEP, SPACES, Candidate, Space, prune, register_space, space_of

__all__ = [
    "CACHED", "CACHE_ENV", "CLOSE_REPS", "COVER_WARPS", "EPILOGUE_US", "FINAL_TARGET_MS", "FITTED", "H200", "KEEP",
    "LOAD_LATENCY_US", "LOSER", "QUICK_REPS", "SPACES", "WARP_TILE_COST", "Candidate", "GemmTile", "Machine",
    "Reference", "Search", "Space", "Trial", "TuneCache", "TuneCacheWarning", "check_winner", "committed",
    "default_cache_path", "enumerate_search", "gemm_tile_us", "machine_for", "measure", "occupancy", "pick", "probe",
    "problem_key", "prune", "register_space", "space_of", "sweep", "tune", "tune_problem", "tuned", "valid_entry",
]


def __getattr__(name: str):
    """``H200``: the committed H200 machine (`probe.committed`), read on first use."""
    if name == "H200":
        return committed("nvidia-h200")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
