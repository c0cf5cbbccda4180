"""The one launch path: validate a call's tensors, build a `helpers.variants.Plan`'s kernels and
bind them to the tensors, then launch on torch's current stream, so kernels and torch ops stay
ordered: the legacy default stream (torch's default), or a stream of `helpers.gpu.stream` (e.g.
one capturing a CUDA graph).

`prepare` takes a plan (or a variant and a problem, and makes the plan), validates everything
once (the problem, the tensors and operands by name, aliasing, the device), compiles every launch
once (kept in the plan) and returns a `Prepared` run of it. With ``cache=True`` it keeps the plan
for the next call with the same variant, problem, epilogue and device, which then only checks its
tensors and binds their pointers. `run` prepares, poisons the output with NaN and launches once.

Each launch is one call of pycuda's ``Function._launch_kernel`` on a parameter buffer packed as
pycuda packs it (`param_buffer`), once per distinct set of tensor addresses (`Launcher`): a
training step, whose tensors come back at the same addresses step after step, pays for the
packing, and for encoding its tensor maps (`helpers.tma.encode`), on its first step only.
"""

from __future__ import annotations

import functools
import struct
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from . import compile as hc
from . import gpu
from .epilogue import OPERANDS, PLAIN, Epilogue, check_scalars, operand_shape
from .problem import Conv2dProblem
from .tma import TensorMap, kernel_args
from .tma import encode as encode_map
from .variants import Buffer, KernelLaunch, Plan, UnsupportedProblem, Variant, as_plan, get

# ---- validation ------------------------------------------------------------------------------


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


def check_operands(problem: Conv2dProblem, epilogue: Epilogue, operands: dict, ref: torch.Tensor) -> None:
    """Raise before any launch if the epilogue or its operands cannot be passed.

    Each given operand must be a contiguous tensor of `operand_shape`, ``ref``'s dtype and device;
    ``beta != 0`` needs ``cin``; alpha and beta go to the kernel as float32, so they must be
    finite there and a nonzero beta must not round to 0 (the kernel would skip Cin).

    Raises:
        TypeError: an operand that is not a tensor (`prepare` has checked that
            ``epilogue`` is an `Epilogue`).
        ValueError: wrong shape, dtype, layout or device; beta without cin; alpha/beta float32
            cannot carry.
    """
    for nm, t in operands.items():
        if t is None:
            continue
        shape = operand_shape(problem, nm)
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{nm} must be a torch.Tensor or None; got {type(t).__name__}")
        if t.dtype != ref.dtype or tuple(t.shape) != shape or not t.is_contiguous() or t.device != ref.device:
            raise ValueError(
                f"{nm} must be a contiguous {ref.dtype} tensor of shape {shape} on {ref.device}; "
                f"got {t.dtype} {tuple(t.shape)} on {t.device}{'' if t.is_contiguous() else ', not contiguous'}"
            )
    if epilogue.beta != 0 and operands.get("cin") is None:
        raise ValueError(f"epilogue beta = {epilogue.beta} needs cin (the tensor it scales)")
    check_scalars(epilogue)


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


def _check_call(plan: Plan, inputs: tuple, out, operands: dict) -> None:
    """The checks of one call's tensors, made on every call (cached plan or not), in order: the
    operands and epilogue the plan's variant takes; `check_tensors`; `check_operands`; aliasing
    of a given output; the variant's ``tensor_check_fn``. Raises what `prepare` documents."""
    v, problem, epilogue = plan.variant, plan.problem, plan.epilogue
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
    reason = plan.tensor_reason({**reads, problem.output: out})
    if reason:
        raise ValueError(f"{v.name}: {reason}")


def _check_stream(device: torch.device):
    """The pycuda stream to launch on: torch's current stream on ``device``, if it is the default
    stream (None) or one of `helpers.gpu.stream` (see `helpers.gpu.launch_stream`, which raises)."""
    return gpu.launch_stream(torch.cuda.current_stream(device).cuda_stream)


