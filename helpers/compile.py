"""Compile kernels from ``kernels/conv2d`` with ``-D`` defines; report their resource use.

Two paths share one option list so they build the same code:

* `load_kernel` builds with pycuda's compiler (``pycuda.compiler.compile``, SourceModule's nvcc
  call and disk cache) for the current device (needs a GPU), for
  the device's own architecture or the target a variant names (``sm_90a`` for Hopper-only
  instructions: `helpers.variants.Variant.target`), and returns the function with its
  registers, static shared memory and local memory. Modules are cached in-process by (file,
  `source_hash`, defines, arch): an edit to the file or to anything it includes (a header, or an
  earlier day's ``.cu``) rebuilds; pycuda caches the cubin on disk keyed on the preprocessed
  source.
* `nvcc_compile` runs plain ``nvcc -cubin -Xptxas -v`` for any architecture (no GPU needed; CI
  uses it for sm_75..sm_120) and `parse_ptxas` turns its report into numbers.

Kernels are written with explicit ``extern "C" __global__`` and loaded with ``no_extern_c=True``,
so C++ headers (``cuda_fp16.h``, ``mma.h``) work and the entry names are unmangled.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import gpu

KERNEL_DIR = Path(__file__).resolve().parents[1] / "kernels" / "conv2d"
NVCC_OPTIONS = ["-lineinfo", "-std=c++17"]
ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_120")


def kernel_path(cu_file: str) -> Path:
    """Absolute path of a kernel file named relative to ``kernels/conv2d``.

    Raises:
        FileNotFoundError: no such file.
    """
    p = KERNEL_DIR / cu_file
    if not p.is_file():
        raise FileNotFoundError(f"no kernel file {p}")
    return p


def define_flags(defines: dict | None) -> list[str]:
    """``{"TILE": 16, "ACCUM": "double"}`` -> ``["-DACCUM=double", "-DTILE=16"]`` (sorted)."""
    return [f"-D{k}={v}" for k, v in sorted((defines or {}).items())]


@dataclass(frozen=True)
class CompiledKernel:
    """A loaded kernel and what ptxas gave it.

    Attributes:
        function: the ``pycuda.driver.Function``.
        num_regs: registers per thread.
        shared_static_bytes: statically declared ``__shared__`` bytes per block.
        local_bytes: local memory per thread (stack and spills; 0 is what we want).
        max_threads_per_block: the most threads a block of this kernel may have.
        param_offsets: where the driver expects each parameter in the argument buffer, in bytes
            (`param_offsets`), when `load_kernel` was asked for them (``params``); else None.
    """

    function: object
    num_regs: int
    shared_static_bytes: int
    local_bytes: int
    max_threads_per_block: int
    param_offsets: tuple | None = None


_modules: dict = {}  # (file, source_hash, defines, arch) -> pycuda Module
_cubins: dict = {}  # the same key -> the cubin it was loaded from (for `param_offsets`)
_offsets: dict = {}  # (key, entry, count) -> the driver's parameter offsets, asked once


def load_kernel(
    cu_file: str,
    entry: str,
    defines: dict | None = None,
    dynamic_smem: int = 0,
    arch: str | None = None,
    params: int = 0,
) -> CompiledKernel:
    """Build ``kernels/conv2d/<cu_file>`` for the current GPU and return ``entry`` from it.

    Args:
        cu_file: file name relative to ``kernels/conv2d``.
        entry: the ``extern "C" __global__`` function's name.
        defines: compile-time parameters passed as ``-D`` flags.
        arch: the ``-arch`` target (e.g. ``"sm_90a"``); default the device's own (``sm_XY``).
        dynamic_smem: dynamic shared bytes the caller will launch with; where they, or they and the
            static bytes together, pass 48 KB, the kernel is opted in with
            ``MAX_DYNAMIC_SHARED_SIZE_BYTES`` (static + dynamic must fit the device's opt-in limit).
        params: the number of parameters to ask the driver the offsets of (``param_offsets``; 0:
            none): kernels that take a tensor map need them (`helpers.tma.kernel_args`).

    Raises:
        NoGPUError: no GPU or no pycuda.
        pycuda.driver.CompileError: nvcc failed (its log is in the message).
        ValueError: ``dynamic_smem`` over what the device allows.
    """
    gpu.init()
    import pycuda.driver as drv

    info = gpu.device_info()
    arch = arch or info.arch
    key = _module_key(cu_file, defines, arch)
    mod = _modules.get(key)
    if mod is None:
        from pycuda.compiler import compile as nvcc_cubin

        cubin = nvcc_cubin(kernel_path(cu_file).read_text(), options=NVCC_OPTIONS + define_flags(defines),
                           no_extern_c=True, arch=arch, include_dirs=[str(KERNEL_DIR)])
        mod = _modules[key] = drv.module_from_buffer(cubin)
        _cubins[key] = cubin
    fn = mod.get_function(entry)
    static = fn.shared_size_bytes
    if dynamic_smem + static > info.smem_per_block_optin:
        raise ValueError(
            f"{cu_file}:{entry} needs {static} B static + {dynamic_smem} B dynamic shared memory; "
            f"{info.name} allows {info.smem_per_block_optin} B per block"
        )
    if needs_opt_in(static, dynamic_smem):
        fn.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_smem)
    return CompiledKernel(
        function=fn,
        param_offsets=_offsets_of(key, entry, params) if params else None,
        num_regs=fn.num_regs,
        shared_static_bytes=static,
        local_bytes=fn.local_size_bytes,
        max_threads_per_block=fn.max_threads_per_block,
    )


def _offsets_of(key: tuple, entry: str, count: int) -> tuple[int, ...]:
    """`param_offsets` of a loaded module's entry, asked of the driver once per process."""
    k = (key, entry, count)
    if k not in _offsets:
        _offsets[k] = param_offsets(_cubins[key], entry, count)
    return _offsets[k]


DEFAULT_SMEM = 48 * 1024  # shared bytes a block may use without opting in


def needs_opt_in(static: int, dynamic: int) -> bool:
    """Whether a launch with ``dynamic`` shared bytes of a kernel with ``static`` ones must first raise
    the kernel's ``MAX_DYNAMIC_SHARED_SIZE_BYTES``: when the dynamic bytes, or the static and dynamic
    together, pass 48 KB (the attribute's default is what 48 KB leaves beside the static bytes).

    Source: NVIDIA, CUDA C++ Programming Guide, "Shared Memory" (allocations over 48 KB per block
    need dynamic shared memory and an explicit opt-in, ``cudaFuncSetAttribute``)."""
    return dynamic > 0 and static + dynamic > DEFAULT_SMEM


def _module_key(cu_file: str, defines: dict | None, arch: str) -> tuple:
    """The in-process module cache's key: the file, `source_hash` (it and its includes), defines, arch."""
    return str(kernel_path(cu_file)), source_hash(cu_file), tuple(sorted((defines or {}).items())), arch


def is_built(cu_file: str, defines: dict | None, arch: str) -> bool:
    """Whether `load_kernel` already holds this build for ``arch`` in this process."""
    return _module_key(cu_file, defines, arch) in _modules


def merge_jobs(jobs: list[tuple[str, dict | None]], entry_line=None, groups: int = 1
               ) -> list[tuple[str, dict, str, list[int]]]:
    """The builds that make ``jobs`` (``(cu_file, defines)``). ``entry_line(cu_file, defines)``
    gives, for a job that may share a build, the source line that instantiates its entry point in
    a build of the same file made for another such job (day 13: its ``PIPE_TUNE_ENTRY(...)``), or
    None (a build of its own). The sharing jobs of a file are split in order into at most
    ``groups`` near-equal runs; a run builds as its first job's defines plus the other jobs'
    lines appended to the file's text. Returns ``(cu_file, defines, appended text, indices into
    jobs)`` per build.

    Why: nvcc's front end is about half of one tile's build (day 13 on this series' CI machine:
    0.75 of 1.4 s), and a build of several tiles pays it once."""
    together: dict[str, list[int]] = {}
    out = []
    for i, (cu_file, defines) in enumerate(jobs):
        if entry_line is not None and entry_line(cu_file, defines or {}) is not None:
            together.setdefault(cu_file, []).append(i)
        else:
            out.append((cu_file, dict(defines or {}), "", [i]))
    for cu_file, members in together.items():
        k = max(1, min(groups, len(members)))
        for g in range(k):
            run = members[g * len(members) // k:(g + 1) * len(members) // k]
            lines = [entry_line(cu_file, jobs[i][1]) for i in run[1:]]
            out.append((cu_file, dict(jobs[run[0]][1]), "".join(f"{line}\n" for line in lines), run))
    return out


def build_many(jobs: list[tuple[str, dict | None]], arch: str, workers: int | None = None, entry_line=None) -> float:
    """Compile every ``(cu_file, defines)`` of ``jobs`` for ``arch`` at once, ``workers`` nvcc
    processes in parallel (default: one per CPU core), and load them into `load_kernel`'s cache,
    so its later calls for these builds return at once. Jobs already built are skipped; pycuda's
    disk cache answers repeats across processes (a shared run's source differs from a job's own,
    so a later process that builds the job alone compiles it again). With ``entry_line`` (a search space's
    ``merge``), jobs that can share a build do, one build per worker (`merge_jobs`); a shared
    build that fails is built again job by job. A job that fails to build is left out: the
    `load_kernel` call that needs it builds it again and raises the compiler's error there.
    Returns the wall seconds spent.

    Raises:
        NoGPUError: no GPU or no pycuda (the modules are loaded into the device's context).
    """
    gpu.init()
    import pycuda.driver as drv
    from pycuda.compiler import compile as nvcc_cubin

    t0 = time.perf_counter()
    todo: dict[tuple, tuple[str, dict | None]] = {}
    for cu_file, defines in jobs:
        key = _module_key(cu_file, defines, arch)
        if key not in _modules:
            todo[key] = (cu_file, defines)
    keys, items = list(todo), list(todo.values())
    workers = workers or os.cpu_count() or 1

    def build(item):
        cu_file, defines, appended = item
        try:
            return nvcc_cubin(kernel_path(cu_file).read_text() + appended, options=NVCC_OPTIONS + define_flags(defines),
                              no_extern_c=True, arch=arch, include_dirs=[str(KERNEL_DIR)])
        except Exception:  # noqa: BLE001 - reported by the load_kernel that needs it
            return None

    builds = merge_jobs(items, entry_line, groups=workers)
    with ThreadPoolExecutor(max_workers=workers) as pool:  # nvcc runs outside the GIL
        cubins = list(pool.map(build, [(f, d, a) for f, d, a, _ in builds]))
        failed = [i for (*_, members), c in zip(builds, cubins) if c is None and len(members) > 1 for i in members]
        singles = list(pool.map(build, [(*items[i], "") for i in failed]))
    made = [(members, c) for (*_, members), c in zip(builds, cubins) if c is not None]
    made += [([i], c) for i, c in zip(failed, singles) if c is not None]
    for members, cubin in made:
        mod = drv.module_from_buffer(cubin)  # loading needs the context: on this thread
        for i in members:
            _modules[keys[i]] = mod
            _cubins[keys[i]] = cubin
    return time.perf_counter() - t0


def param_offsets(cubin: bytes, entry: str, count: int) -> tuple[int, ...]:
    """The byte offset of each of the first ``count`` parameters of ``entry`` in the buffer its
    launch passes, as the driver reports it (``cuFuncGetParamInfo``, CUDA 12.4+ drivers): the
    cubin is loaded a second time through ``libcuda.so.1`` (pycuda's module does not expose its
    function handle), asked, and unloaded, in the current context. (Only ``count`` are asked for:
    the driver answers an index past the last with an error, which compute-sanitizer reports.)

    The layout is not plain C packing: on an H200 (driver of CUDA 13.0) every
    ``__grid_constant__ CUtensorMap`` parameter sits at an offset of 48 modulo 64 (112 for a map
    that is the first parameter), while pycuda packs arguments from offset 0 at their natural
    alignment; `helpers.tma.kernel_args` pads the buffer to the offsets given here.

    Raises:
        RuntimeError: the driver failed to load the cubin, find ``entry``, or answer for parameter
            i < ``count`` (the kernel takes fewer parameters than the launch passes).
    """
    lib = ctypes.CDLL("libcuda.so.1")
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    rc = lib.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(cubin))
    if rc != 0:
        raise RuntimeError(f"cuModuleLoadData failed with error {rc}")
    try:
        rc = lib.cuModuleGetFunction(ctypes.byref(fn), mod, entry.encode())
        if rc != 0:
            raise RuntimeError(f"cuModuleGetFunction({entry!r}) failed with error {rc}")
        out, off, size = [], ctypes.c_size_t(), ctypes.c_size_t()
        for i in range(count):
            rc = lib.cuFuncGetParamInfo(fn, ctypes.c_size_t(i), ctypes.byref(off), ctypes.byref(size))
            if rc != 0:
                raise RuntimeError(f"{entry}: no parameter {i} (error {rc}); the launch passes {count}")
            out.append(off.value)
        return tuple(out)
    finally:
        lib.cuModuleUnload(mod)


_hashes: dict = {}  # (KERNEL_DIR, file name) -> (its include closure's `_signature`, its source_hash, when checked)
# Seconds a checked `source_hash` is answered without a ``stat``: an edit is seen on the first call
# after that (sooner than anyone saves a file and runs a cell), and a training step's calls, each of
# which asks, pay for the stats a few times a second instead of on every call. 0: every call checks.
SOURCE_RECHECK_S = 0.5


def _signature(paths) -> tuple:
    """(path, mtime_ns, ctime_ns, size, inode) of each file: an edit changes the modification
    time or, where it keeps it (``touch -r``, ``cp -p``, ``tar``), the change time; a file
    replaced by a rename gets a new inode."""
    return tuple((p, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino) for p in paths for st in [os.stat(p)])


def _closure(cu_file: str) -> tuple[list[Path], bytes]:
    """The files ``cu_file`` includes from ``kernels/conv2d``, itself first, recursively, and the
    bytes `source_hash` hashes (each file's name and text, in path order)."""
    seen: list[Path] = []
    todo = [kernel_path(cu_file)]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.append(path)
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.M):
            if (KERNEL_DIR / inc).is_file():
                todo.append(KERNEL_DIR / inc)
    return seen, b"".join(p.name.encode() + b"\0" + p.read_bytes() + b"\0" for p in sorted(seen))


