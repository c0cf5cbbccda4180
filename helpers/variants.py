"""The variant registry: every kernel of the series, what it supports, its configuration for a
problem and the launches that run it, as one `Plan` per (variant, problem).

A `Variant` ties a ``.cu`` file to plain functions of the problem:

* ``config_fn(problem) -> config``, for a variant with a choice to make (days 13, 14, 16: a tile,
  a schedule, split-K slices): the configuration it runs the problem with, decided once per
  `Plan`. A forced configuration is the same variant with a ``config_fn`` that returns it. Where
  there is a ``config_fn``, each function below takes that configuration as its **last**
  argument; a variant without one (days 01-12) has nothing to pass;
* ``supports_fn(problem[, config]) -> str | None``: ``None`` if the kernel computes this problem
  correctly, otherwise the reason it does not (shown to the user, e.g. "needs stride 1; got (2, 1)");
* ``launches_fn(problem, epilogue[, config]) -> list[KernelLaunch]``: the kernel launches of one
  run, in order (one for most variants; day 08 lowers into a workspace, then multiplies). Each
  names its entry point, grid/block/shared bytes and its arguments, pointers by name (`Buffer`:
  the op's tensors x, w, y (or dy, dx, dw), ``workspace``, the epilogue operands ``cin`` and
  ``bias``), tensor maps for the copy engine by tensor name (`helpers.tma.TensorMap`: day 16) and
  scalars as numpy values (``np.int32``, ``np.float32``, as pycuda needs). A launch is built from
  the variant's ``.cu`` file unless it names its own (`KernelLaunch.cu_file`: day 18 runs day 16's
  kernel, built from day 16's file);
* ``covers_fn(problem, launch_config[, config]) -> np.ndarray``: a Python model of the last
  launch (the one that writes the output): how many times it writes each output element, so
  tests prove on the CPU that every element is written exactly once;
* ``workspace_fn(problem[, config])``: the scratch bytes one run needs;
* ``tensor_check_fn(problem, tensors, epilogue[, config])``: what the tensors themselves must
  satisfy (e.g. 16-byte aligned pointers for vector loads);
* ``error_model``: a `helpers.reference.ErrorModel`, for a variant whose rounding is not the
  operation's dot products' (day 20's Winograd), by which `helpers.check` judges it;

and declares what it takes: the operation (``op``), dtypes and layouts, the epilogue operands it
reads (``operands``) and whether it fuses an `helpers.epilogue.Epilogue`, and its build target
(``min_cc``, ``arch_suffix``: ``"a"`` builds for ``sm_90a``, the Hopper-only instructions).

`Variant.plan` calls each of these once for a (problem, epilogue) and returns the `Plan`: the
configuration, the refusal reason or the launches and workspace size, and (once
`helpers.launch.prepare` has built them) the compiled kernels. The harness passes the plan on
(`helpers.launch.prepare`, `helpers.check.check`, `helpers.bench.bench`, the tuner), so one
benchmark row asks the variant once; `Variant.supports`, `launches`, `launch`, `covers` and
`workspace_bytes` are each one plan's answer.

The registry is filled by the days package (`DAYS_PACKAGE`): the core imports no day module;
`get` and `all_variants` import that package by name the first time they are asked, and its
import registers every day's variants.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from . import gpu
from .epilogue import PLAIN, Epilogue
from .problem import Conv2dProblem

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
    compiles alone). ``cu_file``: the ``kernels/conv2d`` file this launch's entry is built from;
    None: the variant's ``cu_file`` (`source`). A launch names its own file when its kernel is
    another day's, built from that day's file as it is (day 18 runs day 16's fprop after its own
    kernel), instead of one ``.cu`` including another's."""

    name: str
    entry: str
    config: LaunchConfig
    args: tuple
    defines: tuple = ()
    cu_file: str | None = None

    def source(self, variant: Variant) -> str:
        """The ``kernels/conv2d`` file this launch's kernel is built from: its own ``cu_file``, or
        the variant's."""
        return self.cu_file if self.cu_file is not None else variant.cu_file

    def build_defines(self, variant: Variant) -> dict:
        """The ``-D`` defines this launch's kernel is built with: the variant's, then its own."""
        return {**variant.defines, **dict(self.defines)}


