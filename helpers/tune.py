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
   and checked against the float64 reference with the harness's bound (`helpers.check.compare`,
   `helpers.check.judge`): a candidate that leaves an element unwritten or computes it wrongly is
   dropped and counted, never chosen;
5. tries the winner's variations, then re-times the winner properly (`FINAL_TARGET_MS`), and the
   prior the same way (the rule's time to compare with: short timings run a few per cent fast).

`TuneCache` keeps each answer in a JSON file keyed by the GPU, its driver, the CUDA and nvcc
versions, the hash of the kernel's source (the ``.cu`` file and what it includes:
`helpers.compile.source_hash`), the variant and the problem: a warm cache answers without
timing, and an edited kernel misses. `tuned` is a variant that runs the cached choice (the rule's
where the cache has none, or where the choice fails `helpers.check.check`, run once per problem
and choice in a process).

The cost model (`gemm_tile_us`) is generic over implicit-GEMM tiles: waves of resident blocks over
the SMs (occupancy from shared memory, registers and threads), the tensor-core time of the
padded tile work at a rate that grows with the warp tile, the DRAM and L2 traffic, and a per-block
pipeline fill; `Machine` holds the rates it reads.

Sources: the tuning practice surveyed in issue #16 (CUTLASS's profiler; per-shape caches, parallel
builds and top-k prescreening in public autotuners), NVIDIA's CUDA C++ Best Practices Guide
("Occupancy", "Calculating occupancy").
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
from filelock import FileLock

from . import gpu
from .problem import Conv2dProblem
from .variants import Variant, get

KEEP = 8  # candidates timed per problem after pruning (plus the prior)
QUICK_REPS = 3  # first repetitions of each survivor
CLOSE_REPS = 10  # more repetitions for those within LOSER of the best
LOSER = 1.15  # a median this many times the best so far ends a candidate's timing
FINAL_TARGET_MS = 50.0  # the winner's final timing: repetitions for about this much GPU time
CACHE_ENV = "CONV2D_DAYS_TUNE_CACHE"  # overrides `default_cache_path`


# ---- the machine the model reads ----------------------------------------------------------------


@dataclass(frozen=True)
class Machine:
    """The rates and limits the cost model uses.

    ``mma_tflops``: dense fp16 ``mma.sync`` with fp32 accumulation, all SMs (H200: 620, measured
    by day 11's probe); ``dram_gbps`` and ``l2_gbps``: device memory and L2 bandwidth (H200: copy
    measured at 4 TB/s; L2 an estimate); the rest from the device (`helpers.gpu.DeviceInfo`).
    """

    sms: int
    smem_per_sm: int
    regs_per_sm: int = 65536
    threads_per_sm: int = 2048
    mma_tflops: float = 620.0
    dram_gbps: float = 4000.0
    l2_gbps: float = 10000.0
    l2_bytes: int = 50 * 2**20
    launch_us: float = 3.0  # a launch's fixed cost on the GPU (ramp-up, tail)

    @classmethod
    def of(cls, info) -> Machine:
        """The machine of a `helpers.gpu.DeviceInfo`: its SMs, shared memory and L2; the mma.sync
        rate scaled from the H200's measured 620 TFLOP/s by SMs x clock (same per-SM rate: right
        for sm_90, an estimate elsewhere)."""
        clock = info.clock_mhz or 1980.0
        rate = 620.0 * info.sms * clock / (132 * 1980.0)
        return cls(sms=info.sms, smem_per_sm=info.smem_per_sm, regs_per_sm=info.regs_per_sm or 65536,
                   mma_tflops=rate, l2_bytes=info.l2_bytes or 50 * 2**20)


H200 = Machine(sms=132, smem_per_sm=228 * 1024)  # for the model without a GPU (CPU tests, the notebook's figures)


@dataclass(frozen=True)
class GemmTile:
    """What the model needs of one candidate: the GEMM (``m``, ``n``, ``k``), its tile (``bm``,
    ``bn``, ``bk``, ``warp_m`` x ``warp_n`` per warp, ``threads``, ``stages``), the bytes of shared
    memory and the registers per thread it is expected to use, the GEMM-K steps per block
    (``steps``, default ceil(k / bk)), the blocks per output tile (``splits``, split-K) and the
    bytes that must cross DRAM."""

    m: int
    n: int
    k: int
    bm: int
    bn: int
    bk: int
    warp_m: int
    warp_n: int
    threads: int
    stages: int
    shared_bytes: int
    regs: int
    steps: int | None = None
    splits: int = 1
    dram_bytes: int | None = None  # the tensors' own bytes (an implicit GEMM's A is x read R·S times); default A+B+C
    extra_bytes: int = 0  # traffic beyond them (e.g. split-K partials)