# Plans `prepare(..., cache=True)` made, by (id of the variant, problem, epilogue); the oldest is
# dropped past PLAN_CACHE_SIZE. Each keeps its kernels by device, arch and the
# `helpers.compile.source_hash` of every kernel file its launches use, so an edited kernel is built again.
PLAN_CACHE_SIZE = 4096
_plans: OrderedDict = OrderedDict()


def clear_plans() -> None:
    """Forget every plan `prepare(..., cache=True)` kept (e.g. after changing a module-level knob
    that a variant's launches read, such as ``days.day07_general.DW_MIN_GRID``)."""
    _plans.clear()


def _cached_plan(v: Variant, problem: Conv2dProblem, epilogue: Epilogue, config: object = None) -> Plan:
    """The plan `prepare(..., cache=True)` kept for (v, problem, epilogue[, a configuration the
    variant's review chose]), made now if none."""
    key = (id(v), problem, epilogue) if config is None else (id(v), problem, epilogue, "review", config)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = v.plan(problem, epilogue, config)
        while len(_plans) > PLAN_CACHE_SIZE:
            _plans.popitem(last=False)
    else:
        _plans.move_to_end(key)
    return plan


def sources_key(plan: Plan) -> tuple[str, ...]:
    """The `helpers.compile.source_hash` of each kernel file the plan's launches are built from
    (`helpers.variants.Plan.sources`, in order): what `compiled` keys the plan's kernels on, so an
    edit to any of them, or to a file one includes, builds them again."""
    return tuple(hc.source_hash(f) for f in plan.sources)


def compiled(plan: Plan, device: torch.device, arch: str) -> list[Launcher]:
    """The plan's kernels built for ``arch`` (`compile_launches`), kept in the plan by device,
    arch and the `helpers.compile.source_hash` of each kernel file its launches are built from
    (`helpers.variants.Plan.sources`, in order): an edit to any of them builds again.

    Raises:
        UnsupportedProblem: a build allows fewer threads per block than a launch has.
    """
    key = (device, arch, sources_key(plan))
    if key not in plan.compiled:
        plan.compiled[key] = compile_launches(plan.variant, list(plan.launches), arch)
    return plan.compiled[key]


@dataclass
class Prepared:
    """What `prepare` returns with the output: call it to launch every kernel once, in order, on
    the stream that was torch's current one when `prepare` ran (prepare again after changing it).

    ``plan`` is the `helpers.variants.Plan` it runs; ``kernels`` maps each launch's name to a
    closure that launches that kernel alone (call them in order: a later kernel reads what an
    earlier one wrote), so ``helpers.timing.time_gpu`` can time them apart; ``workspace`` is the
    uint8 scratch tensor they share (None if the variant needs none). It keeps every tensor it
    points to alive.
    """

    plan: Plan
    kernels: dict[str, Callable[[], None]]
    workspace: torch.Tensor | None = None
    tensors: dict = field(default_factory=dict, repr=False)

    def __call__(self) -> None:
        for f in self.kernels.values():
            f()


def compile_launches(v: Variant, launches: list[KernelLaunch], arch: str) -> list[Launcher]:
    """Build every launch's kernel of ``v`` for ``arch`` (cached), each from its kernel file
    (`helpers.variants.KernelLaunch.source`: the variant's unless the launch names one), as a
    `Launcher` each, in order; for a launch that passes a `helpers.tma.TensorMap`, with the
    driver's offset of each parameter (`helpers.tma.kernel_args` places the arguments there).

    Raises:
        UnsupportedProblem: a block larger than the compiled kernel allows.
    """
    out = []
    for k in launches:
        maps = any(isinstance(a, TensorMap) for a in k.args)
        kern = hc.load_kernel(k.source(v), k.entry, k.build_defines(v), dynamic_smem=k.config.shared_bytes,
                              arch=arch, params=len(k.args) if maps else 0)
        if k.config.threads_per_block > kern.max_threads_per_block:
            raise UnsupportedProblem(
                f"{v.name} ({k.name} kernel): block of {k.config.threads_per_block} threads, but this build "
                f"allows {kern.max_threads_per_block} (registers: {kern.num_regs})"
            )
        out.append(Launcher(k, kern.function, kern.param_offsets))
    return out