@dataclass(frozen=True)
class Variant:
    """One kernel (or kernel pipeline) of the series; see the module docstring."""

    name: str
    day: int
    cu_file: str  # the kernels/conv2d file its launches are built from (a launch may name its own)
    summary: str
    supports_fn: Callable[..., str | None]
    launches_fn: Callable[..., list[KernelLaunch]]
    covers_fn: Callable[..., np.ndarray]
    # The configuration of a variant with a choice (tile, schedule, split-K) for a problem, decided
    # once per plan and passed last to every function of the problem; None: no choice to make.
    config_fn: Callable[[Conv2dProblem], object] | None = None
    defines: dict = field(default_factory=dict)
    accum: str = "fp32"  # accumulator precision, for the error bound in `helpers.check`
    # The variant's own rounding bound where its arithmetic is not the operation's dot products
    # (day 20's Winograd transforms): a `helpers.reference.ErrorModel`, which the record keeps and
    # `helpers.check` reads; None: the dot product's bound.
    error_model: object | None = None
    op: str = "fprop"
    dtypes: tuple[str, ...] = ("fp32",)
    layouts: tuple[str, ...] = ("NCHW",)
    operands: tuple[str, ...] = ()  # the epilogue operands it reads (`helpers.epilogue.OPERANDS`)
    fused_epilogue: bool = False  # whether it applies a non-plain `Epilogue`
    # Scratch memory one run needs, in bytes (passed as Buffer("workspace")); None: none.
    workspace_fn: Callable[..., int] | None = None
    # Extra requirements on the tensors themselves (e.g. 16-byte aligned pointers for vector
    # loads): (problem, {name: tensor or None}, epilogue[, config]) -> None, or the reason they
    # cannot be passed. The output is None when `prepare` allocates it (torch's allocations are aligned).
    tensor_check_fn: Callable[..., str | None] | None = None
    min_cc: tuple[int, int] = (7, 5)  # oldest compute capability it builds for (CUDA 13: sm_75)
    min_cc_why: str = ""  # what needs min_cc, for the refusal
    arch_suffix: str = ""  # "a": built for sm_XYa (wgmma, TMA), which runs on exactly that GPU
    # The variant forced to each configuration it compiles (and, where a block loops over tiles,
    # on a capped grid), for runs that must see them all (``python -m benchmarks.smoke --configs``
    # under the sanitizers); None: it has one.
    configs_fn: Callable[[], list[Variant]] | None = None
    # Called by `helpers.launch.prepare` after the tensor checks, before anything is built:
    # (problem, config) -> the configuration to run instead (the tuned variant checks a cached
    # choice once, with a GPU, and answers with the rule's where it fails); None: no review.
    review_fn: Callable[[Conv2dProblem, object], object] | None = None

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

    def ask(self, fn: Callable, problem: Conv2dProblem, *args, config: object = None):
        """``fn(problem, *args)``, with ``config`` appended where the variant has a ``config_fn``
        (the one calling convention of its functions; see the module docstring)."""
        return fn(problem, *args, config) if self.config_fn is not None else fn(problem, *args)

    def claim_reason(self, problem: Conv2dProblem) -> str | None:
        """What the variant declares, before any of its functions runs: None if ``problem`` has
        its operation, a dtype and layout it takes, and sizes that fit the kernels' int32
        arguments; else the reason."""
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
        return None

    def plan(self, problem: Conv2dProblem, epilogue: Epilogue = PLAIN, config: object = None) -> Plan:
        """This variant's `Plan` for ``problem`` with ``epilogue``: its configuration (``config``
        if given, else ``config_fn``, once) and ``supports_fn``'s verdict; the launches and the
        workspace are asked for once, when first needed (`Plan.launches`). No GPU call.
        """
        reason = self.claim_reason(problem)
        if reason is None and config is None and self.config_fn is not None:
            config = self.config_fn(problem)
        if reason is None:
            why = self.ask(self.supports_fn, problem, config=config)
            reason = f"{self.name}: {why}" if why else None
        return Plan(self, problem, epilogue, config, reason)

    def supports(
        self, problem: Conv2dProblem, smem_limit: int | None = None, cc: tuple[int, int] | None = None
    ) -> str | None:
        """``None`` if this variant handles ``problem`` (on a GPU of compute capability ``cc``,
        when given), else the reason it does not: its plan's `Plan.refusal`."""
        return self.plan(problem).refusal(smem_limit, cc)

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

    # ---- one plan's answers, for a problem the variant supports --------------------------------
    def launches(self, problem: Conv2dProblem, epilogue: Epilogue = PLAIN) -> list[KernelLaunch]:
        """The kernel launches of one run, in order (see `KernelLaunch`), as the variant's
        ``launches_fn`` gives them (also for a problem it refuses: check `supports` first)."""
        return list(self.plan(problem, epilogue).launches)

    def launch(self, problem: Conv2dProblem) -> LaunchConfig:
        """The launch configuration of the kernel that writes the output (the last one)."""
        return self.launches(problem)[-1].config

    def entry_for(self, problem: Conv2dProblem) -> str:
        """The entry point of the kernel that writes the output."""
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
        return self.plan(problem).covers()

    def workspace_bytes(self, problem: Conv2dProblem) -> int:
        """Bytes of scratch memory one run needs (0 without ``workspace_fn``)."""
        return self.plan(problem).workspace_bytes

    def with_output_launch(self, change: Callable[[LaunchConfig], LaunchConfig], name: str) -> Variant:
        """An unregistered copy named ``name`` whose output-writing launch runs with
        ``change(config)`` instead (e.g. a grid capped lower, to exercise grid-stride loops)."""
        launches_fn = self.launches_fn

        def changed(p: Conv2dProblem, *rest) -> list[KernelLaunch]:
            ks = list(launches_fn(p, *rest))
            return ks[:-1] + [replace(ks[-1], config=change(ks[-1].config))]

        changed.entry = getattr(launches_fn, "entry", None)  # a fixed entry stays the copy's `entry`
        return replace(self, name=name, launches_fn=changed)


