"""Day 14's kernels in a model: a `torch.autograd.Function` whose forward is day 13's
``igemm_production`` and whose backward is day 14's ``dgrad`` and ``wgrad``, and a small ResNet
bottleneck block built on it, trained side by side with the same block on torch's (cuDNN's)
convolutions.

Tensors are torch's usual logical NCHW / KCRS tensors in ``channels_last`` memory (so their
dense NHWC / KRSC storage is exactly what the kernels read, with no copy); fp16 or bf16 on a
CUDA device. `conv2d` is the function a model calls; `Stem`, `Bottleneck`, `make_pair` and
`train_steps` are the example of day 14's notebook.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from helpers import gpu
from helpers.launch import check_tensors, prepare
from helpers.problem import Conv2dProblem
from helpers.variants import Variant, get

DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class Pick:
    """The variant one call runs (`Kernels.pick`) and why each one preferred to it did not run."""

    variant: Variant
    refused: tuple[tuple[str, str], ...] = ()  # (name, reason), in order of preference

    def __str__(self) -> str:
        why = "".join(f"; not {name}: {reason}" for name, reason in self.refused)
        return self.variant.name + why


OPS = ("fprop", "dgrad", "wgrad")


@dataclass(frozen=True)
class Kernels:
    """The variants `conv2d` runs for each operation: a registered name or a
    `helpers.variants.Variant`, or a tuple of them in order of preference, of which the first that
    runs on the GPU and supports the layer runs (`pick`). The default is day 14's kernels; a later
    day names its own first and day 14's after them (day 19's ``HOPPER_KERNELS``).

    Raises:
        TypeError: a field that is not a name, a Variant or a non-empty tuple (or list) of them.
    """

    fprop: object = "igemm_production"
    dgrad: object = "dgrad"
    wgrad: object = "wgrad"

    def __post_init__(self):
        for op in OPS:
            named = getattr(self, op)
            named = tuple(named) if isinstance(named, (tuple, list)) else (named,)
            if not named or not all(isinstance(c, (str, Variant)) for c in named):
                raise TypeError(f"Kernels.{op}: a variant name or Variant, or a non-empty tuple of them; "
                                f"got {getattr(self, op)!r}")
            object.__setattr__(self, op, named if len(named) > 1 else named[0])

    def choices(self, op: str) -> list[Variant]:
        """The variants for ``op`` ("fprop", "dgrad" or "wgrad"), in order of preference.

        Raises:
            ValueError: another op; a variant that computes another operation than ``op``.
            KeyError: an unknown variant name.
        """
        if op not in OPS:
            raise ValueError(f"Kernels has variants for {', '.join(OPS)}; got {op!r}")
        named = getattr(self, op)
        out = [get(c) if isinstance(c, str) else c for c in (named if isinstance(named, tuple) else (named,))]
        wrong = [v.name for v in out if v.op != op]
        if wrong:
            raise ValueError(f"Kernels.{op} names {', '.join(wrong)}, which compute another operation")
        return out

    def pick(self, p: Conv2dProblem, cc: tuple[int, int], smem_limit: int | None = None) -> Pick:
        """The first variant for ``p.op`` that builds for compute capability ``cc`` and supports
        ``p`` within ``smem_limit`` bytes of shared memory per block (None: what
        `helpers.variants.Variant.supports` assumes: the GPU's opt-in limit where one is present,
        else 48 KB), with the reasons of those before it.

        Raises:
            ValueError: none of them runs ``p`` (every reason listed); see `choices`.
        """
        refused = []
        for v in self.choices(p.op):
            why = v.supports(p, smem_limit=smem_limit, cc=cc)
            if why is None:
                return Pick(v, tuple(refused))
            refused.append((v.name, why))
        raise ValueError(f"no kernel runs {p.name}: " + "; ".join(f"{n}: {w}" for n, w in refused))


# The kernel each layer's operation ran last, and why the ones preferred to it did not: (op,
# problem name) -> Pick, written by every call (`paths`).
_PATHS: dict[tuple[str, str], Pick] = {}


def paths(clear: bool = False) -> dict[tuple[str, str], Pick]:
    """(operation, problem name) -> the `Pick` of its last call: which kernel ran and why the
    preferred ones did not (a copy); ``clear`` forgets them afterwards (e.g. between kernel sets)."""
    out = dict(_PATHS)
    if clear:
        _PATHS.clear()
    return out


# The picks so far: a training step asks for the same ones every step. (id of the Kernels, problem,
# cc, shared-memory limit) -> (that Kernels, its Pick): kept with the object, whose id is then not
# reused while it is kept; the least recently used is dropped past PICKS_KEPT.
PICKS_KEPT = 4096
_PICKS: OrderedDict[tuple, tuple[Kernels, Pick]] = OrderedDict()


def _pick(kernels: Kernels, p: Conv2dProblem, cc: tuple[int, int], smem_limit: int) -> Pick:
    """`Kernels.pick`, cached by the identity of ``kernels`` (a frozen object; a Variant in it
    holds dicts, so it is not hashable), at most `PICKS_KEPT` of them."""
    key = (id(kernels), p, cc, smem_limit)
    hit = _PICKS.get(key)
    if hit is None:
        hit = _PICKS[key] = (kernels, kernels.pick(p, cc, smem_limit))
        while len(_PICKS) > PICKS_KEPT:
            _PICKS.popitem(last=False)
    else:
        _PICKS.move_to_end(key)
    return hit[1]


def _problem(x: torch.Tensor, w: torch.Tensor, stride, padding, dilation, op: str) -> Conv2dProblem:
    if x.dtype not in DTYPES or w.dtype != x.dtype:
        raise TypeError(f"conv2d takes fp16 or bf16 x and w of one dtype; got {x.dtype} and {w.dtype}")
    if x.dim() != 4 or w.dim() != 4:
        raise ValueError(f"conv2d takes 4-D x (N, C, H, W) and w (K, C, R, S); got {tuple(x.shape)}, {tuple(w.shape)}")
    if w.shape[1] != x.shape[1]:
        raise ValueError(f"w has {w.shape[1]} input channels, x has {x.shape[1]}: groups = 1 only")
    conv = [tuple(a) if isinstance(a, list) else a for a in (stride, padding, dilation)]  # hashable
    return _problem_of(tuple(x.shape), tuple(w.shape), *conv, DTYPES[x.dtype], op)


@functools.lru_cache(maxsize=1024)
def _problem_of(x_shape, w_shape, stride, padding, dilation, dtype: str, op: str) -> Conv2dProblem:
    """The problem of one call, made once per layer (a training step asks for the same ones every step)."""
    (n, c, h, wd), (k, _, r, s) = x_shape, w_shape
    return Conv2dProblem(N=n, C=c, H=h, W=wd, K=k, R=r, S=s, stride=stride, padding=padding, dilation=dilation,
                         dtype=dtype, layout="NHWC", op=op)


def _launch(kernels: Kernels, p: Conv2dProblem, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One run of the variant ``kernels`` picks for ``p`` on this GPU (`Kernels.pick`, recorded for
    `paths`) on the logical tensors a, b; the output as a logical channels_last view. No
    synchronisation: the kernels queue on the default stream behind and before torch's ops. The
    pick and the plan are cached: from the second call of a layer on, only the tensors are checked."""
    with gpu.thread_context():  # autograd calls backward on a thread of its own
        inputs = (p.from_logical(a), p.from_logical(b))
        if not (a.is_cuda and b.is_cuda):  # a tensor off the GPU is named before any pick (prepare checks the rest)
            check_tensors(p, inputs)
        info = gpu.device_info()
        pick = _pick(kernels, p, tuple(info.cc), info.smem_per_block_optin)
        plan, out = prepare(pick.variant, p, *inputs, cache=True)
        _PATHS[(p.op, p.name)] = pick
        plan()
    return p.to_logical(out)


