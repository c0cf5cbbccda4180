"""The variant registry and the one launch path: every kernel of the series, what it supports,
what it builds for and how it is launched.

A `Variant` ties a ``.cu`` file to plain functions of the problem:

* ``supports_fn(problem) -> str | None``: ``None`` if the kernel computes this problem correctly,
  otherwise the reason it does not (shown to the user, e.g. "needs stride 1; got (2, 1)");
* ``launches_fn(problem, epilogue) -> list[KernelLaunch]``: the kernel launches of one run, in
  order (one for most variants; day 08 lowers into a workspace, then multiplies). Each names its
  entry point, grid/block/shared bytes and its arguments, pointers by name (`Buffer`: the op's
  tensors x, w, y (or dy, dx, dw), ``workspace``, the epilogue operands ``cin`` and ``bias``),
  tensor maps for the copy engine by tensor name (`helpers.tma.TensorMap`: day 16) and scalars
  as numpy values (``np.int32``, ``np.float32``, as pycuda needs);
* ``covers_fn(problem, cfg) -> np.ndarray``: a Python model of the last launch (the one that
  writes the output): how many times it writes each output element, so tests prove on the CPU
  that every element is written exactly once.

and declares what it takes: the operation (``op``), dtypes and layouts, the epilogue operands it
reads (``operands``) and whether it fuses an `helpers.epilogue.Epilogue`, the scratch bytes it
needs (``workspace_fn``), extra tensor requirements (``tensor_check_fn``, e.g. alignment), and
its build target (``min_cc``, ``arch_suffix``: ``"a"`` builds for ``sm_90a``, the Hopper-only
instructions).

`prepare` is the one launch path: it validates everything once (the problem, the tensors and
operands by name, aliasing, the device), compiles every kernel once and returns a `Plan` that
launches them on the legacy default stream (torch's default), so kernels and torch ops stay
ordered. With ``cache=True`` it keeps what the problem alone decides (launches, workspace size,
compiled kernels) for the next call with the same variant, problem, epilogue and device, which
then only checks its tensors and binds their pointers. `run` prepares, poisons the output with NaN and launches once.

The registry is filled by the days package (`DAYS_PACKAGE`): the core imports no day module;
`get` and `all_variants` import that package by name the first time they are asked, and its
import registers every day's variants.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from . import gpu
from .epilogue import OPERANDS, PLAIN, Epilogue, check_operands
from .problem import Conv2dProblem
from .tma import TensorMap, kernel_args
from .tma import encode as encode_map

# CUDA limits that hold on every GPU this series targets (sm_75 .. sm_120).
MAX_THREADS_PER_BLOCK = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)
DEFAULT_SMEM_LIMIT = 48 * 1024  # every GPU, without opt-in: `supports`' limit when there is no GPU
INT32_MAX = 2**31 - 1  # the kernels take sizes, strides, padding and dilation as np.int32
DAYS_PACKAGE = "days"  # the package whose import registers the series' variants


class UnsupportedProblem(ValueError):
    """The variant does not handle this problem (or this GPU); the message says why and what it accepts."""


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
class Buffer:
    """A pointer argument of a kernel, by the name of the tensor it points to (see `prepare`),
    ``offset`` bytes past its start (e.g. one part of the workspace)."""

    name: str
    offset: int = 0


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch of a variant: ``entry`` with ``config`` on ``args`` (in the kernel's
    order: `Buffer` for pointers, numpy scalars for values). ``name`` labels it in a `Plan`
    (``"main"`` for one-kernel variants). ``defines``: ``(name, value)`` pairs added to the
    variant's own ``defines`` for this launch's build (e.g. the one tile a tuner's candidate
    compiles alone)."""

    name: str
    entry: str
    config: LaunchConfig
    args: tuple
    defines: tuple = ()

    def build_defines(self, variant: Variant) -> dict:
        """The ``-D`` defines this launch's kernel is built with: the variant's, then its own."""
        return {**variant.defines, **dict(self.defines)}


