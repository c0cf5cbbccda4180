"""The tuner's machine measured on the GPU present (issue 46): `measure` runs a short probe, a
second or two, and `machine_for` answers with its result from a cache, so a GPU is probed once per
environment; `committed` loads the ``benchmarks/results/<gpu>/machine.json`` a probe wrote
(``python -m benchmarks.machine``), for the model without that GPU (the CPU tests, day 15's figures).

What the probe measures (`measure`), each timed with CUDA events after a warm-up, as a median of
repetitions (`helpers.timing.time_gpu`):

* ``dram_gbps``: ``torch`` copies a buffer of ``DRAM_L2_MULTIPLE`` x the L2 size (at least
  `DRAM_MIN_BYTES`) into another, from a flushed L2; bytes read plus written over the median time;
* ``l2_gbps``: the same with a buffer of 1/``L2_FRACTION`` of the L2, copied `L2_REPEAT` times in one
  timed window without a flush (it stays in L2). Each copy is one kernel: the gaps between them are
  in the window, so this is a lower bound of the L2's bandwidth;
* ``mma_tflops``: ``probe_mma_f32acc`` of ``kernels/conv2d/15_machine_probe.cu`` (independent
  ``mma.sync.m16n8k16`` f16 x f16 + f32 chains, the instruction of days 11-14), one full wave of
  `BLOCKS_PER_SM` blocks of `PROBE_THREADS` threads per SM; FLOP over the median time;
* ``fma_tflops``: ``probe_ffma`` of the same file (independent fp32 FMA chains), the same grid;
* ``launch_us``: ``probe_ffma`` with no iteration, the same grid: a launch's fixed cost on the GPU.

The limits (SMs, shared memory per SM and its reservation per block, registers, resident threads
and blocks per SM, L2 bytes) are the driver's (`helpers.gpu.DeviceInfo`, `limits_of`).

The cache (`default_machine_cache_path`, ``$CONV2D_DAYS_MACHINE_CACHE``) is a JSON file of
{key: record}; the key (`machine_key`) is the tuner cache's environment (GPU, driver, CUDA, nvcc:
`helpers.tune.cache.environment`) plus torch's version and the hash of the probe's kernel source,
so a new driver, toolkit, torch or probe measures again. A record (`record`, `load`) is what a
``machine.json`` holds: ``schema``, ``gpu``, ``environment``, ``date``, ``source`` and ``machine``
(`Machine.as_dict`).

Sources: the practice of the series' own probes (day 11's mma.sync ceiling, day 01's copy
bandwidth); CUDA C++ Best Practices Guide, "Effective Bandwidth Calculation" (bytes read plus written
over time).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import warnings
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock

from .. import gpu
from ..compile import load_kernel, source_hash
from ..timing import time_gpu
from .cache import environment, replace_json
from .machine import Machine

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"  # committed records: RESULTS/<gpu slug>/machine.json
MACHINE_JSON = "machine.json"
MACHINE_CACHE_ENV = "CONV2D_DAYS_MACHINE_CACHE"  # overrides `default_machine_cache_path`
SCHEMA = 1  # a record's layout (`record`); `load` refuses another

PROBE_FILE = "15_machine_probe.cu"
PROBE_THREADS = 256  # the kernel's PROBE_THREADS: 8 warps per block
BLOCKS_PER_SM = 4  # the kernel's PROBE_BLOCKS_PER_SM (its __launch_bounds__): one full wave of 32 warps per SM
MMA_CHAINS, FMA_CHAINS, FMA_UNROLL = 8, 8, 4  # the kernel's defaults
MMA_FLOP = 2 * 16 * 8 * 16  # one mma.sync.m16n8k16, per warp
MMA_ITERS = 4096  # about 1 ms at 600 TFLOP/s on 132 SMs, 2 ms at 40 TFLOP/s on 20 SMs
FMA_ITERS = 16384  # a multiple of FMA_UNROLL; about 0.3-0.6 ms from a laptop GPU to an H100
DRAM_L2_MULTIPLE = 8  # the DRAM copy's buffer: this many times the L2 ...
DRAM_MIN_BYTES = 256 * 2**20  # ... and at least this many bytes
L2_FRACTION = 4  # the L2 copy's buffer: this fraction of the L2
L2_REPEAT = 20  # copies of it per timed window
TARGET_MS = 100.0  # GPU time per measurement (`helpers.timing.time_gpu`'s target)


class MachineCacheWarning(UserWarning):
    """A machine cache file, or an entry of it, that cannot be used: the GPU is measured again."""


def default_machine_cache_path() -> Path:
    """``$CONV2D_DAYS_MACHINE_CACHE`` if set, else ``~/.cache/conv2d-days/machine.json``."""
    env = os.environ.get(MACHINE_CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "conv2d-days" / MACHINE_JSON


def probe_environment() -> dict:
    """The tuner cache's environment (`helpers.tune.cache.environment`: GPU, driver, CUDA, nvcc)
    plus ``torch`` (its version: the copies are torch's) and ``probe`` (the first 16 hex digits of
    `helpers.compile.source_hash` of the probe's kernel file)."""
    return {**environment(), "torch": torch.__version__, "probe": source_hash(PROBE_FILE)[:16]}


def machine_key(env: dict | None = None) -> str:
    """``gpu|driver|cuda|nvcc|torch|probe`` of ``env`` (default `probe_environment`)."""
    env = env if env is not None else probe_environment()
    return "|".join(env[k] for k in ("gpu", "driver", "cuda", "nvcc", "torch", "probe"))


# ---- the probe -----------------------------------------------------------------------------------------------


def limits_of(info) -> dict:
    """The `Machine` limits of a `helpers.gpu.DeviceInfo`: ``sms``, ``smem_per_sm``,
    ``smem_reserved_per_block``, ``regs_per_sm``, ``threads_per_sm``, ``blocks_per_sm``, ``l2_bytes``.

    Raises:
        ValueError: the driver reported none for one of them (named).
    """
    limits = {"sms": info.sms, "smem_per_sm": info.smem_per_sm, "smem_reserved_per_block": info.smem_reserved_per_block,
              "regs_per_sm": info.regs_per_sm, "threads_per_sm": info.threads_per_sm,
              "blocks_per_sm": info.blocks_per_sm, "l2_bytes": info.l2_bytes}
    missing = [k for k, v in limits.items() if v is None]
    if missing:
        raise ValueError(f"the driver reported no {', '.join(missing)} for {info.name}: the model cannot be built "
                         "(helpers.gpu.device_info reads them as device attributes)")
    return limits


def copy_gbps(nbytes: int, l2_resident: bool) -> float:
    """GB/s of ``torch`` copying one ``nbytes`` buffer into another on the GPU: bytes read plus
    written over the median time. ``l2_resident``: `L2_REPEAT` copies per timed window, no flush
    (the buffers stay in L2); else one copy per window from a flushed L2."""
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    repeat = L2_REPEAT if l2_resident else 1

    def copy():
        for _ in range(repeat):
            dst.copy_(src)

    ms = time_gpu(copy, warmup=3, target_ms=TARGET_MS, flush=not l2_resident).ms_p50
    return 2 * nbytes * repeat / (ms * 1e-3) / 1e9


def kernel_ms(entry: str, iters: int, sms: int) -> float:
    """Median milliseconds of one launch of the probe's ``entry`` (built for this GPU by
    `helpers.compile.load_kernel`) with ``iters`` iterations over one full wave of a GPU of ``sms``
    SMs (`BLOCKS_PER_SM` blocks of `PROBE_THREADS` per SM), L2 not flushed (no data is read).

    Raises:
        RuntimeError: the launch wrote a non-finite sum (a kernel that did not run its loop)."""
    fn = load_kernel(PROBE_FILE, entry).function
    blocks = BLOCKS_PER_SM * sms
    out = torch.empty(blocks * PROBE_THREADS, dtype=torch.float32, device="cuda")

    def launch():
        fn(np.uintp(out.data_ptr()), np.int32(iters), grid=(blocks, 1, 1), block=(PROBE_THREADS, 1, 1))

    ms = time_gpu(launch, warmup=3, target_ms=TARGET_MS, flush=False).ms_p50
    if not bool(torch.isfinite(out).all()):
        raise RuntimeError(f"{PROBE_FILE}:{entry} wrote non-finite sums with iters={iters}")
    return ms


def measure(info=None) -> Machine:
    """Measure the GPU's machine now (the module docstring says how; about a second or two) and
    return it: the rates measured here, the limits from ``info`` (default
    `helpers.gpu.device_info`). Caches nothing: `machine_for` does.

    Raises:
        NoGPUError: no GPU (`helpers.gpu.init`).
        ValueError: a GPU below compute capability 8.0 (the probe's mma.sync needs sm_80, as the
            tuner's kernels do), or a limit the driver does not report (`limits_of`).
        RuntimeError: a probe kernel wrote non-finite sums.
    """
    info = info if info is not None else gpu.device_info()  # device_info initialises the shared context
    if tuple(info.cc) < (8, 0):
        raise ValueError(f"the machine probe needs compute capability 8.0 or newer (mma.sync.m16n8k16 with fp16, "
                         f"as the tuner's kernels); {info.name} is {info.cc[0]}.{info.cc[1]}")
    limits = limits_of(info)
    gpu.init()
    l2, sms = limits["l2_bytes"], limits["sms"]
    dram_bytes = min(max(DRAM_L2_MULTIPLE * l2, DRAM_MIN_BYTES), info.total_mem_bytes // 8) // 256 * 256
    threads = BLOCKS_PER_SM * sms * PROBE_THREADS
    rates = {
        "mma_tflops": _tflops(kernel_ms("probe_mma_f32acc", MMA_ITERS, sms),
                              threads // 32 * MMA_ITERS * MMA_CHAINS * MMA_FLOP),
        "fma_tflops": _tflops(kernel_ms("probe_ffma", FMA_ITERS, sms), threads * FMA_ITERS * FMA_CHAINS * 2),
        "dram_gbps": copy_gbps(dram_bytes, l2_resident=False),
        "l2_gbps": copy_gbps(l2 // L2_FRACTION // 256 * 256, l2_resident=True),
        "launch_us": kernel_ms("probe_ffma", 0, sms) * 1e3,
    }
    return Machine(**limits, **rates)


def _tflops(ms: float, flop: int) -> float:
    return flop / (ms * 1e-3) / 1e12


# ---- records and the cache -----------------------------------------------------------------------------------


def record(m: Machine, env: dict | None = None, source: str | None = None, date: str | None = None) -> dict:
    """What a ``machine.json`` holds (and the cache per key): ``schema`` (`SCHEMA`), ``gpu`` (the
    GPU's name), ``environment`` (``env``, default `probe_environment`), ``date`` (ISO, default
    today), ``source`` (how the values were found; default: this probe) and ``machine``
    (`Machine.as_dict`)."""
    env = env if env is not None else probe_environment()
    return {"schema": SCHEMA, "gpu": env["gpu"], "environment": env,
            "date": date or dt.date.today().isoformat(),
            "source": source or "measured by helpers.tune.probe.measure (python -m benchmarks.machine)",
            "machine": m.as_dict()}


def from_record(rec, where: str = "a machine record") -> Machine:
    """The `Machine` of a `record`.

    Raises:
        ValueError: not a record of schema `SCHEMA` with a valid ``machine`` (``where`` names it).
    """
    if not isinstance(rec, dict) or rec.get("schema") != SCHEMA or "machine" not in rec:
        got = rec.get("schema") if isinstance(rec, dict) else type(rec).__name__
        raise ValueError(f"{where} is not a machine record of schema {SCHEMA} with a 'machine' object (got {got!r})")
    try:
        return Machine.from_dict(rec["machine"])
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def load(path: str | Path) -> Machine:
    """The `Machine` of a ``machine.json`` file (a `record`).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, or not a valid record (`from_record`); the message names the file.
    """
    path = Path(path)
    try:
        rec = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    return from_record(rec, str(path))


def committed_path(slug: str) -> Path:
    """``benchmarks/results/<slug>/machine.json`` (``slug``: `helpers.gpu.gpu_slug` of a GPU's name)."""
    return RESULTS / slug / MACHINE_JSON


def committed(slug: str) -> Machine:
    """The machine of a committed ``benchmarks/results/<slug>/machine.json`` (read once per
    version of the file).

    Raises:
        FileNotFoundError: none committed for ``slug``; the message says how to write one.
        ValueError: the file is not a valid record (`load`).
    """
    path = committed_path(slug)
    if not path.is_file():
        raise FileNotFoundError(f"no committed machine for {slug!r} ({path}): on that GPU, "
                                "`python -m benchmarks.machine` measures it and writes the file")
    st = path.stat()
    return _load_once(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=16)
def _load_once(path: str, mtime_ns: int, size: int) -> Machine:
    return load(path)


def _read_cache(path: Path) -> dict:
    """{key: Machine} of the cache file's valid records ({} without a file); one
    `MachineCacheWarning` for a file or records that cannot be used."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        _warn(f"machine cache {path} is unreadable ({type(e).__name__}: {e}): the GPU is measured again")
        return {}
    if not isinstance(data, dict):
        _warn(f"machine cache {path} holds a JSON {type(data).__name__}, not an object of records: "
              "the GPU is measured again")
        return {}
    good, bad = {}, 0
    for key, rec in data.items():
        try:
            good[key] = from_record(rec)
        except ValueError:
            bad += 1
    if bad:
        _warn(f"machine cache {path}: {bad} malformed records left out (their GPUs are measured again)")
    return good


def _warn(message: str) -> None:
    warnings.warn(message, MachineCacheWarning, stacklevel=3)


def store(m: Machine, path: str | Path | None = None, env: dict | None = None) -> str:
    """Add ``m``'s `record` under its `machine_key` to the cache file (default
    `default_machine_cache_path`), merged under a lock with what is there (malformed records
    dropped) and written atomically (`helpers.tune.cache.replace_json`). Returns the key."""
    path = Path(path) if path is not None else default_machine_cache_path()
    env = env if env is not None else probe_environment()
    key = machine_key(env)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        try:
            on_disk = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            on_disk = {}
        kept = {k: r for k, r in on_disk.items() if _valid(r)} if isinstance(on_disk, dict) else {}
        replace_json(path, {**kept, key: record(m, env)})
    _memo[(str(path), key)] = m
    return key


def _valid(rec) -> bool:
    try:
        from_record(rec)
    except ValueError:
        return False
    return True


_memo: dict = {}  # (cache file, machine_key) -> Machine: this process's answers


def machine_for(info=None, path: str | Path | None = None) -> Machine:
    """The measured machine of the GPU present: this process's earlier answer, else the cache
    file's record for this environment (`machine_key`; file default `default_machine_cache_path`),
    else `measure` now (``info``: `helpers.gpu.device_info` by default), stored in the cache. A
    second call costs a dictionary lookup and the key (a ``stat`` of the probe's files).

    Raises:
        what `measure` raises, when it has to measure.
    """
    path = Path(path) if path is not None else default_machine_cache_path()
    env = probe_environment()
    key = machine_key(env)
    hit = _memo.get((str(path), key))
    if hit is not None:
        return hit
    m = _read_cache(path).get(key)
    if m is None:
        m = measure(info)
        store(m, path, env)
    _memo[(str(path), key)] = m
    return m


def describe(m: Machine) -> list[tuple[str, str, str]]:
    """(field, value with its unit, where it comes from) for each field of ``m``: the lines
    ``python -m benchmarks.machine`` prints."""
    units = {"sms": "", "smem_per_sm": " B", "smem_reserved_per_block": " B", "regs_per_sm": "", "threads_per_sm": "",
             "blocks_per_sm": "", "l2_bytes": " B", "mma_tflops": " TFLOP/s", "fma_tflops": " TFLOP/s",
             "dram_gbps": " GB/s", "l2_gbps": " GB/s", "launch_us": " us"}
    how = {"mma_tflops": f"probe_mma_f32acc, {BLOCKS_PER_SM} blocks x {PROBE_THREADS} threads per SM",
           "fma_tflops": f"probe_ffma, {BLOCKS_PER_SM} blocks x {PROBE_THREADS} threads per SM",
           "dram_gbps": f"torch copy of max({DRAM_L2_MULTIPLE} x L2, {DRAM_MIN_BYTES >> 20} MiB), flushed L2",
           "l2_gbps": f"torch copy of L2/{L2_FRACTION}, {L2_REPEAT} per window (a lower bound)",
           "launch_us": "probe_ffma with no iteration, one full wave"}
    out = []
    for k, v in m.as_dict().items():
        text = f"{v:,.2f}" if k in how else f"{v:,}"
        out.append((k, text + units[k], how.get(k, "driver attribute (helpers.gpu.device_info)")))
    return out
