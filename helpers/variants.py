"""The variant registry: every kernel of the series, what it supports, how it is launched.

A `Variant` ties a ``.cu`` file and entry point to three plain functions:

* ``supports(problem) -> str | None``: ``None`` if the kernel computes this problem correctly,
  otherwise the reason it does not (shown to the user, e.g. "needs stride 1; got (2, 1)");
* ``launch(problem) -> LaunchConfig``: grid, block and dynamic shared bytes;
* ``args(problem) -> tuple``: the scalar arguments after the pointers ``x, w, y``.

and one Python model of the kernel, ``covers(problem, cfg) -> np.ndarray``, which counts how many
times the launch writes each output element, so tests can prove on the CPU that every element is
written exactly once.

`run` validates tensors and the problem *before* anything touches the GPU, then launches on the
legacy default stream (torch's default), so kernels and torch ops stay ordered.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from .problem import Conv2dProblem

# CUDA limits that hold on every GPU this series targets (sm_75 .. sm_120).
MAX_THREADS_PER_BLOCK = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)
DEFAULT_SMEM_LIMIT = 48 * 1024  # without opt-in; `run` asks the device for its opt-in limit
INT32_MAX = 2**31 - 1  # the kernels take sizes, strides, padding and dilation as np.int32


class UnsupportedProblem(ValueError):
    """The variant does not handle this problem; the message says why and what it accepts."""


@dataclass(frozen=True)
class LaunchConfig:
    """grid and block as (x, y, z); ``shared_bytes`` is the dynamic shared memory per block."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0

    @property
    def threads_per_block(self) -> int:
        return math.prod(self.block)

    @property
    def blocks(self) -> int:
        return math.prod(self.grid)


@dataclass(frozen=True)
class Variant:
    """One kernel of the series (see the module docstring)."""

    name: str
    day: int
    cu_file: str
    entry: str
    summary: str
    supports_fn: Callable[[Conv2dProblem], str | None]
    launch_fn: Callable[[Conv2dProblem], LaunchConfig]
    args_fn: Callable[[Conv2dProblem], tuple]
    covers_fn: Callable[[Conv2dProblem, LaunchConfig], np.ndarray]
    defines: dict = field(default_factory=dict)
    accum: str = "fp32"  # accumulator precision, for the error bound in `helpers.check`
    # For files with several specialised entry points (e.g. one per filter size): picks the
    # entry for a problem. ``entry`` is then the default one.
    entry_fn: Callable[[Conv2dProblem], str] | None = None
    dtypes: tuple[str, ...] = ("fp32",)
    layouts: tuple[str, ...] = ("NCHW",)
    # Extra requirements on the tensors themselves (e.g. 16-byte aligned pointers for vector
    # loads): (problem, x, w, y or None) -> None, or the reason they cannot be passed. Checked
    # in `prepare` right after `check_tensors`, before any GPU call (y is None when `prepare`
    # allocates it; torch's allocations are 256-byte aligned).
    tensor_check_fn: Callable[[Conv2dProblem, torch.Tensor, torch.Tensor, torch.Tensor], str | None] | None = None

    def supports(self, problem: Conv2dProblem, smem_limit: int = DEFAULT_SMEM_LIMIT) -> str | None:
        """``None`` if this variant handles ``problem``, else the reason it does not."""
        if problem.dtype not in self.dtypes:
            return f"{self.name} takes dtype {'/'.join(self.dtypes)}; got {problem.dtype}"
        if problem.layout not in self.layouts:
            return f"{self.name} takes layout {'/'.join(self.layouts)}; got {problem.layout}"
        p = problem
        for nm, val in (("N", p.N), ("C", p.C), ("H", p.H), ("W", p.W), ("K", p.K), ("R", p.R), ("S", p.S),
                        ("P", p.P), ("Q", p.Q), ("stride", max(p.stride)), ("padding", max(p.padding)),
                        ("dilation", max(p.dilation)), ("groups", p.groups)):  # fmt: skip
            if val > INT32_MAX:
                return f"{self.name}: {nm} = {val} does not fit the kernels' int32 arguments (at most {INT32_MAX})"
        reason = self.supports_fn(problem)
        if reason:
            return f"{self.name}: {reason}"
        cfg = self.launch_fn(problem)
        if cfg.threads_per_block > MAX_THREADS_PER_BLOCK:
            return f"{self.name}: block {cfg.block} has more than {MAX_THREADS_PER_BLOCK} threads"
        for axis, (g, limit) in enumerate(zip(cfg.grid, MAX_GRID)):
            if not 1 <= g <= limit:
                return f"{self.name}: grid {'xyz'[axis]} = {g} is outside 1..{limit}"
        if cfg.shared_bytes > smem_limit:
            return f"{self.name}: needs {cfg.shared_bytes} B of shared memory per block; the limit is {smem_limit} B"
        return None

    def launch(self, problem: Conv2dProblem) -> LaunchConfig:
        return self.launch_fn(problem)

    def in_layout(self, problem: Conv2dProblem) -> Conv2dProblem:
        """``problem`` itself if this variant takes its layout, else the same problem in the
        variant's first layout (e.g. an NCHW suite problem as NHWC for an NHWC kernel)."""
        if problem.layout in self.layouts:
            return problem
        return replace(problem, layout=self.layouts[0], name="")

    def entry_for(self, problem: Conv2dProblem) -> str:
        """The kernel function this variant launches for ``problem``."""
        return self.entry_fn(problem) if self.entry_fn else self.entry

    def covers(self, problem: Conv2dProblem) -> np.ndarray:
        """Writes per output element (flat, in the problem's layout) predicted by the Python model."""
        return self.covers_fn(problem, self.launch_fn(problem))