def source_hash(cu_file: str) -> str:
    """SHA-256 (hex) of ``cu_file`` and every file of ``kernels/conv2d`` it includes, recursively
    (``#include "..."``): what a compiled module, a plan or a tuned choice of this kernel depends
    on, and the key of every such cache.

    Memoised per file: within `SOURCE_RECHECK_S` of the last check a call is a lookup; after it,
    a ``stat`` per file of the closure (a few microseconds each: `helpers.launch.prepare` asks on
    every call, so that an edited kernel is built again), and the files are read and hashed again
    when any of them changed (`_signature`, taken before and after the read, so an edit during the
    read is never stored with the old text).
    """
    memo = _hashes.get((KERNEL_DIR, cu_file))
    if memo is not None:
        now = time.monotonic()
        if now - memo[2] < SOURCE_RECHECK_S:
            return memo[1]
        try:
            if _signature(entry[0] for entry in memo[0]) == memo[0]:
                _hashes[KERNEL_DIR, cu_file] = (memo[0], memo[1], now)
                return memo[1]
        except FileNotFoundError:  # a file of the closure is gone: the includes changed
            pass
    while True:
        files, text = _closure(cu_file)
        before = _signature(str(p) for p in sorted(files))
        files, text = _closure(cu_file)  # read after the signature: an edit now changes the next one
        if _signature(str(p) for p in sorted(files)) == before:
            break
    digest = hashlib.sha256(text).hexdigest()
    _hashes[KERNEL_DIR, cu_file] = (before, digest, time.monotonic())
    return digest