def param_buffer(args: tuple, offsets: tuple | None = None) -> bytes:
    """The parameter buffer of a launch on ``args``, byte for byte as pycuda's ``Function.__call__``
    packs it (``_build_arg_buf``): each numpy scalar in turn at its natural alignment (``struct``'s
    native packing of its dtype's character: pycuda's ``_pvt_struct`` is a copy of ``struct``),
    an ``np.void`` as its bytes, unaligned. With ``offsets`` (a launch that passes tensor maps),
    `helpers.tma.kernel_args` first places the arguments at the driver's offsets.

    Raises:
        TypeError: an argument that is not a numpy number or ``np.void`` (with ``offsets``, or a
            `helpers.tma.MapBytes`).
        ValueError: see `helpers.tma.kernel_args`.
    """
    if offsets is not None:
        args = kernel_args(args, offsets)
    fmt, values = "", []
    for i, a in enumerate(args):
        if isinstance(a, np.void):
            fmt, value = fmt + f"{a.itemsize}s", a.tobytes()
        elif isinstance(a, np.number):
            fmt, value = fmt + a.dtype.char, a
        else:
            raise TypeError(f"parameter {i}: kernel arguments are numpy scalars; got {type(a).__name__}")
        values.append(value)
    return struct.pack(fmt, *values)


BUFFERS_KEPT = 64  # parameter buffers a `Launcher` keeps; past that it forgets them all and packs again


@dataclass(eq=False)
class Launcher:
    """One launch of a plan with its built kernel (`compile_launches`): ``function`` is the pycuda
    ``Function``, ``offsets`` the driver's offset of each parameter for a launch that passes a
    tensor map (None otherwise).

    `bound` packs the launch's parameter buffer (`param_buffer`) for the addresses of the tensors
    it passes (`addresses`) and keeps it by them in ``buffers``, up to `BUFFERS_KEPT`: a training
    step passes the same few addresses step after step (torch's caching allocator), so each of its
    launches is packed once, and a launch is one call of pycuda's ``Function._launch_kernel``
    (where ``Function.__call__`` and ``prepared_call`` end: ``cuLaunchKernel`` on the buffer).
    """

    launch: KernelLaunch
    function: object
    offsets: tuple | None = None
    buffers: dict = field(default_factory=dict, repr=False)
    refs: tuple = field(init=False, repr=False)  # the `Buffer` and `helpers.tma.TensorMap` arguments, in order

    def __post_init__(self):
        self.refs = tuple(a for a in self.launch.args if isinstance(a, (Buffer, TensorMap)))

    def addresses(self, tensors: dict) -> tuple[int, ...]:
        """The address each `Buffer` and `helpers.tma.TensorMap` argument passes, in order: the
        named tensor's pointer plus the argument's ``offset`` (0 for an operand passed as None).
        Raises what `bind` documents."""
        k, out = self.launch, []
        for a in self.refs:
            if a.name not in tensors:
                raise ValueError(f"the {k.name} kernel ({k.entry}) passes {a.name!r}; this run has: "
                                 f"{', '.join(tensors)}")
            t = tensors[a.name]
            if a.offset and (t is None or not 0 <= a.offset < t.numel() * t.element_size()):
                raise ValueError(f"the {k.name} kernel ({k.entry}) passes {a.name!r} at byte {a.offset}, "
                                 "outside the tensor")
            if t is None and isinstance(a, TensorMap):
                raise ValueError(f"the {k.name} kernel ({k.entry}) maps {a.name!r}, which this run passes as None")
            out.append(0 if t is None else t.data_ptr() + a.offset)
        return tuple(out)

    def arguments(self, addresses: tuple) -> tuple:
        """The launch's arguments as pycuda takes them, at ``addresses`` (`addresses`): a buffer's
        pointer as ``np.uintp``, a map encoded at its address (`helpers.tma.encode`), the scalars
        as they are.

        Raises:
            ValueError, RuntimeError: a map the driver's limits or the driver refuse.
        """
        at = iter(addresses)
        return tuple(encode_map(a.desc, next(at)) if isinstance(a, TensorMap)
                     else np.uintp(next(at)) if isinstance(a, Buffer) else a for a in self.launch.args)

    def bound(self, addresses: tuple, stream=None) -> Callable[[], None]:
        """A closure launching this kernel once at ``addresses`` (`arguments`) on ``stream`` (a
        pycuda Stream; None: the default stream), with the launch's grid, block and dynamic
        shared memory."""
        buf = self.buffers.get(addresses)
        if buf is None:
            if len(self.buffers) >= BUFFERS_KEPT:
                self.buffers.clear()
            buf = self.buffers[addresses] = param_buffer(self.arguments(addresses), self.offsets)
        cfg = self.launch.config
        return functools.partial(self.function._launch_kernel, cfg.grid, cfg.block, buf, cfg.shared_bytes, stream)