@dataclass(frozen=True)
class Variant:
    """One kernel (or kernel pipeline) of the series; see the module docstring."""

    name: str
    day: int
    cu_file: str
    summary: str
    supports_fn: Callable[[Conv2dProblem], str | None]
    launches_fn: Callable[[Conv2dProblem, Epilogue], list[KernelLaunch]]
    covers_fn: Callable[[Conv2dProblem, LaunchConfig], np.ndarray]
    defines: dict = field(default_factory=dict)
    accum: str = "fp32"  # accumulator precision, for the error bound in `helpers.check`
    op: str = "fprop"
    dtypes: tuple[str, ...] = ("fp32",)
    layouts: tuple[str, ...] = ("NCHW",)
    operands: tuple[str, ...] = ()  # the epilogue operands it reads (`helpers.epilogue.OPERANDS`)
    fused_epilogue: bool = False  # whether it applies a non-plain `Epilogue`
    # Scratch memory one run needs, in bytes (passed as Buffer("workspace")); None: none.
    workspace_fn: Callable[[Conv2dProblem], int] | None = None
    # Extra requirements on the tensors themselves (e.g. 16-byte aligned pointers for vector
    # loads): (problem, {name: tensor or None}, epilogue) -> None, or the reason they cannot be
    # passed. The output is None when `prepare` allocates it (torch's allocations are aligned).
    tensor_check_fn: Callable[[Conv2dProblem, dict, Epilogue], str | None] | None = None
    min_cc: tuple[int, int] = (7, 5)  # oldest compute capability it builds for (CUDA 13: sm_75)
    min_cc_why: str = ""  # what needs min_cc, for the refusal
    arch_suffix: str = ""  # "a": built for sm_XYa (wgmma, TMA), which runs on exactly that GPU
    # The variant forced to each configuration it compiles (and, where a block loops over tiles,
    # on a capped grid), for runs that must see them all (``python -m benchmarks.smoke --configs``
    # under the sanitizers); None: it has one.
    configs_fn: Callable[[], list[Variant]] | None = None

    # ---- what it takes ----------------------------------------------------------------------
    def build_reason(self, cc: tuple[int, int]) -> str | None:
        """None if this variant builds for and runs on a GPU of compute capability ``cc``, else why not."""
        cc = tuple(cc)
        if cc < tuple(self.min_cc):
            why = f" ({self.min_cc_why})" if self.min_cc_why else ""
            return (f"{self.name} needs a GPU of compute capability {self.min_cc[0]}.{self.min_cc[1]} or newer{why}; "
                    f"not {cc[0]}.{cc[1]}")
        if self.arch_suffix and cc != tuple(self.min_cc):
            return (f"{self.name} is built for sm_{self.min_cc[0]}{self.min_cc[1]}{self.arch_suffix}, whose "
                    f"instructions exist only on compute capability {self.min_cc[0]}.{self.min_cc[1]}; "
                    f"not on {cc[0]}.{cc[1]}")
        return None

    def target(self, cc: tuple[int, int]) -> str:
        """The ``-arch`` it compiles with for a GPU of compute capability ``cc``: ``sm_XY``, or
        ``sm_XYa`` with ``arch_suffix`` (see `build_reason` for where it runs at all)."""
        return f"sm_{cc[0]}{cc[1]}{self.arch_suffix}"

    def supports(
        self, problem: Conv2dProblem, smem_limit: int | None = None, cc: tuple[int, int] | None = None
    ) -> str | None:
        """``None`` if this variant handles ``problem`` (on a GPU of compute capability ``cc``,
        when given), else the reason it does not.

        ``smem_limit`` is the shared memory a block may have, in bytes; by default the current
        GPU's opt-in limit (what `prepare` uses), or without a GPU `DEFAULT_SMEM_LIMIT` (48 KB,
        what every GPU allows), which a refusal then names as assumed.
        """
        assumed = ""
        if smem_limit is None:
            smem_limit, assumed = _default_smem_limit()
        if problem.op != self.op:
            return f"{self.name} computes {self.op}; got a {problem.op} problem"
        if problem.dtype not in self.dtypes:
            return f"{self.name} takes dtype {'/'.join(self.dtypes)}; got {problem.dtype}"
        if problem.layout not in self.layouts:
            return f"{self.name} takes layout {'/'.join(self.layouts)}; got {problem.layout}"
        p = problem
        for nm, val in (("N", p.N), ("C", p.C), ("H", p.H), ("W", p.W), ("K", p.K), ("R", p.R), ("S", p.S),
                        ("P", p.P), ("Q", p.Q), ("stride", max(p.stride)), ("padding", max(p.padding)),
                        ("dilation", max(p.dilation)), ("groups", p.groups)):
            if val > INT32_MAX:
                return f"{self.name}: {nm} = {val} does not fit the kernels' int32 arguments (at most {INT32_MAX})"
        reason = self.supports_fn(problem)
        if reason:
            return f"{self.name}: {reason}"
        launches = self.launches(problem)
        for k in launches:
            who = self.name if len(launches) == 1 else f"{self.name} ({k.name} kernel)"
            cfg = k.config
            if cfg.threads_per_block > MAX_THREADS_PER_BLOCK:
                return f"{who}: block {cfg.block} has more than {MAX_THREADS_PER_BLOCK} threads"
            for axis, (g, limit) in enumerate(zip(cfg.grid, MAX_GRID)):
                if not 1 <= g <= limit:
                    return f"{who}: grid {'xyz'[axis]} = {g} is outside 1..{limit}"
            if cfg.shared_bytes > smem_limit:
                return (f"{who}: needs {cfg.shared_bytes} B of shared memory per block; the limit is {smem_limit} B"
                        f"{assumed}")
        return self.build_reason(cc) if cc is not None else None

    def adapt(self, problem: Conv2dProblem, op: bool = False) -> Conv2dProblem:
        """``problem`` itself if this variant takes its layout and dtype, else the same problem in
        the variant's first layout and/or dtype (e.g. an fp32 NCHW suite problem as fp16 NHWC for
        a tensor-core kernel). The operation is changed only with ``op=True`` (the same sizes as
        this variant's operation: how tests run the fprop suites through dgrad and wgrad)."""
        layout = problem.layout if problem.layout in self.layouts else self.layouts[0]
        dtype = problem.dtype if problem.dtype in self.dtypes else self.dtypes[0]
        kind = self.op if op else problem.op
        if (layout, dtype, kind) == (problem.layout, problem.dtype, problem.op):
            return problem
        return replace(problem, layout=layout, dtype=dtype, op=kind, name="")

    # ---- how it launches ----------------------------------------------------------------------
    def launches(self, problem: Conv2dProblem, epilogue: Epilogue = PLAIN) -> list[KernelLaunch]:
        """The kernel launches of one run, in order (see `KernelLaunch`).

        Raises:
            ValueError: launch names that are not unique.
        """
        ks = list(self.launches_fn(problem, epilogue))
        names = [k.name for k in ks]
        if not ks or len(set(names)) != len(names):
            raise ValueError(f"{self.name}: launch names must be unique and at least one; got {names}")
        return ks

    def launch(self, problem: Conv2dProblem) -> LaunchConfig:
        """The launch configuration of the kernel that writes the output (the last one)."""
        return self.launches(problem)[-1].config

    def entry_for(self, problem: Conv2dProblem) -> str:
        """The entry point of the kernel that writes the output, for a problem the variant
        supports (for others the name may not exist)."""
        return self.launches(problem)[-1].entry

    @property
    def entry(self) -> str:
        """The entry point of a variant whose one kernel is the same for every problem (its
        ``launches_fn`` names it as ``entry``, as `days.kit.single_kernel` does with a name).

        Raises:
            AttributeError: the entry depends on the problem: use `entry_for`.
        """
        e = getattr(self.launches_fn, "entry", None)
        if not isinstance(e, str):
            raise AttributeError(f"{self.name} picks its entry point per problem: use entry_for(problem)")
        return e

    def covers(self, problem: Conv2dProblem) -> np.ndarray:
        """Writes per output element (flat, in the problem's layout) predicted by the Python model."""
        return self.covers_fn(problem, self.launch(problem))

    def workspace_bytes(self, problem: Conv2dProblem) -> int:
        """Bytes of scratch memory one run needs (0 without ``workspace_fn``)."""
        return int(self.workspace_fn(problem)) if self.workspace_fn else 0

    def with_output_launch(self, change: Callable[[LaunchConfig], LaunchConfig], name: str) -> Variant:
        """An unregistered copy named ``name`` whose output-writing launch runs with
        ``change(config)`` instead (e.g. a grid capped lower, to exercise grid-stride loops)."""
        launches_fn = self.launches_fn

        def changed(p: Conv2dProblem, ep: Epilogue) -> list[KernelLaunch]:
            ks = list(launches_fn(p, ep))
            return ks[:-1] + [replace(ks[-1], config=change(ks[-1].config))]

        changed.entry = getattr(launches_fn, "entry", None)  # a fixed entry stays the copy's `entry`
        return replace(self, name=name, launches_fn=changed)