def occupancy(t: GemmTile, mc: Machine) -> int:
    """Resident blocks per SM: the least of what shared memory (plus 1 KB reserved per block),
    registers (allocated per warp in units of 256) and threads allow; at least 1."""
    by_smem = mc.smem_per_sm // (t.shared_bytes + 1024)
    regs_per_warp = math.ceil(t.regs * 32 / 256) * 256
    by_regs = mc.regs_per_sm // (regs_per_warp * (t.threads // 32))
    by_threads = mc.threads_per_sm // t.threads
    return max(1, min(by_smem, by_regs, by_threads, 32))


def gemm_tile_us(t: GemmTile, mc: Machine) -> float:
    """Predicted microseconds of one implicit-GEMM launch: three times, combined as their 4-norm
    (close to the largest, but the others still break ties), plus the launch cost.

    * **tensor cores**: each SM runs its share of blocks in rounds of `occupancy`. A GEMM-K step of
      the b resident blocks takes the longer of b · (a step's FLOPs) / (the SM's mma rate x the
      warp tile's efficiency x the latency cover) and the load latency spread over the steps in
      flight, `LOAD_LATENCY_US` / (b · (stages − 1)). The efficiency wm·wn / (wm·wn + 8·(wm + wn))
      charges the ldmatrix traffic per mma (small warp tiles reload more per FLOP); the cover
      min(1, resident warps / `COVER_WARPS`) is how much of the mma pipe a few warps keep busy. Each round
      also pays one latency to fill the pipeline and `EPILOGUE_US`;
    * **DRAM**: ``dram_bytes`` (the tensors once) plus ``extra_bytes``;
    * **L2**: the GEMM's A read once per column of tiles and B once per row of tiles (cp.async.cg
      bypasses L1, so every tap's read of x reaches L2).
    """
    steps = t.steps if t.steps is not None else math.ceil(t.k / t.bk)
    m_tiles, n_tiles = math.ceil(t.m / t.bm), math.ceil(t.n / t.bn)
    blocks = m_tiles * n_tiles * t.splits
    occ = occupancy(t, mc)
    per_sm = math.ceil(blocks / mc.sms)
    rounds = math.ceil(per_sm / occ)
    resident = min(occ, per_sm)
    sm_flops_per_us = mc.mma_tflops * 1e6 / mc.sms
    wm, wn = t.warp_m, t.warp_n
    shape_eff = wm * wn / (wm * wn + WARP_TILE_COST * (wm + wn))
    cover = min(1.0, resident * (t.threads // 32) / COVER_WARPS)
    step_us = max(resident * 2 * t.bm * t.bn * t.bk / (sm_flops_per_us * shape_eff * cover),
                  LOAD_LATENCY_US / (resident * max(t.stages - 1, 1)))
    tensor_us = rounds * (steps * step_us + LOAD_LATENCY_US + EPILOGUE_US)
    a_bytes, b_bytes, c_bytes = 2 * t.m * t.k, 2 * t.n * t.k, 2 * t.m * t.n
    dram = t.dram_bytes if t.dram_bytes is not None else a_bytes + b_bytes + c_bytes
    dram_us = (dram + t.extra_bytes) / (mc.dram_gbps * 1e3)
    l2_us = (a_bytes * n_tiles + b_bytes * m_tiles) / (mc.l2_gbps * 1e3)
    return (tensor_us**4 + dram_us**4 + l2_us**4) ** 0.25 + mc.launch_us


LOAD_LATENCY_US = 0.8  # a global load's latency under load (L2 or DRAM), µs
WARP_TILE_COST = 8  # the ldmatrix cost per warp-tile edge, in units of mma work (see gemm_tile_us)
COVER_WARPS = 4  # resident warps per SM that keep the mma pipe busy; fitted on ResNet-50's sweep (pruning replayed:
#                 0.985 of the exhaustive best with 8, 0.991 with 4), out of sample 0.984 and 0.985 (day 15, section 4)
EPILOGUE_US = 0.5  # a block's epilogue: the output tile through shared memory to global


# ---- spaces ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One configuration of a search: ``config`` names it (`Space.variant_for` rebuilds the
    variant from it), ``variant`` runs it, ``model_us`` is the model's predicted time (µs),
    ``prior`` marks the fitted rule's own pick, ``family`` groups candidates the model ranks
    among themselves better than across (day 13: one block-tile shape BM x BN x BK)."""

    config: str
    variant: Variant
    model_us: float
    prior: bool = False
    family: str = ""


@dataclass(frozen=True)
class Space:
    """A tunable variant's search space (see the module docstring).

    ``candidates(problem, machine)``: every configuration worth building for the problem, each a
    `Candidate`, exactly one with ``prior=True`` (the rule's pick) where the rule supports it;
    ``variations(config, problem)``: configurations that differ from ``config`` only in runtime
    arguments (tried on the winner; may be empty); ``variant_for(config, problem)``: the variant
    of a configuration name.
    """

    variant: str
    candidates: Callable[[Conv2dProblem, Machine], list[Candidate]]
    variations: Callable[[str, Conv2dProblem], list[str]]
    variant_for: Callable[[str, Conv2dProblem], Variant]
    summary: str = ""


SPACES: dict[str, Space] = {}


def register_space(space: Space) -> Space:
    """Make ``space.variant`` tunable (day modules call this when imported)."""
    if space.variant in SPACES:
        raise ValueError(f"a search space for {space.variant!r} is registered twice")
    SPACES[space.variant] = space
    return space


def space_of(variant: str | Variant) -> Space:
    """The search space of a registered variant.

    Raises:
        KeyError: the variant has none (the message lists the tunable ones).
    """
    name = variant.name if isinstance(variant, Variant) else variant
    get(name)  # imports the days package, whose modules register the spaces
    if name not in SPACES:
        raise KeyError(f"{name} has no search space; tunable: {', '.join(sorted(SPACES)) or 'none'}")
    return SPACES[name]


def prune(candidates: list[Candidate], keep: int = KEEP) -> list[Candidate]:
    """The ``keep`` candidates the model ranks best (lowest ``model_us``; ties keep their order),
    then the model's best of every ``family`` not yet among them, then the prior; in model order.
    The model's first choice is always the first survivor.

    Why families: measured against day 13's exhaustive sweep on ResNet-50 (day 15), the model
    orders the tiles of one block shape well but misjudges one shape against another (it favours
    8-warp and 256-wide tiles), so each shape's favourite is worth a short timing.

    Raises:
        ValueError: ``keep`` < 1."""
    if keep < 1:
        raise ValueError(f"keep = {keep}: at least 1 candidate must be timed")
    ranked = sorted(candidates, key=lambda c: c.model_us)
    out = ranked[:keep]
    families = {c.family for c in out}
    for c in ranked[len(out) :]:
        if c.family not in families or c.prior:
            out.append(c)
            families.add(c.family)
    return sorted(out, key=lambda c: c.model_us)


# ---- the persistent cache ----------------------------------------------------------------------


def default_cache_path() -> Path:
    """``$CONV2D_DAYS_TUNE_CACHE`` if set, else ``~/.cache/conv2d-days/tune.json``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "conv2d-days" / "tune.json"


@functools.lru_cache(maxsize=4096)
def problem_key(p: Conv2dProblem) -> str:
    """The problem's compared fields (not its label) as a compact string."""
    d = {f.name: getattr(p, f.name) for f in dataclasses.fields(p) if f.compare}
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


class TuneCacheWarning(UserWarning):
    """A tune cache file, or an entry of it, that cannot be used: the rule's choice runs instead."""


def _warn(message: str) -> None:
    warnings.warn(message, TuneCacheWarning, stacklevel=3)


def valid_entry(entry) -> bool:
    """Whether a cache entry holds what a hit answers with (`CACHED`): ``config`` and
    ``rule_config`` strings, ``ms`` and ``rule_ms`` numbers, ``model_rank`` an int."""
    if not isinstance(entry, dict) or not all(k in entry for k in CACHED):
        return False
    numbers = all(isinstance(entry[k], (int, float)) and not isinstance(entry[k], bool) for k in ("ms", "rule_ms"))
    return (numbers and isinstance(entry["config"], str) and isinstance(entry["rule_config"], str)
            and isinstance(entry["model_rank"], int))


def _file_mode(path: Path) -> int:
    """The permission bits ``path`` has, or a new file's under the process's umask (0666 & ~umask)."""
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


class TuneCache:
    """Tuned choices in a JSON file: {key: entry}, written after every new entry.

    The key (`key`) joins the environment (GPU, driver, CUDA, nvcc), the kernel's source hash, the
    variant and the problem, so anything that could change the answer changes the key; old keys
    are simply never asked again. An entry holds the configuration, its time (ms) and how it was
    found.

    Several processes may tune into one file: `store` holds a lock file beside it
    (``<name>.lock``, `filelock`), merges its entry into what is on disk and replaces the file
    through a temporary file of its own, so no entry is lost and a reader never sees half a file.
    A file that is not a JSON object, or entries that are malformed (`valid_entry`), are left out
    with one `TuneCacheWarning` naming the file: those problems run the rule's choice.
    """

    def __init__(self, path: str | Path | None = None, environment: dict | None = None):
        self.path = Path(path) if path is not None else default_cache_path()
        self._env = environment
        self._prefixes: dict = {}  # (variant name, source hash) -> the key's first six fields
        self._checked: set = set()  # (key, configuration) stored here after `check_winner` passed it
        self.entries: dict = self._read(warn=True)

    def _read(self, warn: bool) -> dict:
        """The valid entries on disk ({} without a file); with ``warn``, one warning for a file or
        entries that cannot be used."""
        if not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            if warn:
                _warn(f"tune cache {self.path} is unreadable ({type(e).__name__}: {e}): the rule's choices run; "
                      "the next store rewrites it")
            return {}
        if not isinstance(data, dict):
            if warn:
                _warn(f"tune cache {self.path} holds a JSON {type(data).__name__}, not an object of entries: "
                      "the rule's choices run; the next store rewrites it")
            return {}
        good = {k: e for k, e in data.items() if valid_entry(e)}
        if warn and len(good) < len(data):
            _warn(f"tune cache {self.path}: {len(data) - len(good)} malformed entries left out (their problems run "
                  f"the rule's choice); an entry needs {', '.join(CACHED)}")
        return good

    @property
    def environment(self) -> dict:
        """{gpu, driver, cuda, nvcc}: `helpers.gpu.versions` and `helpers.compile.nvcc_version`."""
        if self._env is None:
            from .compile import nvcc_version
            from .gpu import versions

            v = versions()
            self._env = {"gpu": v["gpu"], "driver": v["driver"], "cuda": v["cuda"], "nvcc": nvcc_version()}
        return self._env

    def key(self, variant: Variant, p: Conv2dProblem) -> str:
        """``gpu|driver|cuda|nvcc|source|variant|problem``: the environment and source part made once
        per (variant, `helpers.compile.source_hash`), which costs a few ``stat`` calls per lookup."""
        from .compile import source_hash

        part = (variant.name, source_hash(variant.cu_file))
        prefix = self._prefixes.get(part)
        if prefix is None:
            env = self.environment
            prefix = self._prefixes[part] = "|".join([env["gpu"], env["driver"], env["cuda"], env["nvcc"],
                                                      part[1][:16], variant.name])
        return f"{prefix}|{problem_key(p)}"

    def checked(self, variant: Variant, p: Conv2dProblem, config: str) -> bool:
        """Whether this object stored ``config`` for (variant, problem) after `check_winner` passed it."""
        return (self.key(variant, p), config) in self._checked

    def lookup(self, variant: Variant, p: Conv2dProblem) -> dict | None:
        """The entry for (variant, problem) in this environment and source, or None."""
        return self.entries.get(self.key(variant, p))

    def store(self, variant: Variant, p: Conv2dProblem, entry: dict, checked: bool = False) -> None:
        """Add ``entry`` for (variant, problem) to the file, merged with what other processes
        stored since (under the lock), and take their entries in too; ``checked``: its
        configuration passed `check_winner` (`checked` answers so in this process).

        Raises:
            ValueError: ``entry`` is not a `valid_entry`.
        """
        if not valid_entry(entry):
            raise ValueError(f"a tune cache entry needs {', '.join(CACHED)} (strings, numbers); got {entry!r}")
        key = self.key(variant, p)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock"):
            merged = {**self._read(warn=False), key: entry}
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".", suffix=".tmp")
            try:
                os.chmod(tmp, _file_mode(self.path))  # mkstemp makes 0600: keep a shared cache readable
                with os.fdopen(fd, "w") as f:
                    json.dump(merged, f, indent=1, sort_keys=True)
                os.replace(tmp, self.path)  # atomic: a reader sees the old file or the new one
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        self.entries = merged
        if checked:
            self._checked.add((key, entry["config"]))


# ---- tuning -------------------------------------------------------------------------------------


@dataclass
class Trial:
    """One candidate's measurements in a search: medians (ms) of its timing rounds; none once an
    output failed the check against the float64 reference (``status`` "disagreed: <reason>",
    also for a winner that fails `helpers.check.check`) or it faulted (``status`` "error: ...")."""

    candidate: Candidate
    ms: list[float] = field(default_factory=list)
    status: str = "timed"

    @property
    def best_ms(self) -> float:
        return min(self.ms) if self.ms else math.inf

    def fail(self, status: str) -> None:
        """Drop the candidate: no time, ``status`` says why."""
        self.ms, self.status = [], status

    def run(self, p: Conv2dProblem, inputs: tuple, ref: Reference, reps: int | None,
            target_ms: float = 0.0) -> float | None:
        """One timing round (``reps`` repetitions, or about ``target_ms`` of them) whose output,
        poisoned with NaN first (`_time_ms`), is checked against ``ref``: its median (ms), also
        kept in ``ms``, or None when the output fails or the candidate faults (a build that
        failed, a launch error), which drops it (`fail`): the search goes on without it."""
        if self.status != "timed":
            return None
        try:
            ms, out = _time_ms(self.candidate.variant, p, inputs, reps, target_ms)
        except Exception as e:  # noqa: BLE001 - one candidate's fault drops it, not the search
            self.fail(f"error: {type(e).__name__}: {' '.join(str(e).split())[:200]}")
            return None
        reason = ref.reason(self.candidate.variant, out)
        if reason is not None:
            self.fail(f"disagreed: {reason}")
            return None
        self.ms.append(ms)
        return ms


def _time_ms(variant: Variant, p: Conv2dProblem, inputs: tuple, reps: int | None, target_ms: float = 0.0):
    from .timing import time_gpu
    from .variants import prepare

    plan, out = prepare(variant, p, *inputs, cache=True)  # a candidate is timed up to three times: plan it once
    out.fill_(float("nan"))  # an element the candidate never writes stays NaN (the block may hold an old output)
    kw = {"reps": reps} if reps else {"target_ms": target_ms}
    return time_gpu(plan, warmup=1, **kw).ms_p50, out


def _inputs(p: Conv2dProblem) -> tuple:
    """The inputs every candidate of a search runs on (seeded normal values, on the GPU)."""
    return p.make_inputs(device="cuda", kind="normal", seed=1)


@dataclass
class Reference:
    """What every candidate's output of one search is checked against: the problem, its inputs
    and, when the output is small enough, its float64 reference and scale made once
    (`helpers.check.expected`; else `helpers.check.compare` works band by band per output)."""

    problem: Conv2dProblem
    inputs: tuple
    expected: tuple | None = None

    @classmethod
    def of(cls, p: Conv2dProblem, inputs: tuple) -> Reference:
        from .check import expected

        return cls(p, inputs, expected(p, *inputs))

    def reason(self, variant: Variant, out: torch.Tensor) -> str | None:
        """None if ``out`` passes `helpers.check.judge` (NaN/Inf, the element bound, the relative L2
        limit) for ``variant``'s accumulator, else the verdict's reason."""
        from .check import compare, judge

        r = compare(self.problem, *self.inputs, out, accum=variant.accum, expected=self.expected)
        v = judge(variant=variant.name, problem=self.problem, kind="normal", accum=variant.accum,
                  nonfinite=r["nonfinite"], max_abs_err=r["max_abs_err"],
                  worst_err_over_bound=r["worst_err_over_bound"], rel_l2=r["rel_l2"], exact=None,
                  repeat_bitwise=True)
        return None if v.ok else v.reason


@dataclass
class Search:
    """One problem's search before any timing: the candidates the GPU supports, the survivors of
    `prune`, the model's rank of each candidate (1 = fastest predicted) and the seconds spent."""

    problem: Conv2dProblem
    candidates: list[Candidate]
    survivors: list[Candidate]
    rank: dict
    enumerate_s: float

    def jobs(self, exhaustive: bool = False) -> list[tuple[str, dict]]:
        """The (kernel file, defines) builds the search needs: the survivors', or every candidate's."""
        cs = self.candidates if exhaustive else self.survivors
        return [(c.variant.cu_file, k.build_defines(c.variant)) for c in cs for k in c.variant.launches(self.problem)]


def enumerate_search(space: Space, p: Conv2dProblem, keep: int = KEEP) -> Search:
    """Steps 1 and 2: the space's candidates for ``p`` that this GPU supports, and the survivors.

    Raises:
        ValueError: no candidate supports ``p`` on this GPU.
    """
    from .gpu import device_info

    t0 = time.perf_counter()
    info = device_info()
    cands = [c for c in space.candidates(p, Machine.of(info))
             if c.variant.supports(p, smem_limit=info.smem_per_block_optin, cc=info.cc) is None]
    if not cands:
        raise ValueError(f"no configuration of {space.variant} supports {p.name} on this GPU")
    rank = {c.config: i + 1 for i, c in enumerate(sorted(cands, key=lambda c: c.model_us))}
    return Search(p, cands, prune(cands, keep), rank, time.perf_counter() - t0)


def _best(trials: dict, what: str) -> Trial:
    """The fastest trial that is still timed (the first of equals: the prior comes first).

    Raises:
        RuntimeError: none is (every one failed the check or faulted; the message says how)."""
    live = [t for t in trials.values() if t.ms]
    if not live:
        why = "; ".join(f"{cfg}: {t.status}" for cfg, t in trials.items())
        raise RuntimeError(f"no configuration of {what} passed the check: {why}"[:600])
    return min(live, key=lambda t: t.best_ms)


def check_winner(variant: Variant, p: Conv2dProblem) -> str | None:
    """The harness's full verdict on a winner before it is cached: `helpers.check.check` (normal
    and, where exact, integer inputs: the integer run sees a dropped term that a long bf16
    reduction's rounding bound cannot). None if it passes, else the reason."""
    from .check import check

    r = check(variant, p)
    return None if r.ok else r.reason


def _final(trials: dict, p: Conv2dProblem, inputs: tuple, ref: Reference, what: str) -> tuple[Trial, float]:
    """The fastest trial re-timed properly (`FINAL_TARGET_MS`) and passed by `check_winner`, with
    its final median; one that fails either is dropped and the next fastest tried."""
    while True:
        t = _best(trials, what)
        ms = t.run(p, inputs, ref, None, FINAL_TARGET_MS)
        if ms is None:
            continue
        reason = check_winner(t.candidate.variant, p)
        if reason is None:
            return t, ms
        t.fail(f"disagreed: {reason}")


def measure(space: Space, search: Search, cache: TuneCache | None = None) -> dict:
    """Steps 4 and 5 on a search whose builds are done: time the survivors (early stop on losers;
    every output checked against the float64 reference: a candidate that fails it or faults is
    dropped, `Trial.run`), try the winner's variations, re-time the winner and pass it through
    `check_winner` (else the next fastest); store it in ``cache``. Returns the row `tune_problem`
    describes, without ``compile_s`` and with ``tune_s`` the seconds of enumeration and timing;
    ``status`` is "ok", or says that the rule's own pick (the prior) failed the check (then
    ``rule_ms`` is NaN): the registered variant computes this problem wrongly.

    Raises:
        RuntimeError: no survivor passed the check."""
    t0 = time.perf_counter()
    p = search.problem
    base = get(space.variant)
    inputs = _inputs(p)
    ref = Reference.of(p, inputs)
    what = f"{space.variant} on {p.name}"
    prior = next((c for c in search.survivors if c.prior), search.survivors[0])
    order = [prior, *(c for c in search.survivors if c is not prior)]  # the prior first: it wins ties
    trials = {c.config: Trial(c) for c in order}
    for t in trials.values():
        t.run(p, inputs, ref, QUICK_REPS)
    best = _best(trials, what).best_ms
    close = [t for t in trials.values() if t.ms and t.best_ms <= LOSER * best]
    for t in close:  # early stop: the clear losers get no more repetitions
        t.run(p, inputs, ref, CLOSE_REPS)
    build_of = {cfg: cfg for cfg in trials}
    leader = _best(trials, what)
    for cfg in space.variations(leader.candidate.config, p):  # runtime-only changes of the leader: no build
        if cfg not in trials:
            trials[cfg] = Trial(Candidate(cfg, space.variant_for(cfg, p), leader.candidate.model_us))
            trials[cfg].run(p, inputs, ref, CLOSE_REPS)
            build_of[cfg] = leader.candidate.config
    winner, final_ms = _final(trials, p, inputs, ref, what)
    rule = trials[prior.config]
    if winner is rule:
        rule_ms = final_ms
    else:
        rule_ms = rule.run(p, inputs, ref, None, FINAL_TARGET_MS) if rule.ms else None
    status = "ok" if rule_ms is not None else f"rule failed the check: {prior.config}: {rule.status}"[:300]
    row = {
        "problem": p.name,
        "variant": space.variant,
        "config": winner.candidate.config,
        "ms": final_ms,
        "search_ms": winner.best_ms,
        "rule_config": prior.config,
        "rule_ms": math.nan if rule_ms is None else rule_ms,
        "model_rank": search.rank[build_of[winner.candidate.config]],
        "candidates": len(search.candidates),
        "survivors": len(search.survivors),
        "timed": len(close),
        "disagreed": sum(t.status.startswith("disagreed") for t in trials.values()),
        "faulted": sum(t.status.startswith("error") for t in trials.values()),
        "cache": "miss",
        "tune_s": search.enumerate_s + time.perf_counter() - t0,
        "status": status,
    }
    if cache is not None:
        entry = {k: row[k] for k in CACHED} | {"tune_s": row["tune_s"], "date": time.strftime("%Y-%m-%d")}
        cache.store(base, p, entry, checked=True)
    return row


def sweep(space: Space, search: Search, reps: int = QUICK_REPS) -> dict:
    """The exhaustive answer, to judge the tuner by: every candidate and each of its variations
    timed (``reps`` repetitions; outputs checked as in `measure`), then the fastest re-timed and
    checked as the tuner's winner is. Returns ``best_config``, ``best_ms``, ``exhaustive_s`` and
    ``sweep`` ({config: (model_us, ms)}, NaN for a disagreeing or faulting one).

    Raises:
        RuntimeError: no configuration passed the check."""
    t0 = time.perf_counter()
    p = search.problem
    inputs = _inputs(p)
    ref = Reference.of(p, inputs)
    trials = {}
    for c in search.candidates:
        for cfg in [c.config, *space.variations(c.config, p)]:
            trials[cfg] = Trial(c if cfg == c.config else Candidate(cfg, space.variant_for(cfg, p), c.model_us))
            trials[cfg].run(p, inputs, ref, reps)
    times = {cfg: (t.candidate.model_us, t.best_ms if t.ms else math.nan) for cfg, t in trials.items()}
    best, best_ms = _final(trials, p, inputs, ref, f"{space.variant} on {p.name}")
    return {"best_config": best.candidate.config, "best_ms": best_ms, "exhaustive_s": time.perf_counter() - t0,
            "sweep": times}


CACHED = ("config", "ms", "rule_config", "rule_ms", "model_rank")  # what a cache entry answers with


def _hit_row(space: Space, p: Conv2dProblem, cache: TuneCache | None) -> dict | None:
    t0 = time.perf_counter()
    hit = cache.lookup(get(space.variant), p) if cache is not None else None
    if hit is None:
        return None
    return {"problem": p.name, "variant": space.variant, **{k: hit[k] for k in CACHED}, "cache": "hit",
            "compile_s": 0.0, "tune_s": time.perf_counter() - t0, "status": "ok"}


def tune_problem(space: Space, p: Conv2dProblem, cache: TuneCache | None = None, keep: int = KEEP,
                 exhaustive: bool = False) -> dict:
    """Tune ``space``'s variant on ``p`` (steps 1-5 of the module docstring) and return its row:

    ``problem``, ``variant``, ``config`` (the winner), ``ms`` (its final median), ``search_ms``
    (its best short median in the search), ``rule_config``, ``rule_ms`` (the prior's final
    median, timed as the winner's), ``model_rank`` (the place of the winner's
    build in the model's order, 1 = first), ``candidates`` / ``survivors`` / ``timed``
    (configurations enumerated, kept by the model, given more than the first repetitions),
    ``disagreed`` (outputs that failed the float64 check), ``compile_s``, ``tune_s`` (wall seconds
    of the whole search, builds included), ``cache`` ("hit" or "miss"), ``status`` (`measure`'s;
    "ok" on a hit). With ``exhaustive``, after the
    search (or the cache's answer) every candidate is built and `sweep` adds ``best_config``,
    ``best_ms``, ``exhaustive_s`` (builds included) and ``sweep`` (not a CSV column).

    A warm cache answers at once (``cache`` "hit", no timing; ``tune_s`` is the lookup's time).

    Raises:
        ValueError: no candidate of the space supports ``p`` on this GPU.
    """
    from .compile import build_many
    from .gpu import device_info

    hit = _hit_row(space, p, cache)
    if hit is not None and not exhaustive:
        return hit
    search = enumerate_search(space, p, keep)
    arch = get(space.variant).target(device_info().cc)
    row = hit
    if row is None:
        compile_s = build_many(search.jobs(), arch)
        row = measure(space, search, cache)
        row = {**row, "compile_s": compile_s, "tune_s": row["tune_s"] + compile_s}
    if exhaustive:
        build_s = build_many(search.jobs(exhaustive=True), arch)
        found = sweep(space, search)
        row = {**row, **found, "exhaustive_s": found["exhaustive_s"] + build_s}
    return row


def tune(variant: str | Variant, problems: list[Conv2dProblem], cache: TuneCache | None = None, keep: int = KEEP,
         exhaustive: bool = False, budget_s: float | None = None, progress: bool = True) -> pd.DataFrame:
    """Tune ``variant`` on every problem (each in the variant's own dtype, layout and operation,
    `Variant.adapt`): one row per problem as `tune_problem` gives it, plus ``status``.

    The searches are enumerated first and every build they need is compiled in one parallel
    `helpers.compile.build_many`; each problem's ``compile_s`` is its share of that wall time (the
    builds it was first to need), so ``tune_s`` sums to the run's wall time. A problem that faults
    gets a row with its ``status`` and the run goes on; once ``budget_s`` seconds have passed the
    remaining problems are not timed (``status`` "over budget"). With ``exhaustive``, after all of
    that, every candidate of every problem is built and swept (`sweep`; the cache's answers too).
    """
    from tqdm.auto import tqdm

    from .compile import build_many
    from .gpu import device_info

    space = space_of(variant)
    base = get(space.variant)
    arch = base.target(device_info().cc)
    t0 = time.perf_counter()
    rows: dict[int, dict] = {}
    searches: dict[int, Search] = {}
    problems = [base.adapt(p, op=True) for p in problems]  # an fprop suite's shapes as this variant's op
    for i, p in enumerate(problems):
        try:
            hit = _hit_row(space, p, cache)
            if hit is not None:
                rows[i] = hit
            if hit is None or exhaustive:
                searches[i] = enumerate_search(space, p, keep)
        except Exception as e:  # noqa: BLE001 - one problem's fault is its row; the run goes on
            rows[i] = _fault_row(space, p, e)
    jobs, first = _new_jobs({i: s for i, s in searches.items() if i not in rows}, arch)
    compile_s = build_many(jobs, arch) if jobs else 0.0
    for i, s in tqdm(searches.items(), disable=not progress, desc=f"tune {space.variant}"):
        if i in rows:
            continue
        share = compile_s * first.get(i, 0) / max(len(jobs), 1)
        if budget_s is not None and time.perf_counter() - t0 > budget_s:
            rows[i] = {"problem": s.problem.name, "variant": space.variant, "status": "over budget"}
            continue
        try:
            row = measure(space, s, cache)
            rows[i] = {**row, "compile_s": share, "tune_s": row["tune_s"] + share}
        except Exception as e:  # noqa: BLE001
            rows[i] = _fault_row(space, s.problem, e)
    if exhaustive:  # after the tuner has answered every problem: its times are its own
        todo = {i: s for i, s in searches.items() if rows[i]["status"] == "ok"}
        jobs, first = _new_jobs(todo, arch, exhaustive=True)
        build_s = build_many(jobs, arch) if jobs else 0.0
        for i, s in tqdm(todo.items(), disable=not progress, desc=f"sweep {space.variant}"):
            try:
                found = sweep(space, s)
                share = build_s * first.get(i, 0) / max(len(jobs), 1)
                rows[i].update(found, exhaustive_s=found["exhaustive_s"] + share)
            except Exception as e:  # noqa: BLE001
                rows[i]["status"] = f"sweep {_fault_row(space, s.problem, e)['status']}"
    return pd.DataFrame([rows[i] for i in sorted(rows)])


def _new_jobs(searches: dict, arch: str, exhaustive: bool = False) -> tuple[list, dict]:
    """The distinct builds of ``searches`` ({index: Search}) not yet built, and per index how many
    of them it was the first to need (its share of the parallel build's wall time)."""
    from .compile import is_built

    seen, jobs, first = set(), [], {}
    for i, s in searches.items():
        for cu_file, defines in s.jobs(exhaustive):
            key = (cu_file, tuple(sorted(defines.items())))
            if key not in seen and not is_built(cu_file, defines, arch):
                seen.add(key)
                jobs.append((cu_file, defines))
                first[i] = first.get(i, 0) + 1
    return jobs, first


def _fault_row(space: Space, p: Conv2dProblem, e: Exception) -> dict:
    if isinstance(e, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()
    return {
        "problem": p.name,
        "variant": space.variant,
        "status": f"error: {type(e).__name__}: {' '.join(str(e).split())[:300]}",
    }


def tuned(variant: str | Variant, cache: TuneCache | None = None) -> Variant:
    """A variant (``<name>_tuned``, not registered) that runs, per problem, the configuration
    ``cache`` holds for ``variant`` (looked up when the problem is planned), and the registered
    variant's own rule where it holds none.

    A cached choice is trusted once it has passed `helpers.check.check` on the problem, run when
    `helpers.variants.prepare` first checks this variant's tensors for the (problem, choice) with a
    GPU present (after the tensor checks: the shape-level `supports` launches nothing). A choice
    that fails the check, that the space cannot build (an unknown configuration name) or that the
    variant refuses runs the rule instead, with one `TuneCacheWarning` naming the cache file; a
    check that raises (e.g. out of memory) is not remembered: the rule runs for that call and the
    next call checks again. A choice this process's tuner stored is not checked again
    (`TuneCache.checked`: `measure` passed it through `check_winner` before storing it)."""
    space = space_of(variant)
    base = get(space.variant)
    cache = cache or TuneCache()
    verdicts: dict = {}  # (problem, configuration) -> the variant that runs it, once decided

    def pick(p: Conv2dProblem, verify: bool = False) -> Variant:
        """The variant that runs ``p``; with ``verify`` (`prepare`'s tensor checks, a GPU present)
        a cached choice not yet decided is checked first."""
        hit = cache.lookup(base, p)
        if not hit:
            return base
        key, config = (p, hit["config"]), hit["config"]
        if key in verdicts:
            return verdicts[key]
        v, reason = _cached_variant(space, p, config)
        if reason is not None:
            verdicts[key] = _refuse(base, p, config, reason, cache.path)
        elif cache.checked(base, p, config):  # this process's own tuner checked it before caching it
            verdicts[key] = v
        elif verify and gpu.has_gpu():
            from .check import check

            try:
                r = check(v, p)
            except Exception as e:  # noqa: BLE001 - not the choice's verdict: the rule runs, the next call retries
                _warn(f"tune cache {cache.path}: checking the choice {config!r} of {base.name} for {p.name} "
                      f"raised {type(e).__name__}: {e}; the rule's runs for this call")
                return base
            verdicts[key] = v if r.ok else _refuse(base, p, config, f"failed the check ({r.reason})", cache.path)
        else:
            return v  # not checked yet: `prepare`'s tensor checks do, once, with a GPU
        return verdicts[key]

    def tensor_check(p: Conv2dProblem, tensors: dict, ep) -> str | None:
        v = pick(p, verify=True)
        return v.tensor_check_fn(p, tensors, ep) if v.tensor_check_fn else None

    return dataclasses.replace(
        base,
        name=f"{base.name}_tuned",
        summary=f"{base.summary} (tuned per problem: {cache.path})",
        supports_fn=lambda p: pick(p).supports_fn(p),
        launches_fn=lambda p, ep: pick(p).launches_fn(p, ep),
        covers_fn=lambda p, launch: pick(p).covers_fn(p, launch),
        workspace_fn=lambda p: pick(p).workspace_bytes(p),
        tensor_check_fn=tensor_check,
    )


def _cached_variant(space: Space, p: Conv2dProblem, config: str) -> tuple[Variant | None, str | None]:
    """(the variant of a cached ``config``, None), or (None, why it cannot run ``p``: the space
    cannot build the name, or the variant refuses the problem's shape)."""
    try:
        v = space.variant_for(config, p)
        reason = v.supports(p, smem_limit=2**31)
    except Exception as e:  # noqa: BLE001 - a cache entry must never break a run: the rule runs instead
        return None, f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    return (v, None) if reason is None else (None, reason)


def _refuse(base: Variant, p: Conv2dProblem, config: str, reason: str, path: Path) -> Variant:
    """``base`` (the rule), after one warning that names the cache file and why ``config`` is not used."""
    _warn(f"tune cache {path}: the choice {config!r} of {base.name} for {p.name} is not used ({reason}); "
          "the rule's runs instead")
    return base