def bind(compiled: list[Launcher], tensors: dict, stream=None) -> dict[str, Callable[[], None]]:
    """{launch name: closure launching it on ``stream``} (`Launcher.bound`; a pycuda Stream, None
    for the default stream): each `Buffer` argument becomes the
    named tensor's pointer plus its ``offset`` (0 for an operand passed as None), each
    `helpers.tma.TensorMap` the map encoded for the named tensor's address plus its ``offset``
    (`helpers.tma.encode`).

    Raises:
        ValueError: a launch names a buffer that is not among ``tensors`` (or is None, for a
            map), an offset outside the tensor's bytes, or a map the driver's limits refuse.
        RuntimeError: the driver refused to encode a map.
    """
    return {b.launch.name: b.bound(b.addresses(tensors), stream) for b in compiled}


def prepare(
    target: Plan | Variant | str,
    *args,
    out: torch.Tensor | None = None,
    epilogue: Epilogue | None = None,
    cache: bool = False,
    **operands: torch.Tensor | None,
) -> tuple[Prepared, torch.Tensor]:
    """Validate, compile and return ``(prepared, out)``: a `Prepared` run that launches once, and
    the output. Called as ``prepare(plan, *inputs)`` or ``prepare(variant, problem, *inputs)``.

    Args:
        target: a `helpers.variants.Plan` (its problem and epilogue are the call's), or a
            registered name or `helpers.variants.Variant`, followed by the problem (its ``op``
            names the tensors): the variant's plan for it is made here.
        args: (the problem, then) the op's two inputs in `Conv2dProblem.inputs` order (fprop:
            x, w), in the problem's layout and dtype, contiguous, on one CUDA device.
        out: the output (fprop: y), or None to allocate one (not poisoned: see `run`).
        epilogue: a fused `helpers.epilogue.Epilogue` (variants with ``fused_epilogue``); with a
            plan, its own (None, or the same).
        cache: with a variant: keep its plan for the next call with the same variant object,
            problem, epilogue and device, so that call only checks its tensors and binds their
            pointers (what a model's training step wants: the same layers every step): the
            plan's refusals and kernels are kept in it, and the kernels' parameter buffers by
            the tensors' addresses (`Launcher`). A module-level knob that a variant's launches
            read is read when the plan is first made: `clear_plans` forgets the plans.
        operands: the epilogue operands by name (``cin``, ``bias``; the variant's ``operands``);
            ``cin`` may be ``out`` itself (an in-place update).

    Everything that can be wrong is checked before any launch, and bad tensors and unsupported
    shapes before any GPU call, in this order: the shape (the plan's ``reason``), the tensors
    (`_check_call`, on every call), the variant's ``review_fn`` if it has one (which may answer
    with another configuration, whose plan is checked the same way), the launches' own limits,
    this GPU's limits and build target, the current stream; then the kernels are built (once
    per plan, GPU and version of their kernel files: `compiled`) and bound. On a kept plan every
    step is still taken in this order, the refusals and the build answered from the plan
    (`helpers.variants.Plan.refusal`, `compiled`); the tensors, the review and the stream are
    checked again on every call.

    Raises:
        TypeError, ValueError: see `check_tensors` and `check_operands`; ValueError also for
            operands or an epilogue the variant does not take, an output that overlaps an input
            or operand, tensors the variant's ``tensor_check_fn`` refuses (e.g. a misaligned
            pointer), and a plan given another epilogue.
        UnsupportedProblem: the variant does not handle ``problem``, or not on this GPU.
        RuntimeError: torch's current stream is neither the default stream nor one of
            `helpers.gpu.stream` (pycuda launches only on its own streams).
        NoGPUError: no GPU or no pycuda.
    """
    if epilogue is not None and not isinstance(epilogue, Epilogue):
        raise TypeError(f"epilogue must be a helpers.epilogue.Epilogue; got {type(epilogue).__name__}")
    if isinstance(target, Plan):
        plan, inputs = as_plan(target, epilogue=epilogue), args
    elif cache and args and isinstance(args[0], Conv2dProblem):
        plan, inputs = _cached_plan(get(target), args[0], PLAIN if epilogue is None else epilogue), args[1:]
    else:
        plan, inputs = as_plan(target, args[0] if args else None, epilogue), args[1:]
    bad = [nm for nm in operands if nm not in OPERANDS]
    if bad:
        raise TypeError(f"prepare got unknown operands {bad}; epilogue operands are: {', '.join(OPERANDS)}")
    problem, v = plan.problem, plan.variant
    if plan.reason:  # shape-level reasons first, before any GPU call
        raise UnsupportedProblem(plan.reason)
    _check_call(plan, tuple(inputs), out, operands)
    if v.review_fn is not None:  # e.g. the tuned variant checks a cached choice once (with a GPU)
        config = v.review_fn(problem, plan.config)
        if config is not plan.config and config != plan.config:
            plan = _cached_plan(v, problem, plan.epilogue, config) if cache else v.plan(problem, plan.epilogue, config)
            if plan.reason:
                raise UnsupportedProblem(plan.reason)
            _check_call(plan, tuple(inputs), out, operands)
    reason = plan.refusal(smem_limit=2**31)  # the launches' own limits, still before any GPU call
    if reason:
        raise UnsupportedProblem(reason)
    info = gpu.device_info()
    reason = plan.refusal(smem_limit=info.smem_per_block_optin, cc=info.cc)
    if reason:
        raise UnsupportedProblem(reason)
    device = inputs[0].device
    stream = _check_stream(device)
    kernels = compiled(plan, device, v.target(info.cc))
    if out is None:
        out = torch.empty(problem.tensor_shape(problem.output), dtype=problem.torch_dtype, device=device)
    nbytes = plan.workspace_bytes
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes > 0 else None
    tensors = {**dict(zip(problem.inputs, inputs)), problem.output: out, "workspace": workspace,
               **{nm: None for nm in v.operands}, **operands}
    return Prepared(plan, bind(kernels, tensors, stream), workspace, tensors), out