REGISTRY: dict[str, Variant] = {}


def register(v: Variant) -> Variant:
    """Add a variant; names are unique."""
    if v.name in REGISTRY:
        raise ValueError(f"variant {v.name!r} is registered twice")
    REGISTRY[v.name] = v
    return v


def _load_all() -> None:
    """Import the modules whose import registers variants (days in curriculum order)."""
    import importlib

    for mod in ("direct", "tiled", "blocked", "general", "im2col", "igemm"):
        try:
            importlib.import_module(f"{__package__}.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.{mod}":  # a real import error inside the module
                raise


def get(name: str | Variant) -> Variant:
    """The variant called ``name``.

    Raises:
        KeyError: unknown name (the message lists the known ones).
    """
    if isinstance(name, Variant):
        return name
    _load_all()
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"no variant {name!r}; known: {', '.join(REGISTRY)}") from None


def all_variants(max_day: int | None = None) -> list[Variant]:
    """Every registered variant (up to ``max_day``), in curriculum order."""
    _load_all()
    vs = sorted(REGISTRY.values(), key=lambda v: (v.day, v.name))
    return [v for v in vs if max_day is None or v.day <= max_day]


# ---- validation and launch -------------------------------------------------------------------


def check_tensors(problem: Conv2dProblem, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor | None = None) -> None:
    """Raise a clear error if ``x``/``w`` (and ``y``, if given) do not match ``problem`` or cannot
    be passed to a kernel.

    Checked in this order: type, dtype, shape, contiguity of x and w; the same for y (one
    ValueError); device (CUDA, the same one for all).

    Raises:
        TypeError: x or w is not a tensor, or has the wrong dtype.
        ValueError: wrong shape, not contiguous, not on a CUDA device (or not on x's); a bad ``y``.
    """
    for nm, t, shape in (("x", x, problem.x_shape), ("w", w, problem.w_shape)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{nm} must be a torch.Tensor; got {type(t).__name__}")
        if t.dtype != problem.torch_dtype:
            raise TypeError(f"{nm} must be {problem.torch_dtype} for a {problem.dtype} problem; got {t.dtype}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{nm} must have shape {shape} ({problem.layout}); got {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(
                f"{nm} is not contiguous (strides {t.stride()}); kernels read dense {problem.layout} "
                f"memory: pass {nm}.contiguous()"
            )
    if y is not None and not (
        isinstance(y, torch.Tensor)
        and y.dtype == problem.torch_dtype
        and tuple(y.shape) == problem.y_shape
        and y.is_contiguous()
    ):
        got = f"{y.dtype} {tuple(y.shape)}" if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(f"y must be a contiguous {problem.torch_dtype} tensor of shape {problem.y_shape}; got {got}")
    named = (("x", x), ("w", w)) + ((("y", y),) if y is not None else ())
    for nm, t in named:
        if t.device.type != "cuda":
            raise ValueError(f"{nm} is on {t.device}; kernels need CUDA tensors: pass {nm}.cuda()")
    for nm, t in named[1:]:
        if t.device != x.device:
            raise ValueError(f"x is on {x.device} but {nm} is on {t.device}")


def prepare(
    variant: str | Variant, problem: Conv2dProblem, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor | None = None
) -> tuple[Callable[[], None], torch.Tensor]:
    """Validate, compile and return ``(launch, y)``: a closure that launches once, and the output.

    Everything that can be wrong is checked here, before any launch: tensors, ``y`` included
    (`check_tensors`), the problem (`Variant.supports`, with the device's shared-memory limit),
    the current stream. Bad tensors and unsupported shapes are refused before any GPU call.

    Raises:
        TypeError, ValueError: see `check_tensors`; ValueError also for tensors the variant's
            ``tensor_check_fn`` refuses (e.g. a misaligned pointer).
        UnsupportedProblem: the variant does not handle ``problem``.
        RuntimeError: torch's current stream is not the default stream.
        NoGPUError: no GPU or no pycuda.
    """
    v = get(variant)
    reason = v.supports(problem, smem_limit=2**31)  # shape-level reasons first, before any GPU call
    if reason:
        raise UnsupportedProblem(reason)
    check_tensors(problem, x, w, y)
    if v.tensor_check_fn is not None:
        reason = v.tensor_check_fn(problem, x, w, y)
        if reason:
            raise ValueError(f"{v.name}: {reason}")
    from . import gpu
    from .compile import load_kernel

    info = gpu.device_info()
    reason = v.supports(problem, smem_limit=info.smem_per_block_optin)
    if reason:
        raise UnsupportedProblem(reason)
    if torch.cuda.current_stream(x.device).cuda_stream != 0:
        raise RuntimeError("kernels launch on the default stream; leave torch.cuda.stream(...) before calling")
    if y is None:
        y = torch.empty(problem.y_shape, dtype=problem.torch_dtype, device=x.device)
    cfg = v.launch(problem)
    k = load_kernel(v.cu_file, v.entry_for(problem), v.defines, dynamic_smem=cfg.shared_bytes)
    if cfg.threads_per_block > k.max_threads_per_block:
        raise UnsupportedProblem(
            f"{v.name}: block of {cfg.threads_per_block} threads, but this build allows "
            f"{k.max_threads_per_block} (registers: {k.num_regs})"
        )
    args = (np.uintp(x.data_ptr()), np.uintp(w.data_ptr()), np.uintp(y.data_ptr()), *v.args_fn(problem))
    fn = k.function

    def launch() -> None:
        fn(*args, grid=cfg.grid, block=cfg.block, shared=cfg.shared_bytes)

    return launch, y


def run(
    variant: str | Variant,
    problem: Conv2dProblem,
    x: torch.Tensor,
    w: torch.Tensor,
    y: torch.Tensor | None = None,
    poison: bool = True,
) -> torch.Tensor:
    """Run ``variant`` once on ``x``, ``w`` (layout and dtype of ``problem``) and return ``y``.

    ``y`` (allocated if not given) is filled with NaN first when ``poison`` is set, so an output
    element the kernel never writes shows up as NaN. Synchronises and raises on a kernel fault.

    Shapes: x ``problem.x_shape``, w ``problem.w_shape``, y ``problem.y_shape``.

    Raises:
        see `prepare`; ``pycuda.driver.LaunchError`` / ``RuntimeError`` on a fault in the kernel.
    """
    launch, y = prepare(variant, problem, x, w, y)
    if poison:
        y.fill_(float("nan"))
    launch()
    torch.cuda.synchronize()
    return y