class Conv2dFunction(torch.autograd.Function):
    """y = conv2d(x, w) forward with ``kernels.fprop``; dx with ``kernels.dgrad`` and dw with
    ``kernels.wgrad`` backward, each only when autograd asks for it.

    Differentiable once: the backward's kernels write fresh tensors that carry no graph, so it is
    marked ``once_differentiable`` and a second derivative through it (``create_graph=True``,
    e.g. a gradient penalty) raises torch's RuntimeError instead of silently dropping terms.

    Shapes: x (N, C, H, W), w (K, C, R, S), y (N, K, P, Q), logical, channels_last memory
    (a contiguous NCHW tensor is accepted too: it is copied into NHWC). Raises what
    `helpers.launch.prepare` raises (unsupported problem, wrong device, misalignment), before
    any launch.
    """

    @staticmethod
    def forward(ctx, x, w, stride, padding, dilation, kernels: Kernels):  # noqa: D417 - see the class
        p = _problem(x, w, stride, padding, dilation, "fprop")
        ctx.save_for_backward(x, w)
        ctx.conv = (stride, padding, dilation, kernels)
        return _launch(kernels, p, x, w)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        stride, padding, dilation, kernels = ctx.conv
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = _launch(kernels, _problem(x, w, stride, padding, dilation, "dgrad"), dy, w)
        if ctx.needs_input_grad[1]:
            dw = _launch(kernels, _problem(x, w, stride, padding, dilation, "wgrad"), x, dy)
        return dx, dw, None, None, None, None


def conv2d(x: torch.Tensor, w: torch.Tensor, stride=1, padding=0, dilation=1, kernels: Kernels = Kernels()):
    """``torch.nn.functional.conv2d(x, w, stride=..., padding=..., dilation=...)`` (groups 1, no bias)
    on this series' kernels, differentiable in x and w (see `Conv2dFunction`)."""
    return Conv2dFunction.apply(x, w, stride, padding, dilation, kernels)