def _default_smem_limit() -> tuple[int, str]:
    """(the current GPU's opt-in shared-memory limit per block, ""), or without a GPU
    (`DEFAULT_SMEM_LIMIT`, the note a refusal adds to say the limit was assumed)."""
    if gpu.has_gpu():
        try:
            return gpu.device_info().smem_per_block_optin, ""
        except gpu.NoGPUError:  # a GPU torch sees, but no pycuda to ask: as without one
            pass
    return DEFAULT_SMEM_LIMIT, (" (assumed without a GPU: every GPU allows 48 KB; on one, `supports` and `prepare` "
                                "use its opt-in limit; pass smem_limit= to ask for another)")


REGISTRY: dict[str, Variant] = {}


def register(v: Variant) -> Variant:
    """Add a variant; names are unique."""
    if v.name in REGISTRY:
        raise ValueError(f"variant {v.name!r} is registered twice")
    REGISTRY[v.name] = v
    return v


def _load_days() -> None:
    """Import the days package once; importing it registers every day's variants."""
    importlib.import_module(DAYS_PACKAGE)


def get(name: str | Variant) -> Variant:
    """The variant called ``name``.

    Raises:
        KeyError: unknown name (the message lists the known ones).
    """
    if isinstance(name, Variant):
        return name
    _load_days()
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"no variant {name!r}; known: {', '.join(REGISTRY)}") from None


