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

A variant that needs several kernels and scratch memory (day 08: im2col into a workspace, then
a GEMM) also sets ``steps_fn(problem) -> list[Step]`` and ``workspace_fn(problem) -> bytes``.
Each `Step` names its entry, launch configuration, pointer arguments (from x, w, y and the
workspace) and scalars; `prepare` allocates the workspace and returns one closure that launches
the steps in order, and `prepare_steps` returns one closure per step (to time them apart).
`supports` checks every step's launch; ``launch_fn``/``covers_fn`` describe the last step, the
one that writes y. Variants without ``steps_fn`` are one step, ``"main"``.
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


BUFFERS = ("x", "w", "y", "workspace")  # the pointers a `Step` can pass, by name


@dataclass(frozen=True)
class Step:
    """One kernel launch of a variant: its pointer arguments, then its scalar arguments.

    ``buffers`` names the pointer arguments in order, from `BUFFERS`: the input x, the filter w,
    the output y and the variant's scratch memory (``workspace``: `Variant.workspace_fn` bytes,
    allocated by `prepare`). ``entry``, ``launch`` and ``scalars`` left ``None`` are the
    variant's own: `Variant.entry_for`, `Variant.launch` and ``args_fn`` (`Variant.steps` fills
    them in); the step that writes y usually leaves them so, which keeps ``covers`` its model.
    Scalars must be numpy scalars (``np.int32``), as pycuda needs.

    Raises:
        ValueError: an unknown buffer name.
    """

    name: str
    buffers: tuple[str, ...]
    entry: str | None = None
    launch: LaunchConfig | None = None
    scalars: tuple | None = None

    def __post_init__(self) -> None:
        unknown = [b for b in self.buffers if b not in BUFFERS]
        if unknown:
            raise ValueError(f"step {self.name!r}: unknown buffers {unknown}; known: {BUFFERS}")


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
    # Several kernels per run (see the module docstring): the steps in launch order, and the
    # bytes of scratch memory they share (``workspace`` in `Step.buffers`).
    steps_fn: Callable[[Conv2dProblem], list[Step]] | None = None
    workspace_fn: Callable[[Conv2dProblem], int] | None = None

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
        if self.steps_fn is None:
            configs = [(self.name, self.launch_fn(problem))]
        else:  # every kernel of the run, named in the reason
            configs = [(f"{self.name} ({s.name} kernel)", s.launch) for s in self.steps(problem)]
        for who, cfg in configs:
            if cfg.threads_per_block > MAX_THREADS_PER_BLOCK:
                return f"{who}: block {cfg.block} has more than {MAX_THREADS_PER_BLOCK} threads"
            for axis, (g, limit) in enumerate(zip(cfg.grid, MAX_GRID)):
                if not 1 <= g <= limit:
                    return f"{who}: grid {'xyz'[axis]} = {g} is outside 1..{limit}"
            if cfg.shared_bytes > smem_limit:
                return f"{who}: needs {cfg.shared_bytes} B of shared memory per block; the limit is {smem_limit} B"
        return None

    def launch(self, problem: Conv2dProblem) -> LaunchConfig:
        return self.launch_fn(problem)

    def in_layout(self, problem: Conv2dProblem) -> Conv2dProblem:
        """``problem`` itself if this variant takes its layout, else the same problem in the
        variant's first layout (e.g. an NCHW suite problem as NHWC for an NHWC kernel)."""
        if problem.layout in self.layouts:
            return problem
        return replace(problem, layout=self.layouts[0], name="")

    def adapt(self, problem: Conv2dProblem) -> Conv2dProblem:
        """`in_layout`, and in the variant's first dtype too if it does not take the problem's
        (e.g. an fp32 suite problem as fp16 NHWC for a tensor-core kernel)."""
        p = self.in_layout(problem)
        if p.dtype in self.dtypes:
            return p
        return replace(p, dtype=self.dtypes[0], name="")

    def entry_for(self, problem: Conv2dProblem) -> str:
        """The kernel function this variant launches for ``problem``."""
        return self.entry_fn(problem) if self.entry_fn else self.entry

    def covers(self, problem: Conv2dProblem) -> np.ndarray:
        """Writes per output element (flat, in the problem's layout) predicted by the Python model."""
        return self.covers_fn(problem, self.launch_fn(problem))

    def steps(self, problem: Conv2dProblem) -> list[Step]:
        """The kernel launches of one run, in order, every field filled in (see `Step`).

        Without ``steps_fn``: one step, ``"main"``, launching `entry_for` with `launch` on
        (x, w, y) and ``args_fn``'s scalars.
        """
        if self.steps_fn is None:
            return [Step("main", ("x", "w", "y"), self.entry_for(problem), self.launch_fn(problem),
                         tuple(self.args_fn(problem)))]  # fmt: skip
        steps = [
            replace(
                s,
                entry=s.entry or self.entry_for(problem),
                launch=s.launch or self.launch_fn(problem),
                scalars=tuple(self.args_fn(problem) if s.scalars is None else s.scalars),
            )
            for s in self.steps_fn(problem)
        ]
        names = [s.name for s in steps]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: step names must be unique; got {names}")
        return steps

    def workspace_bytes(self, problem: Conv2dProblem) -> int:
        """Bytes of scratch memory one run needs (0 without ``workspace_fn``)."""
        return int(self.workspace_fn(problem)) if self.workspace_fn else 0


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

    for mod in ("direct", "tiled", "blocked", "general", "im2col", "igemm", "wmma", "mma", "pipelined"):
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