def run(
    target: Plan | Variant | str,
    *args,
    out: torch.Tensor | None = None,
    poison: bool = True,
    epilogue: Epilogue | None = None,
    **operands: torch.Tensor | None,
) -> torch.Tensor:
    """Run once on the op's inputs and return the output (fprop: y): ``run(plan, *inputs)`` or
    ``run(variant, problem, *inputs)`` (fprop inputs: x, w), as `prepare` takes them.

    The output (allocated if not given) is filled with NaN first when ``poison`` is set, so an
    element the kernel never writes shows up as NaN (not with an in-place ``cin``: that is the
    output's old value, whichever view of it is passed). Synchronises and raises on a kernel fault.

    Shapes: `Conv2dProblem.tensor_shape` of each (fprop: x ``x_shape``, w ``w_shape``, y ``y_shape``).

    Raises:
        see `prepare`; ``pycuda.driver.LaunchError`` / ``RuntimeError`` on a fault in the kernel.
    """
    prepared, out = prepare(target, *args, out=out, epilogue=epilogue, **operands)
    cin = operands.get("cin")
    in_place = cin is not None and _byte_range(cin) == _byte_range(out)  # any view of out's own memory
    if poison and not in_place:
        out.fill_(float("nan"))
    prepared()
    torch.cuda.synchronize()
    return out