def all_variants(max_day: int | None = None) -> list[Variant]:
    """Every registered variant (up to ``max_day``), in curriculum order."""
    _load_days()
    vs = sorted(REGISTRY.values(), key=lambda v: (v.day, v.name))
    return [v for v in vs if max_day is None or v.day <= max_day]


# ---- validation -------------------------------------------------------------------------------


def check_tensors(problem: Conv2dProblem, inputs: tuple, out: torch.Tensor | None = None) -> None:
    """Raise a clear error if the op's ``inputs`` (and ``out``, if given) do not match ``problem``
    or cannot be passed to a kernel.

    ``inputs`` are the op's two inputs in `Conv2dProblem.inputs` order (fprop: x, w) and ``out``
    its output (fprop: y). Checked in this order: count; type, dtype, shape, contiguity of each
    input; the same for the output (one ValueError); device (CUDA, the same one for all, and the
    one the kernels' context is on: `helpers.gpu.context_device`).

    Raises:
        TypeError: an input is not a tensor, or has the wrong dtype; the wrong number of inputs.
        ValueError: wrong shape, not contiguous, not on a CUDA device (or not on the first
            input's, or not on the context's device); a bad output.
    """
    names = problem.inputs
    if len(inputs) != len(names):
        raise TypeError(f"a {problem.op} problem takes {len(names)} inputs ({', '.join(names)}); got {len(inputs)}")
    for nm, t in zip(names, inputs):
        shape = problem.tensor_shape(nm)
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
    onm, oshape = problem.output, problem.tensor_shape(problem.output)
    if out is not None and not (
        isinstance(out, torch.Tensor)
        and out.dtype == problem.torch_dtype
        and tuple(out.shape) == oshape
        and out.is_contiguous()
    ):
        got = f"{out.dtype} {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"{onm} must be a contiguous {problem.torch_dtype} tensor of shape {oshape}; got {got}")
    named = list(zip(names, inputs)) + ([(onm, out)] if out is not None else [])
    for nm, t in named:
        if t.device.type != "cuda":
            raise ValueError(f"{nm} is on {t.device}; kernels need CUDA tensors: pass {nm}.cuda()")
    first_nm, first = named[0]
    for nm, t in named[1:]:
        if t.device != first.device:
            raise ValueError(f"{first_nm} is on {first.device} but {nm} is on {t.device}")
    ctx = gpu.context_device()
    if first.device.index is not None and first.device != ctx:
        raise ValueError(f"the tensors are on {first.device}, but the kernels run in the context of {ctx} "
                         f"(helpers.gpu.init): pass {first_nm}.to('{ctx}') and the others")


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two dense tensors share any byte of memory."""
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    return a0 < b1 and b0 < a1 and a.device == b.device


def check_aliasing(out_name: str, out: torch.Tensor, reads: dict) -> None:
    """The output is written while other blocks still read every input and operand: it may share
    memory with none of them, except ``cin`` being exactly the output (each element is read by
    the thread that writes it: an in-place update).

    Raises:
        ValueError: the output overlaps a tensor it must not.
    """
    for nm, t in reads.items():
        if t is None or not overlaps(out, t):
            continue
        if nm == "cin" and _byte_range(t) == _byte_range(out):
            continue
        if nm == "cin":
            raise ValueError(f"cin overlaps {out_name} without being {out_name}: pass {out_name} itself (in place) "
                             "or a separate tensor")
        raise ValueError(
            f"{out_name} overlaps {nm} in memory: the kernel writes {out_name} while other blocks read {nm}"
        )


def _check_call(v: Variant, problem: Conv2dProblem, inputs: tuple, out, operands: dict, epilogue: Epilogue) -> None:
    """The checks of one call's tensors, made on every call (cached plan or not), in order: the
    operands and epilogue this variant takes; `check_tensors`; `helpers.epilogue.check_operands`;
    aliasing of a given output; the variant's ``tensor_check_fn``. Raises what `prepare` documents."""
    unknown = [nm for nm, t in operands.items() if nm not in v.operands and t is not None]
    if unknown:
        takes = ", ".join(v.operands) or "none"
        raise ValueError(f"{v.name} reads no {', '.join(unknown)}; the operands it takes: {takes}")
    if not epilogue.is_plain and not v.fused_epilogue:
        raise ValueError(f"{v.name} fuses no epilogue: it computes the plain {v.op}; got {epilogue}")
    check_tensors(problem, inputs, out)
    check_operands(problem, epilogue, operands, ref=inputs[0])
    reads = {**dict(zip(problem.inputs, inputs)), **operands}
    if out is not None:
        check_aliasing(problem.output, out, reads)
    tensors = {**reads, problem.output: out}
    if v.tensor_check_fn is not None:
        reason = v.tensor_check_fn(problem, tensors, epilogue)
        if reason:
            raise ValueError(f"{v.name}: {reason}")


