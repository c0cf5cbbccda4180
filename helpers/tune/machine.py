"""The tuner's cost model (day 15): a `Machine`'s rates and limits, and the predicted time of one
implicit-GEMM tile configuration (`gemm_tile_us`): waves of resident blocks over the SMs
(occupancy from shared memory, registers, threads and blocks), the tensor-core time of the padded
tile work at a rate that grows with the warp tile, the DRAM and L2 traffic, and a per-block
pipeline fill.

No GPU's number lives here: a `Machine` holds the rates measured on the GPU present and the limits
its driver reports (`helpers.tune.probe.machine_for`: measured once, cached), or those of a
committed ``benchmarks/results/<gpu>/machine.json`` (`helpers.tune.probe.committed`). What this
module does hold are the model's own coefficients, `FITTED`: `COVER_WARPS` fitted on ResNet-50's
H200 sweep, the other three set by hand with the model and judged on the same sweeps (day 15,
sections 3 and 4). They are parameters of the model's form, not rates of a GPU: the probe does not
measure them. ``tests/test_machine_probe.py`` reads this file's numeric literals and fails on any
other number that is not an arithmetic or unit constant.

Sources: NVIDIA's CUDA C++ Best Practices Guide ("Occupancy", "Calculating occupancy").
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Machine:
    """The rates and limits the cost model reads, all of one GPU; no field has a default.

    Limits, from the driver (`helpers.gpu.DeviceInfo`): ``sms`` (multiprocessors), ``smem_per_sm``
    and ``smem_reserved_per_block`` (bytes of shared memory per SM, and the driver's reservation per
    resident block), ``regs_per_sm`` (32-bit registers), ``threads_per_sm`` and ``blocks_per_sm``
    (resident at once), ``l2_bytes``.

    Rates, measured (`helpers.tune.probe.measure`): ``mma_tflops`` (dense fp16
    ``mma.sync.m16n8k16`` with fp32 accumulation, all SMs, TFLOP/s), ``fma_tflops`` (fp32 FMA,
    TFLOP/s), ``dram_gbps`` and ``l2_gbps`` (GB/s of a device-to-device copy, bytes read plus
    written, of a buffer far larger than L2 and of one that fits in it), ``launch_us`` (a launch's
    fixed cost on the GPU, µs: an empty kernel over a full wave, ramp-up and tail).
    """

    sms: int
    smem_per_sm: int
    smem_reserved_per_block: int
    regs_per_sm: int
    threads_per_sm: int
    blocks_per_sm: int
    l2_bytes: int
    mma_tflops: float
    fma_tflops: float
    dram_gbps: float
    l2_gbps: float
    launch_us: float

    def __post_init__(self):
        """Raises ValueError: a field that is not a finite number of its kind (an int for a limit),
        or a limit or rate that is not positive (the reservation may be 0)."""
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            kind = int if f.type == "int" else (int, float)
            if isinstance(v, bool) or not isinstance(v, kind) or not math.isfinite(v):
                want = "an int" if kind is int else "a finite number"
                raise ValueError(f"Machine.{f.name} must be {want}; got {v!r}")
            if v < 0 or (v == 0 and f.name != "smem_reserved_per_block"):
                raise ValueError(f"Machine.{f.name} must be positive; got {v!r}")

    def as_dict(self) -> dict:
        """{field: value}, in field order (what ``machine.json`` stores under ``"machine"``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Machine:
        """The machine of `as_dict`'s output.

        Raises:
            ValueError: ``d`` is not a dict, misses a field or has one that `Machine` does not know
                (each named), or a value that `__post_init__` refuses.
        """
        if not isinstance(d, dict):
            raise ValueError(f"a machine is a JSON object of {', '.join(FIELDS)}; got {type(d).__name__}")
        missing = [f for f in FIELDS if f not in d]
        extra = sorted(set(d) - set(FIELDS))
        if missing or extra:
            raise ValueError(f"a machine needs exactly the fields {', '.join(FIELDS)}; missing {missing or 'none'}, "
                             f"unknown {extra or 'none'}")
        return cls(**{f: d[f] for f in FIELDS})


FIELDS = tuple(f.name for f in dataclasses.fields(Machine))


@dataclass(frozen=True)
class GemmTile:
    """What the model needs of one candidate: the GEMM (``m``, ``n``, ``k``), its tile (``bm``,
    ``bn``, ``bk``, ``warp_m`` x ``warp_n`` per warp, ``threads``, ``stages``), the bytes of shared
    memory and the registers per thread it is expected to use, the GEMM-K steps per block
    (``steps``, default ceil(k / bk)), the blocks per output tile (``splits``, split-K), the bytes
    that must cross DRAM, how many such GEMMs one launch runs (``batch``: day 20's n² transform
    positions) and the operands' element size."""

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
    batch: int = 1  # independent GEMMs of this size in the launch (grid z): blocks and L2 traffic times it
    element_bytes: int = 2  # bytes per operand element (2: fp16/bf16, 4: fp32)
    cuda_cores: bool = False  # an FMA GEMM on CUDA cores (the machine's fma_tflops) instead of tensor cores


def occupancy(t: GemmTile, mc: Machine) -> int:
    """Resident blocks per SM: the least of what shared memory (plus the driver's reservation per
    block), registers (allocated per warp of 32 threads in units of 256, sm_75 to sm_120), threads
    and the block limit allow; at least 1."""
    by_smem = mc.smem_per_sm // (t.shared_bytes + mc.smem_reserved_per_block)
    regs_per_warp = math.ceil(t.regs * 32 / 256) * 256
    by_regs = mc.regs_per_sm // (regs_per_warp * (t.threads // 32))
    by_threads = mc.threads_per_sm // t.threads
    return max(1, min(by_smem, by_regs, by_threads, mc.blocks_per_sm))


def gemm_tile_us(t: GemmTile, mc: Machine) -> float:
    """Predicted microseconds of one implicit-GEMM launch: three times, combined as their 4-norm
    (close to the largest, but the others still break ties), plus the launch cost.

    * **tensor cores**: each SM runs its share of blocks in rounds of `occupancy`. A GEMM-K step
      of the b resident blocks takes the longer of b · (a step's FLOPs) / (the SM's mma rate, or
      its FMA rate for a GEMM on CUDA cores, x the warp tile's efficiency x the latency cover) and
      the load latency spread over the steps in flight, `LOAD_LATENCY_US` / (b · (stages − 1)).
      The efficiency wm·wn / (wm·wn + 8·(wm + wn)) charges the ldmatrix traffic per mma (small
      warp tiles reload more per FLOP); the cover min(1, resident warps / `COVER_WARPS`) is how
      much of the mma pipe a few warps keep busy. Each round also pays one latency to fill the
      pipeline and `EPILOGUE_US`;
    * **DRAM**: ``dram_bytes`` (the tensors once) plus ``extra_bytes``;
    * **L2**: the GEMM's A read once per column of tiles and B once per row of tiles (cp.async.cg
      bypasses L1, so every tap's read of x reaches L2).
    A ``batch`` of GEMMs multiplies the blocks and the L2 bytes (each GEMM its own operands).
    """
    steps = t.steps if t.steps is not None else math.ceil(t.k / t.bk)
    m_tiles, n_tiles = math.ceil(t.m / t.bm), math.ceil(t.n / t.bn)
    blocks = m_tiles * n_tiles * t.splits * t.batch
    occ = occupancy(t, mc)
    per_sm = math.ceil(blocks / mc.sms)
    rounds = math.ceil(per_sm / occ)
    resident = min(occ, per_sm)
    sm_flops_per_us = (mc.fma_tflops if t.cuda_cores else mc.mma_tflops) * 1e6 / mc.sms
    wm, wn = t.warp_m, t.warp_n
    shape_eff = wm * wn / (wm * wn + WARP_TILE_COST * (wm + wn))
    cover = min(1.0, resident * (t.threads // 32) / COVER_WARPS)
    step_us = max(resident * 2 * t.bm * t.bn * t.bk / (sm_flops_per_us * shape_eff * cover),
                  LOAD_LATENCY_US / (resident * max(t.stages - 1, 1)))
    tensor_us = rounds * (steps * step_us + LOAD_LATENCY_US + EPILOGUE_US)
    e = t.element_bytes * t.batch
    a_bytes, b_bytes, c_bytes = e * t.m * t.k, e * t.n * t.k, e * t.m * t.n
    dram = t.dram_bytes if t.dram_bytes is not None else a_bytes + b_bytes + c_bytes
    dram_us = (dram + t.extra_bytes) / (mc.dram_gbps * 1e3)
    l2_us = (a_bytes * n_tiles + b_bytes * m_tiles) / (mc.l2_gbps * 1e3)
    return (tensor_us**4 + dram_us**4 + l2_us**4) ** 0.25 + mc.launch_us


# The model's coefficients (the module docstring): fitted or set by hand on the H200's committed sweeps, kept as
# they were when the machine's rates became measured; `FITTED` names them for the no-constants test.
LOAD_LATENCY_US = 0.8  # set by hand: a global load's latency under load (L2 or DRAM), µs
WARP_TILE_COST = 8  # set by hand: the ldmatrix cost per warp-tile edge, in units of mma work (see gemm_tile_us)
COVER_WARPS = 4  # fitted: resident warps per SM that keep the mma pipe busy; on ResNet-50's sweep (pruning replayed:
#                 0.985 of the exhaustive best with 8, 0.991 with 4), out of sample 0.984 and 0.985 (day 15, section 4)
EPILOGUE_US = 0.5  # set by hand: a block's epilogue, the output tile through shared memory to global, µs
FITTED = ("LOAD_LATENCY_US", "WARP_TILE_COST", "COVER_WARPS", "EPILOGUE_US")