# ---- nvcc without a GPU ----------------------------------------------------------------------


def nvcc_available() -> bool:
    return shutil.which("nvcc") is not None


@functools.cache
def nvcc_version() -> str:
    """nvcc's release line (e.g. ``"Cuda compilation tools, release 13.0, V13.0.48"``), or
    ``"none"`` without nvcc."""
    if not nvcc_available():
        return "none"
    out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    return next((ln.strip() for ln in out.splitlines() if "release" in ln), out.strip().splitlines()[-1])


@dataclass(frozen=True)
class PtxasReport:
    """One function's line of ``-Xptxas -v``: registers, shared/stack bytes, spill bytes."""

    entry: str
    arch: str
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int


_FUNC = re.compile(r"Compiling entry function '(\w+)' for '(sm_\d+a?)'")
_REGS = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_ptxas(log: str) -> list[PtxasReport]:
    """Parse ``nvcc -Xptxas -v`` output into one `PtxasReport` per entry function.

    CUDA 13 prints no ``cmem`` field and may omit ``smem``; missing fields read as 0.
    """
    out: list[PtxasReport] = []
    cur = None
    fields: dict = {}
    for line in log.splitlines():
        m = _FUNC.search(line)
        if m:
            if cur:
                out.append(PtxasReport(cur[0], cur[1], **fields))
            cur = (m.group(1), m.group(2))
            fields = dict(registers=0, shared_bytes=0, stack_bytes=0, spill_stores=0, spill_loads=0)
            continue
        if cur is None:
            continue
        if m := _STACK.search(line):
            fields.update(stack_bytes=int(m[1]), spill_stores=int(m[2]), spill_loads=int(m[3]))
        if m := _REGS.search(line):
            fields["registers"] = int(m[1])
            if s := _SMEM.search(line):
                fields["shared_bytes"] = int(s[1])
    if cur:
        out.append(PtxasReport(cur[0], cur[1], **fields))
    return out