def _check_stream(device: torch.device) -> None:
    if torch.cuda.current_stream(device).cuda_stream != 0:
        raise RuntimeError("kernels launch on the default stream; leave torch.cuda.stream(...) before calling")


@dataclass(frozen=True)
class _Static:
    """What `prepare` works out from the variant, the problem and the device alone: the launches,
    the workspace's bytes and every launch's compiled kernel (`compile_launches`)."""

    variant: Variant  # held, so that the id in the cache key cannot be reused while cached
    launches: list
    workspace_bytes: int
    compiled: list


def _make_static(v: Variant, problem: Conv2dProblem, inputs: tuple, out, operands: dict,
                 epilogue: Epilogue) -> _Static:
    """Every check `prepare` makes before compiling, in order, then the build: shape-level
    `Variant.supports` (no pycuda call: a day may read device facts through torch, as day 16 reads
    the SM count and L2 size for its grid and tile order); `_check_call`; `supports` with the
    device's shared-memory limit and compute capability; the current stream; the workspace;
    `compile_launches`."""
    reason = v.supports(problem, smem_limit=2**31)  # shape-level reasons first, before any GPU call
    if reason:
        raise UnsupportedProblem(reason)
    _check_call(v, problem, inputs, out, operands, epilogue)
    info = gpu.device_info()
    reason = v.supports(problem, smem_limit=info.smem_per_block_optin, cc=info.cc)
    if reason:
        raise UnsupportedProblem(reason)
    _check_stream(inputs[0].device)
    launches = v.launches(problem, epilogue)
    nbytes = v.workspace_bytes(problem)
    if nbytes <= 0 and any(isinstance(a, Buffer) and a.name == "workspace" for k in launches for a in k.args):
        raise ValueError(f"{v.name}: a kernel passes the workspace, but workspace_fn gives {nbytes} bytes")
    return _Static(v, launches, nbytes, compile_launches(v, launches, v.target(info.cc)))