def _filter(k: int, c: int, r: int) -> nn.Parameter:
    """A (K, C, R, R) filter with He initialisation (std sqrt(2 / (C R R)))."""
    return nn.Parameter(torch.randn(k, c, r, r) * (2.0 / (c * r * r)) ** 0.5)


class _OnKernels(nn.Module):
    """A module whose convolutions run on this series' kernels (``ours``, with ``self.kernels``, a
    `Kernels`) or on ``torch.nn.functional.conv2d`` (cuDNN)."""

    def __init__(self, ours: bool, kernels: Kernels = Kernels()):
        super().__init__()
        self.ours, self.kernels = ours, kernels

    def conv(self, x, w, stride=1, padding=0):
        if self.ours:
            return conv2d(x, w, stride, padding, kernels=self.kernels)
        return F.conv2d(x, w, stride=stride, padding=padding)


class Stem(_OnKernels):
    """3x3 convolution (C_img -> C, stride 1, padding 1), batch norm, ReLU. It puts a convolution in
    front of the first bottleneck block, so that block's input needs a gradient and its strided
    1x1 convolutions run dgrad (the network's input itself needs none)."""

    def __init__(self, c_img: int, c: int, ours: bool = True, kernels: Kernels = Kernels()):
        super().__init__(ours, kernels)
        self.w, self.bn = _filter(c, c_img, 3), nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x, self.w, 1, 1)))


class Bottleneck(_OnKernels):
    """A ResNet-50 bottleneck block, channels_last: 1x1 (C -> M), 3x3 (M -> M, stride), 1x1 (M -> 4M),
    each followed by batch norm, ReLU after the first two and after the residual sum; the residual
    is x itself or, with a stride or a change of width, a strided 1x1 + batch norm (ResNet-50 v1,
    stride on the first 1x1 as in this series' ResNet-50 suite). Convolutions without bias, on
    this series' kernels or torch's (see `_OnKernels`).
    """

    def __init__(self, c_in: int, mid: int, stride: int = 1, ours: bool = True, kernels: Kernels = Kernels()):
        super().__init__(ours, kernels)
        out = 4 * mid
        self.w1, self.w2, self.w3 = _filter(mid, c_in, 1), _filter(mid, mid, 3), _filter(out, mid, 1)
        self.bn1, self.bn2, self.bn3 = nn.BatchNorm2d(mid), nn.BatchNorm2d(mid), nn.BatchNorm2d(out)
        self.down = _filter(out, c_in, 1) if stride != 1 or c_in != out else None
        self.bn_down = nn.BatchNorm2d(out) if self.down is not None else None
        self.stride = stride

    def forward(self, x):
        y = F.relu(self.bn1(self.conv(x, self.w1, self.stride)))
        y = F.relu(self.bn2(self.conv(y, self.w2, 1, 1)))
        y = self.bn3(self.conv(y, self.w3))
        skip = x if self.down is None else self.bn_down(self.conv(x, self.down, self.stride))
        return F.relu(y + skip)


def make_pair(c_img: int, c_in: int, mid: int, stride: int, dtype=torch.float16,
              seed: int = 0, kernels: Kernels = Kernels()) -> tuple[nn.Module, nn.Module]:
    """Two identical networks in channels_last ``dtype`` on the GPU, one on this series' kernels
    (``kernels``: day 14's by default) and one on torch's: a `Stem` (C_img -> C_in), two bottleneck
    blocks (the first with ``stride``, C_in -> 4 mid), a global average pool and a linear
    classifier of 10 classes. Input: (N, C_img, H, W), C_img a multiple of 8 (wgrad's and fprop's
    alignment)."""
    nets = []
    for ours in (True, False):
        torch.manual_seed(seed)
        net = nn.Sequential(Stem(c_img, c_in, ours, kernels), Bottleneck(c_in, mid, stride, ours, kernels),
                            Bottleneck(4 * mid, mid, 1, ours, kernels), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                            nn.Linear(4 * mid, 10))
        nets.append(net.to(device="cuda", dtype=dtype, memory_format=torch.channels_last))
    return nets[0], nets[1]


def train_steps(net: nn.Module, x: torch.Tensor, labels: torch.Tensor, steps: int, lr: float = 0.05) -> dict:
    """``steps`` of plain SGD on one batch (cross-entropy loss, computed in fp32).

    Returns:
        {"loss": [loss per step, before its update], "grads": {parameter name: its gradient at
        step 0 (a detached copy)}}.
    """
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    losses, first = [], {}
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x).float(), labels)
        loss.backward()
        if step == 0:
            first = {n: p.grad.detach().clone() for n, p in net.named_parameters() if p.grad is not None}
        losses.append(float(loss.detach()))
        opt.step()
    return {"loss": losses, "grads": first}
