"""The one CUDA context shared by torch and pycuda, and facts about the device.

pycuda is imported lazily: it cannot even be imported on a machine without the NVIDIA driver,
and everything else in ``helpers`` (problems, suites, launch configs, plots) works there.

The context is the device's *primary* context, the one torch uses. We initialise torch first,
retain the primary context in pycuda and push it; at exit we pop it again, so the interpreter
ends without pycuda's "context stack was not empty" abort. We never use ``pycuda.autoinit``:
it creates a second context whose pointers torch cannot use.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import subprocess
from dataclasses import asdict, dataclass

import torch

_ctx = None
_device = 0  # the device of the shared context: the one `init` was (or will be) called for
CU_STREAM_NON_BLOCKING = 1  # the driver's flag: no implicit sync with the legacy default stream (as torch's streams)
_streams: dict[int, object] = {}  # handle -> the pycuda Stream `stream` made (one, kept for the process)


class NoGPUError(RuntimeError):
    """Raised when an NVIDIA GPU (or its driver, or pycuda) is not available."""


def has_gpu() -> bool:
    """True when torch sees a CUDA device. Never raises."""
    try:
        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - a broken driver install counts as "no GPU"
        return False


def init(device: int | None = None):
    """Make the device's primary context current for pycuda (and ``device`` torch's current
    device); return it. Idempotent: ``device`` None is the context's device once there is one,
    else device 0. Every kernel of the series runs in this one context, so every tensor passed to
    one must be on its device (`context_device`; `helpers.launch.check_tensors`).

    Raises:
        NoGPUError: no CUDA device, or pycuda is not installed / cannot load libcuda.
        ValueError: the shared context is already on another device than ``device``.
    """
    global _ctx, _device
    if _ctx is not None:
        if device is not None and device != _device:
            raise ValueError(f"the shared context is on cuda:{_device}; one process runs its kernels on one device")
        return _ctx
    device = 0 if device is None else device
    if not has_gpu():
        raise NoGPUError("no NVIDIA GPU is visible to torch (torch.cuda.is_available() is False)")
    torch.cuda.set_device(device)
    torch.empty(1, device=f"cuda:{device}")  # torch creates and binds the primary context
    try:
        import pycuda.driver as drv
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise NoGPUError(
            f"pycuda is not importable ({e}); install it with `pip install pycuda` on a machine "
            "with the NVIDIA driver and the CUDA toolkit"
        ) from e
    drv.init()
    ctx = drv.Device(device).retain_primary_context()
    ctx.push()
    _ctx, _device = ctx, device
    atexit.register(_release)
    return ctx


def context_device() -> torch.device:
    """The CUDA device the kernels run on: the shared context's (`init`'s ``device``, 0 until
    `init` is called with another). No GPU call."""
    return torch.device("cuda", _device)


@contextlib.contextmanager
def thread_context():
    """Make the shared context current for pycuda on the calling thread while the block runs.

    pycuda's current context is per thread. `init` pushes it on the thread that first calls it;
    another thread — autograd runs ``backward`` on a thread of its own, one per device — has no
    current context, and a compile or launch there fails with "invalid device context". This
    pushes the context there (and pops it after). On a thread that has it, or before `init` has
    run (then `init`, on first use, pushes it on this thread), it does nothing. Never raises by
    itself: without a GPU or pycuda, `init` has not run and the block runs as is.
    """
    if _ctx is None:
        yield
        return
    import pycuda.driver as drv

    pushed = drv.Context.get_current() is None
    if pushed:
        _ctx.push()
    try:
        yield
    finally:
        if pushed:
            drv.Context.pop()


def stream() -> torch.cuda.ExternalStream:
    """The series' side stream: a stream of the shared context other than the default, made by
    pycuda (which launches only on streams it made) once per process, non-blocking like torch's
    own streams (order it against others with ``wait_stream``), and wrapped for torch
    (``torch.cuda.ExternalStream``), so ``with torch.cuda.stream(s):`` puts torch's ops and the
    series' kernels on it. Its use: capturing work in a CUDA graph (`capture`), which the legacy
    default stream, where the kernels launch otherwise, cannot be.

    Raises:
        NoGPUError: see `init`.
    """
    init()
    if not _streams:
        import pycuda.driver as drv

        with thread_context():
            s = drv.Stream(CU_STREAM_NON_BLOCKING)
        _streams[s.handle] = s
    return torch.cuda.ExternalStream(next(iter(_streams)), device=context_device())


def capture(fn, warmup: int = 3) -> torch.cuda.CUDAGraph:
    """``fn()`` (GPU work: torch's ops and the series' kernels, no synchronisation, no copy to the
    host) captured once in a CUDA graph; ``g.replay()`` runs it again on torch's current stream.

    As torch's docs ask (``torch.cuda.graph``): ``warmup`` calls on the side stream (`stream`)
    first, which also build the kernels and keep their plans, then one call captured there. The
    graph keeps the addresses it was captured with: write new inputs into the same tensors, read
    outputs (e.g. ``.grad``) from the tensors the captured call made. A synchronisation or an
    allocation outside torch's allocator inside ``fn`` fails the capture (torch's error); so does
    a launch on another stream (the driver's error, through torch or pycuda).

    Raises:
        NoGPUError: see `init`; RuntimeError (or pycuda's LaunchError): what cannot be captured.
    """
    s = stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        fn()
    return g


def capturing() -> bool:
    """Whether torch's current stream is capturing a CUDA graph (no synchronisation may run);
    False without a CUDA build of torch or a GPU. Never raises."""
    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except RuntimeError:  # a CPU build's stub
        return False


def launch_stream(handle: int):
    """The pycuda stream a launch goes on when torch's current stream has handle ``handle``
    (``torch.cuda.current_stream().cuda_stream``): None (pycuda's default) for the legacy default
    stream, 0; the pycuda Stream of the side stream (`stream`).

    Raises:
        RuntimeError: another stream (pycuda launches only on its own streams).
    """
    if handle == 0:
        return None
    s = _streams.get(handle)
    if s is None:
        raise RuntimeError("the kernels launch on the default stream or on a stream of helpers.gpu.stream(); "
                           f"torch's current stream ({handle:#x}) is neither: leave torch.cuda.stream(...) "
                           "or enter one of helpers.gpu.stream()")
    return s


def _release() -> None:
    global _ctx
    if _ctx is None:
        return
    import pycuda.driver as drv

    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - exiting anyway; a sticky error must not abort the pop
        pass
    # Pop every context we (or a caller) pushed, so pycuda's exit check finds an empty stack.
    while drv.Context.get_current() is not None:
        drv.Context.pop()
    _ctx = None


@dataclass(frozen=True)
class DeviceInfo:
    """What the harness and the notebooks need to know about the GPU.

    Peak rates are estimates from the SM count, clock and per-SM unit counts of the
    architecture (CUDA C++ Programming Guide, "Arithmetic Instructions" throughput table);
    treat them as ceilings to compare with, not as measurements.
    """

    name: str
    cc: tuple[int, int]
    sms: int
    smem_per_block: int  # bytes available without opt-in (48 KB)
    smem_per_block_optin: int  # bytes a kernel may opt into with MAX_DYNAMIC_SHARED_SIZE_BYTES
    smem_per_sm: int
    smem_reserved_per_block: int | None  # bytes the driver keeps of each block's shared memory (1 KB on sm_80+)
    regs_per_sm: int
    threads_per_sm: int  # resident threads per SM (2,048 on sm_80 and sm_90, 1,536 on sm_86/89, 1,024 on sm_75)
    blocks_per_sm: int | None  # resident blocks per SM (16 to 32 by architecture)
    l2_bytes: int
    total_mem_bytes: int
    clock_mhz: float | None
    fp32_per_sm_per_clk: int  # FMA lanes: one FMA = 2 FLOP
    fp64_ratio: float  # FP64 : FP32 throughput, e.g. 1/64 on laptop and gaming GPUs
    peak_fp32_tflops: float | None

    @property
    def arch(self) -> str:
        return f"sm_{self.cc[0]}{self.cc[1]}"

    def as_dict(self) -> dict:
        return asdict(self)


# FP32 FMA lanes per SM and FP64:FP32 ratio by compute capability.
_FP32_LANES = {(7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128, (9, 0): 128}
_FP64_RATIO = {(6, 0): 1 / 2, (7, 0): 1 / 2, (8, 0): 1 / 2, (9, 0): 1 / 2, (7, 5): 1 / 32}


@functools.cache
def device_info(device: int | None = None) -> DeviceInfo:
    """Facts about CUDA device ``device`` (None: the shared context's, `context_device`), read
    through pycuda's driver API.

    Raises:
        NoGPUError: see `init`.
    """
    init(device)
    import pycuda.driver as drv

    d = drv.Device(_device)
    a = drv.device_attribute

    def attr(name: str):
        try:
            return d.get_attribute(getattr(a, name))
        except AttributeError:  # a pycuda without this name: ask the driver by its number
            return _driver_attribute(_ATTRIBUTE_NUMBERS.get(name), _device)
        except Exception:  # noqa: BLE001 - CUDA 13 dropped a few attributes; report None
            return None

    cc = d.compute_capability()
    sms = attr("MULTIPROCESSOR_COUNT")
    clock_khz = attr("CLOCK_RATE")
    if not clock_khz:
        clock_khz = _smi_max_clock_khz()
    lanes = _FP32_LANES.get(cc, 128)
    peak = sms * lanes * 2 * clock_khz * 1e3 / 1e12 if clock_khz else None
    return DeviceInfo(
        name=d.name(),
        cc=cc,
        sms=sms,
        smem_per_block=attr("MAX_SHARED_MEMORY_PER_BLOCK"),
        smem_per_block_optin=attr("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN") or attr("MAX_SHARED_MEMORY_PER_BLOCK"),
        smem_per_sm=attr("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
        smem_reserved_per_block=attr("RESERVED_SHARED_MEMORY_PER_BLOCK"),
        regs_per_sm=attr("MAX_REGISTERS_PER_MULTIPROCESSOR"),
        threads_per_sm=attr("MAX_THREADS_PER_MULTIPROCESSOR"),
        blocks_per_sm=attr("MAX_BLOCKS_PER_MULTIPROCESSOR"),
        l2_bytes=attr("L2_CACHE_SIZE"),
        total_mem_bytes=d.total_memory(),
        clock_mhz=clock_khz / 1e3 if clock_khz else None,
        fp32_per_sm_per_clk=lanes,
        fp64_ratio=_FP64_RATIO.get(cc, 1 / 64),
        peak_fp32_tflops=peak,
    )


# CUdevice_attribute numbers (cuda.h) of the attributes an older pycuda may not name.
_ATTRIBUTE_NUMBERS = {"MAX_THREADS_PER_MULTIPROCESSOR": 39, "MAX_BLOCKS_PER_MULTIPROCESSOR": 106,
                      "RESERVED_SHARED_MEMORY_PER_BLOCK": 111}


def _driver_attribute(number: int | None, device: int) -> int | None:
    """``cuDeviceGetAttribute(number)`` of CUDA device ``device`` through ``libcuda.so.1``, or None
    (no number, no driver library, or the driver does not know the attribute)."""
    if number is None:
        return None
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        dev, value = ctypes.c_int(), ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(dev), device) != 0:
            return None
        return value.value if lib.cuDeviceGetAttribute(ctypes.byref(value), number, dev) == 0 else None
    except OSError:  # no libcuda.so.1
        return None


def _smi_max_clock_khz() -> float | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
        return float(out.split()[0]) * 1e3
    except Exception:  # noqa: BLE001 - optional information
        return None


@functools.cache
def versions() -> dict:
    """GPU name, driver, CUDA (torch's build), torch, cuDNN and pycuda versions, as strings.

    Works without a GPU too (then ``gpu`` and ``driver`` are ``"none"``), so a results CSV can
    always say where it came from.
    """
    v = {
        "gpu": "none",
        "driver": "none",
        "cuda": str(torch.version.cuda),
        "torch": torch.__version__,
        "cudnn": str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else "none",
        "pycuda": "none",
    }
    if has_gpu():
        v["gpu"] = torch.cuda.get_device_name(0)
        try:
            v["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"],
                capture_output=True, text=True, timeout=20, check=True,
            ).stdout.strip()
        except Exception:  # noqa: BLE001 - nvidia-smi missing: fall back to the driver API
            try:
                import pycuda.driver as drv

                drv.init()
                dv = drv.get_driver_version()
                v["driver"] = f"CUDA driver API {dv // 1000}.{dv % 1000 // 10}"
            except Exception:  # noqa: BLE001
                pass
    try:
        import pycuda

        v["pycuda"] = pycuda.VERSION_TEXT
    except Exception:  # noqa: BLE001 - not installed (CI)
        pass
    return v


def gpu_slug(name: str | None = None) -> str:
    """A folder name for a GPU, e.g. 'NVIDIA H200' -> 'nvidia-h200'."""
    name = name or versions()["gpu"]
    return "".join(ch if ch.isalnum() else "-" for ch in name.lower()).strip("-").replace("--", "-")