# Plans `prepare(..., cache=True)` made, by (id of the variant, problem, epilogue, device, the
# kernel's `helpers.compile.source_hash`); the oldest is dropped past PLAN_CACHE_SIZE.
PLAN_CACHE_SIZE = 4096
_plans: OrderedDict = OrderedDict()


def clear_plans() -> None:
    """Forget every plan `prepare(..., cache=True)` kept (e.g. after changing a module-level knob
    that a variant's launches read, such as ``days.day07_general.DW_MIN_GRID``)."""
    _plans.clear()


def _plan_key(v: Variant, problem: Conv2dProblem, epilogue: Epilogue, inputs: tuple):
    """The cache key of a call, or None when there is none (the first input is not a tensor:
    the checks will say so). An edit to the kernel file or to a file it includes gets a new key
    (`helpers.compile.source_hash`)."""
    if not inputs or not isinstance(inputs[0], torch.Tensor):
        return None
    from .compile import source_hash

    return (id(v), problem, epilogue, inputs[0].device, source_hash(v.cu_file))


# ---- the launch path -------------------------------------------------------------------------


@dataclass
class Plan:
    """What `prepare` returns with the output: call it to launch every kernel once, in order.

    ``kernels`` maps each launch's name to a closure that launches that kernel alone (call them
    in order: a later kernel reads what an earlier one wrote), so ``helpers.timing.time_gpu`` can
    time them apart; ``workspace`` is the uint8 scratch tensor they share (None if the variant
    needs none). The plan keeps every tensor it points to alive.
    """

    kernels: dict[str, Callable[[], None]]
    workspace: torch.Tensor | None = None
    tensors: dict = dataclasses.field(default_factory=dict, repr=False)

    def __call__(self) -> None:
        for f in self.kernels.values():
            f()


def _launcher(fn, args: tuple, cfg: LaunchConfig) -> Callable[[], None]:
    def launch() -> None:
        fn(*args, grid=cfg.grid, block=cfg.block, shared=cfg.shared_bytes)

    return launch