@dataclass(eq=False)
class Plan:
    """One variant's plan for one problem and epilogue (`Variant.plan`): what the variant decided,
    each of its functions asked once, and what the harness builds from it.

    ``config`` is the variant's configuration (None without a ``config_fn``); ``reason`` is None
    when the variant handles the problem's shape, else why not. `launches` (the kernel launches
    of one run, in order, the last writing the output) and `workspace_bytes` (the scratch one run
    needs) are asked for on first use and kept. `sources` are the kernel files its launches are
    built from. ``compiled`` holds the built kernels by (device, arch, the source hash of each of
    `sources`), filled by `helpers.launch.prepare`.
    """

    variant: Variant
    problem: Conv2dProblem
    epilogue: Epilogue
    config: object
    reason: str | None
    compiled: dict = field(default_factory=dict, repr=False)
    _launches: tuple | None = field(default=None, repr=False)
    _workspace: int | None = field(default=None, repr=False)
    _refusals: dict = field(default_factory=dict, repr=False)

    def ask(self, fn: Callable, *args):
        """``fn(problem, *args[, config])``: one of the variant's functions, about this plan's problem."""
        config = self.config
        if config is None and self.variant.config_fn is not None:  # a refused claim: not decided yet
            config = self.config = self.variant.config_fn(self.problem)
        return self.variant.ask(fn, self.problem, *args, config=config)

    @property
    def launches(self) -> tuple[KernelLaunch, ...]:
        """The variant's ``launches_fn`` for this plan, asked once (for a refused problem too:
        what the function gives, or raises).

        Raises:
            ValueError: launch names that are not unique, or none.
        """
        if self._launches is None:
            ks = tuple(self.ask(self.variant.launches_fn, self.epilogue))
            names = [k.name for k in ks]
            if not ks or len(set(names)) != len(names):
                raise ValueError(f"{self.variant.name}: launch names must be unique and at least one; got {names}")
            self._launches = ks
        return self._launches

    @property
    def sources(self) -> tuple[str, ...]:
        """The ``kernels/conv2d`` files the launches are built from (`KernelLaunch.source`), each
        once, in launch order: the variant's ``cu_file`` alone unless a launch names another.

        Raises:
            ValueError: what `launches` raises.
        """
        return tuple(dict.fromkeys(k.source(self.variant) for k in self.launches))

    @property
    def workspace_bytes(self) -> int:
        """Bytes of scratch memory one run needs (0 without ``workspace_fn``), asked once.

        Raises:
            ValueError: a kernel passes the workspace while ``workspace_fn`` gives no bytes.
        """
        if self._workspace is None:
            fn = self.variant.workspace_fn
            nbytes = int(self.ask(fn)) if fn is not None else 0
            if nbytes <= 0 and any(isinstance(a, Buffer) and a.name == "workspace"
                                   for k in self.launches for a in k.args):
                raise ValueError(f"{self.variant.name}: a kernel passes the workspace, but workspace_fn gives "
                                 f"{nbytes} bytes")
            self._workspace = max(nbytes, 0)
        return self._workspace

    def refusal(self, smem_limit: int | None = None, cc: tuple[int, int] | None = None) -> str | None:
        """None if the plan runs, else why not: ``reason``, then each launch's block, grid and
        shared memory against the CUDA limits, then (``cc`` given) the build target.

        ``smem_limit`` is the shared memory a block may have, in bytes; by default the current
        GPU's opt-in limit (what `helpers.launch.prepare` uses), or without a GPU
        `DEFAULT_SMEM_LIMIT` (48 KB, what every GPU allows), which a refusal then names as assumed.
        The answer is kept by limit and ``cc`` (a plan does not change): `helpers.launch.prepare`
        asks twice on every call.
        """
        if self.reason is not None:
            return self.reason
        assumed = ""
        if smem_limit is None:
            smem_limit, assumed = _default_smem_limit()
        key = (smem_limit, assumed, None if cc is None else tuple(cc))
        if key not in self._refusals:
            self._refusals[key] = self._launch_refusal(smem_limit, assumed, cc)
        return self._refusals[key]

    def _launch_refusal(self, smem_limit: int, assumed: str, cc: tuple[int, int] | None) -> str | None:
        """`refusal`'s work past ``reason``: the launches against the CUDA limits, then the build target."""
        name = self.variant.name
        for k in self.launches:
            who = name if len(self.launches) == 1 else f"{name} ({k.name} kernel)"
            cfg = k.config
            if cfg.threads_per_block > MAX_THREADS_PER_BLOCK:
                return f"{who}: block {cfg.block} has more than {MAX_THREADS_PER_BLOCK} threads"
            for axis, (g, limit) in enumerate(zip(cfg.grid, MAX_GRID)):
                if not 1 <= g <= limit:
                    return f"{who}: grid {'xyz'[axis]} = {g} is outside 1..{limit}"
            if cfg.shared_bytes > smem_limit:
                return (f"{who}: needs {cfg.shared_bytes} B of shared memory per block; the limit is {smem_limit} B"
                        f"{assumed}")
        return self.variant.build_reason(cc) if cc is not None else None

    def covers(self, launch: LaunchConfig | None = None) -> np.ndarray:
        """Writes per output element (flat, in the problem's layout) of the last launch, by the
        variant's Python model (``covers_fn``); ``launch``: that launch's configuration changed
        (e.g. a capped grid), by default the plan's."""
        return self.ask(self.variant.covers_fn, launch or self.launches[-1].config)

    def tensor_reason(self, tensors: dict) -> str | None:
        """None if the variant's ``tensor_check_fn`` (if any) takes ``tensors`` ({name: tensor or
        None}) for this plan, else the reason."""
        fn = self.variant.tensor_check_fn
        return None if fn is None else self.ask(fn, tensors, self.epilogue)


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