def _validate(v: Variant, problem: Conv2dProblem, x, w, y) -> None:
    """Every check `prepare` makes before compiling, in order: shape-level `Variant.supports` (no
    GPU call), `check_tensors`, the variant's ``tensor_check_fn``, then `supports` with the device's
    shared-memory limit and the current stream. Raises what `prepare` documents."""
    reason = v.supports(problem, smem_limit=2**31)  # shape-level reasons first, before any GPU call
    if reason:
        raise UnsupportedProblem(reason)
    check_tensors(problem, x, w, y)
    if v.tensor_check_fn is not None:
        reason = v.tensor_check_fn(problem, x, w, y)
        if reason:
            raise ValueError(f"{v.name}: {reason}")
    from . import gpu

    info = gpu.device_info()
    reason = v.supports(problem, smem_limit=info.smem_per_block_optin)
    if reason:
        raise UnsupportedProblem(reason)
    if torch.cuda.current_stream(x.device).cuda_stream != 0:
        raise RuntimeError("kernels launch on the default stream; leave torch.cuda.stream(...) before calling")


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
    if v.steps_fn is not None:  # several kernels and a workspace: `prepare_steps`, then all in order
        launches, y, _ = prepare_steps(v, problem, x, w, y)
        fns = tuple(launches.values())

        def launch_all() -> None:
            for f in fns:
                f()

        return launch_all, y
    _validate(v, problem, x, w, y)
    from .compile import load_kernel

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


def _step_launcher(fn, args: tuple, cfg: LaunchConfig, workspace: torch.Tensor | None) -> Callable[[], None]:
    def launch() -> None:
        fn(*args, grid=cfg.grid, block=cfg.block, shared=cfg.shared_bytes)

    launch.workspace = workspace  # the closure keeps the workspace alive as long as it lives
    return launch


def prepare_steps(
    variant: str | Variant, problem: Conv2dProblem, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor | None = None
) -> tuple[dict[str, Callable[[], None]], torch.Tensor, torch.Tensor | None]:
    """Like `prepare`, but one closure per kernel: ``({step name: launch}, y, workspace)``.

    The closures must be called in order (a later step reads what an earlier one wrote); each
    launches its kernel once on the default stream, so ``helpers.timing.time_gpu`` can time the
    steps apart. ``workspace`` is the uint8 CUDA tensor of `Variant.workspace_bytes` bytes on x's
    device that the steps share (``None`` if the variant needs none); it is allocated last, after
    every check passed and every kernel compiled. A variant without ``steps_fn`` gives
    ``{"main": launch}``, exactly `prepare`'s closure.

    Raises:
        the same as `prepare`, with the same checks before any GPU call.
    """
    v = get(variant)
    if v.steps_fn is None:
        launch, y = prepare(v, problem, x, w, y)
        return {"main": launch}, y, None
    _validate(v, problem, x, w, y)
    from .compile import load_kernel

    steps = v.steps(problem)
    nbytes = v.workspace_bytes(problem)
    if nbytes <= 0 and any("workspace" in s.buffers for s in steps):
        raise ValueError(f"{v.name}: a step passes the workspace, but workspace_fn gives {nbytes} bytes")
    compiled = []
    for s in steps:
        k = load_kernel(v.cu_file, s.entry, v.defines, dynamic_smem=s.launch.shared_bytes)
        if s.launch.threads_per_block > k.max_threads_per_block:
            raise UnsupportedProblem(
                f"{v.name} ({s.name} kernel): block of {s.launch.threads_per_block} threads, but this build "
                f"allows {k.max_threads_per_block} (registers: {k.num_regs})"
            )
        compiled.append((s, k.function))
    if y is None:
        y = torch.empty(problem.y_shape, dtype=problem.torch_dtype, device=x.device)
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=x.device) if nbytes > 0 else None
    ptrs = {"x": x.data_ptr(), "w": w.data_ptr(), "y": y.data_ptr(),
            "workspace": workspace.data_ptr() if workspace is not None else 0}  # fmt: skip
    launches = {}
    for s, fn in compiled:
        args = (*(np.uintp(ptrs[b]) for b in s.buffers), *s.scalars)
        launches[s.name] = _step_launcher(fn, args, s.launch, workspace)
    return launches, y, workspace


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