def compile_launches(v: Variant, launches: list[KernelLaunch], arch: str) -> list[tuple[KernelLaunch, object]]:
    """Build every launch's kernel of ``v`` for ``arch`` (cached): ``[(launch, launcher)]``, the
    launcher the pycuda function, or for a launch that passes a `helpers.tma.TensorMap` the
    function behind `_MapLauncher`, which places the arguments where the driver expects them.

    Raises:
        UnsupportedProblem: a block larger than the compiled kernel allows.
    """
    from .compile import load_kernel

    out = []
    for k in launches:
        maps = any(isinstance(a, TensorMap) for a in k.args)
        kern = load_kernel(v.cu_file, k.entry, k.build_defines(v), dynamic_smem=k.config.shared_bytes, arch=arch,
                           params=len(k.args) if maps else 0)
        if k.config.threads_per_block > kern.max_threads_per_block:
            raise UnsupportedProblem(
                f"{v.name} ({k.name} kernel): block of {k.config.threads_per_block} threads, but this build "
                f"allows {kern.max_threads_per_block} (registers: {kern.num_regs})"
            )
        out.append((k, _MapLauncher(kern.function, kern.param_offsets) if maps else kern.function))
    return out


@dataclass(frozen=True)
class _MapLauncher:
    """A pycuda function whose arguments include tensor maps (`helpers.tma.MapBytes`): each call
    lays them out at the driver's parameter offsets (`helpers.tma.kernel_args`) first."""

    function: object
    offsets: tuple

    def __call__(self, *args, **launch) -> None:
        self.function(*kernel_args(args, self.offsets), **launch)


def bind(compiled: list[tuple[KernelLaunch, object]], tensors: dict) -> dict[str, Callable[[], None]]:
    """{launch name: closure launching it}: each `Buffer` argument becomes the named tensor's
    pointer plus its ``offset`` (0 for an operand passed as None), each `helpers.tma.TensorMap`
    the map encoded for the named tensor's address (`helpers.tma.encode`).

    Raises:
        ValueError: a launch names a buffer that is not among ``tensors`` (or is None, for a
            map), an offset outside the tensor's bytes, or a map the driver's limits refuse.
        RuntimeError: the driver refused to encode a map.
    """
    out = {}
    for k, fn in compiled:
        args = []
        for a in k.args:
            if isinstance(a, (Buffer, TensorMap)):
                if a.name not in tensors:
                    raise ValueError(f"the {k.name} kernel ({k.entry}) passes {a.name!r}; this run has: "
                                     f"{', '.join(tensors)}")
                t = tensors[a.name]
            if isinstance(a, TensorMap):
                if t is None:
                    raise ValueError(f"the {k.name} kernel ({k.entry}) maps {a.name!r}, which this run passes as None")
                args.append(encode_map(a.desc, t.data_ptr()))
            elif isinstance(a, Buffer):
                if a.offset and (t is None or not 0 <= a.offset < t.numel() * t.element_size()):
                    raise ValueError(f"the {k.name} kernel ({k.entry}) passes {a.name!r} at byte {a.offset}, "
                                     "outside the tensor")
                args.append(np.uintp(t.data_ptr() + a.offset if t is not None else 0))
            else:
                args.append(a)
        out[k.name] = _launcher(fn, tuple(args), k.config)
    return out