def nvcc_compile(cu_file: str, arch: str = "sm_90", defines: dict | None = None) -> tuple[list[PtxasReport], str]:
    """Compile with plain ``nvcc -cubin -Xptxas -v`` (no GPU needed); return (reports, log).

    Results are cached in-process by (file, `source_hash`, arch, defines), so tests that read the
    same build share one compile, and an edit to the file or to what it includes compiles again.

    Raises:
        FileNotFoundError: nvcc is not on PATH, or no such kernel file.
        RuntimeError: nvcc failed; the message holds its output.
    """
    if not nvcc_available():
        raise FileNotFoundError("nvcc is not on PATH")
    path = kernel_path(cu_file)
    reports, log = _nvcc_compile_cached(str(path), source_hash(cu_file), arch, tuple(sorted((defines or {}).items())))
    return list(reports), log


@functools.cache
def _nvcc_compile_cached(
    path_str: str, source: str, arch: str, defines: tuple
) -> tuple[tuple[PtxasReport, ...], str]:
    """`nvcc_compile`'s work; ``source`` (the `source_hash`) is only the cache key."""
    path, cu_file = Path(path_str), Path(path_str).name
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            "nvcc", "-cubin", f"-arch={arch}", "-Xptxas", "-v", *NVCC_OPTIONS,
            *define_flags(dict(defines)), "-I", str(KERNEL_DIR), str(path), "-o", str(Path(tmp) / "k.cubin"),
        ]
        r = subprocess.run(cmd, capture_output=True, text=True)
    log = r.stdout + r.stderr
    if r.returncode != 0:
        raise RuntimeError(f"nvcc failed for {cu_file} ({arch}, {dict(defines)}):\n{log}")
    return tuple(parse_ptxas(log)), log