def as_plan(target: Plan | Variant | str, problem: Conv2dProblem | None = None,
            epilogue: Epilogue | None = None) -> Plan:
    """The plan a call runs: ``target`` itself when it is a `Plan` (a ``problem`` or ``epilogue``
    given too must be its own), else the variant's (``get(target)``) plan for ``problem`` with
    ``epilogue`` (default: plain).

    Raises:
        TypeError: a variant without a problem.
        ValueError: a plan with another problem or epilogue than the ones given.
        KeyError: an unknown variant name.
    """
    if isinstance(target, Plan):
        if problem is not None and problem != target.problem:
            raise ValueError(f"the plan is for {target.problem.name}; got problem {problem.name}")
        if epilogue is not None and epilogue != target.epilogue:
            raise ValueError(f"the plan was made for {target.epilogue}; got epilogue={epilogue}: make a plan for it")
        return target
    if not isinstance(problem, Conv2dProblem):
        raise TypeError("a variant needs the problem that follows it (or pass its plan)")
    return get(target).plan(problem, PLAIN if epilogue is None else epilogue)


def all_variants(max_day: int | None = None) -> list[Variant]:
    """Every registered variant (up to ``max_day``), in curriculum order."""
    _load_days()
    vs = sorted(REGISTRY.values(), key=lambda v: (v.day, v.name))
    return [v for v in vs if max_day is None or v.day <= max_day]