def prepare(
    variant: str | Variant,
    problem: Conv2dProblem,
    *inputs: torch.Tensor,
    out: torch.Tensor | None = None,
    epilogue: Epilogue = PLAIN,
    cache: bool = False,
    **operands: torch.Tensor | None,
) -> tuple[Plan, torch.Tensor]:
    """Validate, compile and return ``(plan, out)``: a `Plan` that launches once, and the output.

    Args:
        variant: a registered name or `Variant`.
        problem: the problem; its ``op`` names the tensors.
        inputs: the op's two inputs in `Conv2dProblem.inputs` order (fprop: x, w), in the
            problem's layout and dtype, contiguous, on one CUDA device.
        out: the output (fprop: y), or None to allocate one (not poisoned: see `run`).
        epilogue: a fused `helpers.epilogue.Epilogue` (variants with ``fused_epilogue``).
        cache: keep what the variant, the problem and the device decide (the launches, the
            workspace's size, the compiled kernels) and reuse it on the next call with the same
            variant object, problem, epilogue and device, so that call only checks its tensors
            and binds their pointers (what a model's training step wants: the same layers every
            step). A module-level knob that a variant's launches read is read when the plan is
            first made: `clear_plans` forgets the plans.
        operands: the epilogue operands by name (``cin``, ``bias``; the variant's ``operands``);
            ``cin`` may be ``out`` itself (an in-place update).

    Everything that can be wrong is checked before any launch, and bad tensors and unsupported
    shapes before any GPU call (see `_make_static`'s order); the tensors on every call, cached
    or not (`_check_call`).

    Raises:
        TypeError, ValueError: see `check_tensors` and `helpers.epilogue.check_operands`;
            ValueError also for operands or an epilogue the variant does not take, an output that
            overlaps an input or operand, and tensors the variant's ``tensor_check_fn`` refuses
            (e.g. a misaligned pointer).
        UnsupportedProblem: the variant does not handle ``problem``, or not on this GPU.
        RuntimeError: torch's current stream is not the default stream.
        NoGPUError: no GPU or no pycuda.
    """
    v = get(variant)
    if not isinstance(epilogue, Epilogue):
        raise TypeError(f"epilogue must be a helpers.epilogue.Epilogue; got {type(epilogue).__name__}")
    bad = [nm for nm in operands if nm not in OPERANDS]
    if bad:
        raise TypeError(f"prepare got unknown operands {bad}; epilogue operands are: {', '.join(OPERANDS)}")
    key = _plan_key(v, problem, epilogue, inputs) if cache else None
    static = _plans.get(key) if key is not None else None
    if static is not None:
        _check_call(v, problem, inputs, out, operands, epilogue)
        _check_stream(inputs[0].device)
        _plans.move_to_end(key)
    else:
        static = _make_static(v, problem, inputs, out, operands, epilogue)  # before anything is allocated
        if key is not None:
            _plans[key] = static
            while len(_plans) > PLAN_CACHE_SIZE:
                _plans.popitem(last=False)
    device = inputs[0].device
    if out is None:
        out = torch.empty(problem.tensor_shape(problem.output), dtype=problem.torch_dtype, device=device)
    nbytes = static.workspace_bytes
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes > 0 else None
    tensors = {**dict(zip(problem.inputs, inputs)), problem.output: out, "workspace": workspace,
               **{nm: None for nm in v.operands}, **operands}
    kernels = bind(static.compiled, tensors)
    return Plan(kernels, workspace, tensors), out


def run(
    variant: str | Variant,
    problem: Conv2dProblem,
    *inputs: torch.Tensor,
    out: torch.Tensor | None = None,
    poison: bool = True,
    epilogue: Epilogue = PLAIN,
    **operands: torch.Tensor | None,
) -> torch.Tensor:
    """Run ``variant`` once on the op's ``inputs`` (fprop: x, w) and return the output (fprop: y).

    The output (allocated if not given) is filled with NaN first when ``poison`` is set, so an
    element the kernel never writes shows up as NaN (not with an in-place ``cin``: that is the
    output's old value, whichever view of it is passed). Synchronises and raises on a kernel fault.

    Shapes: `Conv2dProblem.tensor_shape` of each (fprop: x ``x_shape``, w ``w_shape``, y ``y_shape``).

    Raises:
        see `prepare`; ``pycuda.driver.LaunchError`` / ``RuntimeError`` on a fault in the kernel.
    """
    plan, out = prepare(variant, problem, *inputs, out=out, epilogue=epilogue, **operands)
    cin = operands.get("cin")
    in_place = cin is not None and _byte_range(cin) == _byte_range(out)  # any view of out's own memory
    if poison and not in_place:
        out.fill_(float("nan"))
    plan()
    torch.cuda.synchronize()
    return out
