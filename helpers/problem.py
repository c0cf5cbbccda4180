"""`Conv2dProblem`: one convolution operation (fprop, dgrad or wgrad), its sizes, cost and GEMM view.

Names follow the field (cuDNN, CUTLASS, the implicit-GEMM papers):

* input  ``x``: N images of C channels, H rows, W columns;
* filter ``w``: K output channels, C/groups input channels, R rows, S columns;
* output ``y``: N images of K channels, P rows, Q columns, where
  ``P = (H + 2·pad_h − dil_h·(R−1) − 1) // stride_h + 1`` (Q likewise, with W, S).

The forward convolution is ``torch.nn.functional.conv2d`` (a cross-correlation: no filter flip).
A problem carries one of three operations (``OPS``) on these shapes:

* ``"fprop"``: y = conv(x, w), from inputs (x, w);
* ``"dgrad"``: dx = ∂L/∂x from (dy, w), the gradient of the loss L with respect to x given
  dy = ∂L/∂y (``torch.nn.grad.conv2d_input``); dx has x's shape;
* ``"wgrad"``: dw = ∂L/∂w from (x, dy) (``torch.nn.grad.conv2d_weight``); dw has w's shape.

Layout "NCHW" stores x/dx as (N, C, H, W), w/dw as (K, C/g, R, S), y/dy as (N, K, P, Q); "NHWC"
stores x/dx as (N, H, W, C), w/dw as (K, R, S, C/g) ("KRSC"), y/dy as (N, P, Q, K).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}
LAYOUTS = ("NCHW", "NHWC")
OPS = ("fprop", "dgrad", "wgrad")
_INPUTS = {"fprop": ("x", "w"), "dgrad": ("dy", "w"), "wgrad": ("x", "dy")}
_OUTPUT = {"fprop": "y", "dgrad": "dx", "wgrad": "dw"}
_SHAPE_OF = {"x": "x_shape", "dx": "x_shape", "w": "w_shape", "dw": "w_shape", "y": "y_shape", "dy": "y_shape"}
KINDS = ("normal", "int", "cancel")
# kind="int": the largest magnitude of each input, in `Conv2dProblem.inputs` order; inputs are
# drawn uniformly from the integers in [-m, m].
INT_MAX = {"fprop": (3, 2), "dgrad": (3, 2), "wgrad": (3, 1)}


def _int(v, what: str) -> int:
    """``v`` as a Python int: ints and numpy integers pass; bools, floats, strings and the rest raise."""
    if isinstance(v, (bool, np.bool_)):
        raise ValueError(f"{what} must be an int; got {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise ValueError(f"{what} must be an int; got {v!r}") from None


def _pair(v: int | tuple[int, int], what: str) -> tuple[int, int]:
    if isinstance(v, str) or not isinstance(v, Iterable) or getattr(v, "ndim", None) == 0:
        return (_int(v, what), _int(v, what))
    t = tuple(_int(a, what) for a in v)
    if len(t) != 2:
        raise ValueError(f"{what} must be an int or a pair (h, w); got {v!r}")
    return t  # type: ignore[return-value]


class GemmShape(NamedTuple):
    """The implicit-GEMM view of one operation (see `Conv2dProblem.gemm`).

    fprop: GEMM-M = N·P·Q, GEMM-N = K, GEMM-K = C/groups·R·S; dgrad: M = N·H·W, N = C,
    K = K/groups·R·S; wgrad: M = K, N = C/groups·R·S, K = N·P·Q.
    """

    m: int
    n: int
    k: int


@dataclass(frozen=True)
class Conv2dProblem:
    """One conv2d problem (an operation on one set of shapes), validated on construction.

    Args:
        N, C, H, W: batch, input channels, input rows, input columns.
        K, R, S: output channels, filter rows, filter columns.
        stride, padding, dilation: an int or a pair (h, w), as in ``torch.nn.functional.conv2d``.
            ``padding="same"`` means stride 1 and padding (dil_h·(R−1)/2, dil_w·(S−1)/2),
            which keeps P = H and Q = W, as torch's "same" does; refused where that padding is
            not a whole number (an even filter without even dilation), since torch then pads
            unevenly.
        groups: C and K must both be divisible by it (C = K = groups is depthwise).
        dtype: "fp32", "fp16", "bf16" or "fp64" (inputs and output).
        layout: "NCHW" or "NHWC" (see the module docstring).
        op: "fprop" (y from x, w), "dgrad" (dx from dy, w) or "wgrad" (dw from x, dy).
        name: a short label for tables; a generated one if empty.

    Raises:
        ValueError: a non-positive or non-integer size (bools, floats and strings are refused;
            numpy integers become ints), channels not divisible by groups, an unknown dtype,
            layout or op, or a (dilated) filter larger than the padded image (P or Q < 1).
    """

    N: int
    C: int
    H: int
    W: int
    K: int
    R: int
    S: int
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] | str = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    dtype: str = "fp32"
    layout: str = "NCHW"
    op: str = "fprop"
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for f in ("N", "C", "H", "W", "K", "R", "S", "groups"):
            v = getattr(self, f)
            try:
                iv = _int(v, f)
            except ValueError:
                iv = 0
            if iv < 1:
                raise ValueError(f"{f} must be a positive int; got {v!r}")
            set_(self, f, iv)  # numpy integers become Python ints
        if isinstance(self.padding, str) and self.padding != "same":
            raise ValueError(f"padding must be an int, a pair (h, w) or 'same'; got {self.padding!r}")
        if isinstance(self.padding, str):
            if _pair(self.stride, "stride") != (1, 1):
                raise ValueError("padding='same' needs stride 1")
            dh, dw = _pair(self.dilation, "dilation")
            span_h, span_w = dh * (self.R - 1), dw * (self.S - 1)
            if span_h % 2 or span_w % 2:
                raise ValueError(
                    f"padding='same' with a {self.R}x{self.S} filter (dilation {(dh, dw)}) needs uneven padding "
                    "(torch pads one more row/column after the image), which a (pad_h, pad_w) pair cannot "
                    "express: give padding explicitly"
                )
            set_(self, "padding", (span_h // 2, span_w // 2))
        set_(self, "stride", _pair(self.stride, "stride"))
        set_(self, "padding", _pair(self.padding, "padding"))  # type: ignore[arg-type]
        set_(self, "dilation", _pair(self.dilation, "dilation"))
        if min(self.stride) < 1 or min(self.dilation) < 1 or min(self.padding) < 0:
            raise ValueError(
                f"stride and dilation must be >= 1 and padding >= 0; got stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}"
            )
        if self.C % self.groups or self.K % self.groups:
            raise ValueError(f"C={self.C} and K={self.K} must both be divisible by groups={self.groups}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}; got {self.dtype!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}; got {self.layout!r}")
        if self.op not in OPS:
            raise ValueError(f"op must be one of {OPS}; got {self.op!r}")
        if self.P < 1 or self.Q < 1:
            rr = self.dilation[0] * (self.R - 1) + 1
            ss = self.dilation[1] * (self.S - 1) + 1
            raise ValueError(
                f"the (dilated) filter {rr}x{ss} is larger than the padded image "
                f"{self.H + 2 * self.padding[0]}x{self.W + 2 * self.padding[1]}: no output (P={self.P}, Q={self.Q})"
            )
        if not self.name:
            set_(self, "name", self.label())

    # ---- sizes -------------------------------------------------------------------------
    @property
    def P(self) -> int:  # noqa: N802 - the field's name for output rows
        """Output rows."""
        return (self.H + 2 * self.padding[0] - self.dilation[0] * (self.R - 1) - 1) // self.stride[0] + 1

    @property
    def Q(self) -> int:  # noqa: N802 - the field's name for output columns
        """Output columns."""
        return (self.W + 2 * self.padding[1] - self.dilation[1] * (self.S - 1) - 1) // self.stride[1] + 1

    @property
    def C_per_group(self) -> int:  # noqa: N802
        return self.C // self.groups

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.torch_dtype).element_size()

    @property
    def x_shape(self) -> tuple[int, int, int, int]:
        """Shape of the input tensor in this problem's layout."""
        return (self.N, self.C, self.H, self.W) if self.layout == "NCHW" else (self.N, self.H, self.W, self.C)

    @property
    def w_shape(self) -> tuple[int, int, int, int]:
        """Shape of the filter tensor: KCRS for NCHW, KRSC for NHWC."""
        c = self.C_per_group
        return (self.K, c, self.R, self.S) if self.layout == "NCHW" else (self.K, self.R, self.S, c)

    @property
    def y_shape(self) -> tuple[int, int, int, int]:
        """Shape of the output tensor in this problem's layout."""
        return (self.N, self.K, self.P, self.Q) if self.layout == "NCHW" else (self.N, self.P, self.Q, self.K)

    @property
    def x_numel(self) -> int:
        return math.prod(self.x_shape)

    @property
    def w_numel(self) -> int:
        return math.prod(self.w_shape)

    @property
    def y_numel(self) -> int:
        return math.prod(self.y_shape)

    # ---- the operation -----------------------------------------------------------------
    @property
    def inputs(self) -> tuple[str, str]:
        """Names of the operation's two inputs, in the order kernels and `make_inputs` take them.

        fprop ("x", "w"), dgrad ("dy", "w"), wgrad ("x", "dy").
        """
        return _INPUTS[self.op]

    @property
    def output(self) -> str:
        """Name of the operation's output: "y" (fprop), "dx" (dgrad) or "dw" (wgrad)."""
        return _OUTPUT[self.op]

    def tensor_shape(self, name: str) -> tuple[int, int, int, int]:
        """Shape of tensor ``name`` in this problem's layout, whatever the operation.

        "x" and "dx" have `x_shape`, "w" and "dw" `w_shape`, "y" and "dy" `y_shape`.

        Raises:
            ValueError: an unknown name (accepted: x, w, y, dx, dw, dy).
        """
        if name not in _SHAPE_OF:
            raise ValueError(f"no tensor {name!r} in a conv2d problem; known: {', '.join(_SHAPE_OF)}")
        return getattr(self, _SHAPE_OF[name])

    @property
    def input_shapes(self) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
        """Shapes of the two inputs (`inputs` order), in this problem's layout."""
        a, b = self.inputs
        return self.tensor_shape(a), self.tensor_shape(b)

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        """Shape of the output (`output`), in this problem's layout."""
        return self.tensor_shape(self.output)

    @property
    def reduction_length(self) -> int:
        """Terms of the dot product behind each output element (the n of the rounding bound).

        fprop: C/groups·R·S; dgrad: K/groups·R·S, an upper bound (with stride or at the image
        border fewer filter taps reach an input pixel); wgrad: N·P·Q. It equals `gemm`.k.
        """
        if self.op == "dgrad":
            return self.K // self.groups * self.R * self.S
        if self.op == "wgrad":
            return self.N * self.P * self.Q
        return self.C_per_group * self.R * self.S

    # ---- costs -------------------------------------------------------------------------
    @property
    def flops(self) -> int:
        """Floating-point operations of the direct convolution: 2·N·K·P·Q·(C/groups)·R·S.

        The same for all three operations: each multiplies every (x or dx, w or dw, y or dy)
        triple that the forward convolution pairs once.
        """
        return 2 * self.N * self.K * self.P * self.Q * self.C_per_group * self.R * self.S

    @property
    def min_bytes(self) -> int:
        """Fewest bytes a kernel must move through device memory: two inputs read once, output written once.

        For every operation these are x (or dx), w (or dw) and y (or dy): itemsize·(x + w + y elements).
        """
        return self.itemsize * (self.x_numel + self.w_numel + self.y_numel)

    @property
    def gemm(self) -> GemmShape:
        """Implicit-GEMM view of the operation (GEMM-N spans all groups, GEMM-K one group).

        * fprop: M = N·P·Q (output pixels), N = K, K = C/groups·R·S; y[m, n] = Σ_k x̂[m, k]·w[n, k];
        * dgrad: M = N·H·W (input pixels), N = C, K = K/groups·R·S; dx[m, n] = Σ_k dŷ[m, k]·w[k, n],
          where dŷ gathers, for each (k, r, s), the dy element whose filter tap lands on the pixel
          (zero where none does: with stride only some taps do);
        * wgrad: M = K, N = C/groups·R·S, K = N·P·Q; dw[m, n] = Σ_k dy[k, m]·x̂[k, n].
        """
        cg, kg = self.C_per_group, self.K // self.groups
        if self.op == "dgrad":
            return GemmShape(self.N * self.H * self.W, self.C, kg * self.R * self.S)
        if self.op == "wgrad":
            return GemmShape(self.K, cg * self.R * self.S, self.N * self.P * self.Q)
        return GemmShape(self.N * self.P * self.Q, self.K, cg * self.R * self.S)

    @property
    def is_same(self) -> bool:
        """Stride 1, dilation 1 and padding that keeps P = H, Q = W (odd filters)."""
        return (
            self.stride == (1, 1)
            and self.dilation == (1, 1)
            and self.R % 2 == 1
            and self.S % 2 == 1
            and self.padding == ((self.R - 1) // 2, (self.S - 1) // 2)
        )

    def label(self) -> str:
        """A compact, unique-enough description, e.g. ``N1 C3 64x64 K16 3x3 s1 p1``.

        fprop problems have no prefix (committed results use these labels); dgrad and wgrad
        problems start with the operation: ``dgrad N1 C3 64x64 K16 3x3 s1 p1``.
        """
        s = f"N{self.N} C{self.C} {self.H}x{self.W} K{self.K} {self.R}x{self.S}"
        sh, sw = self.stride
        ph, pw = self.padding
        dh, dw = self.dilation
        s += f" s{sh}" if sh == sw else f" s{sh},{sw}"
        s += f" p{ph}" if ph == pw else f" p{ph},{pw}"
        if (dh, dw) != (1, 1):
            s += f" d{dh}" if dh == dw else f" d{dh},{dw}"
        if self.groups != 1:
            s += f" g{self.groups}"
        return s if self.op == "fprop" else f"{self.op} {s}"

    def as_dict(self) -> dict:
        """Flat fields for a DataFrame row (problem columns of `helpers.bench`)."""
        return {
            "problem": self.name,
            "N": self.N, "C": self.C, "H": self.H, "W": self.W,
            "K": self.K, "R": self.R, "S": self.S, "P": self.P, "Q": self.Q,
            "stride_h": self.stride[0], "stride_w": self.stride[1],
            "pad_h": self.padding[0], "pad_w": self.padding[1],
            "dil_h": self.dilation[0], "dil_w": self.dilation[1],
            "groups": self.groups, "dtype": self.dtype, "layout": self.layout, "op": self.op,
            "gflop": self.flops / 1e9, "min_mb": self.min_bytes / 1e6,
        }

    # ---- inputs ------------------------------------------------------------------------
    @property
    def int_ranges(self) -> tuple[int, int]:
        """With ``kind="int"``: the largest magnitudes of the two inputs, `INT_MAX` while
        reduction length × their product stays ≤ 2^24, else (1, 1) (values in {-1, 0, 1}) for
        reductions of up to 2^24 terms: the exact run then still covers the longest reductions."""
        ma, mb = INT_MAX[self.op]
        return (ma, mb) if self.reduction_length * ma * mb <= 2**24 else (1, 1)

    @property
    def int_partial_sum_bound(self) -> int:
        """With ``kind="int"``: the largest magnitude any partial sum of the op's reduction can reach.

        `reduction_length` × the largest magnitudes of the two inputs (`int_ranges`): each term
        a_i·b_i is an integer of at most that product, so every partial sum, in any order, is an
        integer no larger than this. fp32 represents every integer up to 2^24 exactly, so while
        this stays ≤ 2^24 fp32 accumulation in any order is exact.
        """
        ma, mb = self.int_ranges
        return self.reduction_length * ma * mb

    def supports_kind(self, kind: str) -> str | None:
        """``None`` when `make_inputs` can build inputs of ``kind`` for this problem, else why not.

        * ``"int"`` needs `int_partial_sum_bound` ≤ 2^24 (with `int_ranges`): a reduction of at most
          2^24 terms; `INT_MAX`'s ranges up to 2,796,202 terms for fprop (C/groups·R·S) and
          dgrad (K/groups·R·S) and 5,592,405 for wgrad
          (N·P·Q);
        * ``"cancel"`` needs an even C/groups (fprop), an even K/groups (dgrad) or an even N
          (wgrad): the cancelling pairs.
        """
        if kind not in KINDS:
            return f"kind must be 'normal', 'int' or 'cancel'; got {kind!r}"
        if kind == "int" and self.int_partial_sum_bound > 2**24:
            a, b = self.inputs
            return (
                f"kind='int' is exact in fp32 only while reduction length × max|{a}| × max|{b}| <= 2^24, i.e. a "
                f"reduction length <= 2^24 with {a}, {b} in {{-1, 0, 1}}; {self.op} here reduces over "
                f"{self.reduction_length} terms"
            )
        if kind == "cancel":
            need = {"fprop": ("C/groups", self.C_per_group), "dgrad": ("K/groups", self.K // self.groups),
                    "wgrad": ("N", self.N)}[self.op]
            if need[1] % 2:
                return f"kind='cancel' for {self.op} needs an even {need[0]} (cancelling pairs); got {need[1]}"
        return None

    def make_inputs(
        self, device: str | torch.device = "cpu", kind: str = "normal", seed: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Seeded inputs of the operation, in `inputs` order, in this problem's layout and dtype, contiguous.

        fprop gives ``(x, w)``, dgrad ``(dy, w)``, wgrad ``(x, dy)``, with the shapes `input_shapes`,
        on ``device``. Values are drawn in float32, in logical NCHW/KCRS, first input first, then
        permuted to the layout and rounded once to the dtype.

        kinds:
          * ``"normal"``, scaled so that outputs stay O(1):
            fprop x ~ N(0, 1), w ~ N(0, 1)/sqrt(C/groups·R·S);
            dgrad dy ~ N(0, 1), w ~ N(0, 1)/sqrt(K/groups·R·S) (with stride s_h·s_w, a dx
            element sums about 1/(s_h·s_w) of those taps, so dx stays at or below O(1));
            wgrad x ~ N(0, 1), dy ~ N(0, 1)/sqrt(N·P·Q);
          * ``"int"``: small integers, uniform in [-m, m] with m from `int_ranges` (`INT_MAX`, or
            {-1, 0, 1} past its exactness limit): fprop x in
            [-3, 3], w in [-2, 2]; dgrad dy in [-3, 3], w in [-2, 2]; wgrad x in [-3, 3],
            dy in [-1, 1] (its reduction, N·P·Q, is the long one). Every product and partial sum
            is an integer of magnitude at most `int_partial_sum_bound` ≤ 2^24, so fp32
            accumulation in any order is exact and outputs must equal the reference bit for bit
            (after one rounding to the output dtype). Refused past that limit (`supports_kind`);
          * ``"cancel"``: normal values arranged so that every exact output is 0, while
            |a|·|b| terms are not: fprop: within each group the second half of the input
            channels repeats the first and the filter negates it (needs C/groups even); dgrad:
            within each group output channels k and k + K/groups/2 carry equal dy and negated w
            (needs K/groups even); wgrad: images n and n + N/2 carry equal x and negated dy
            (needs N even).

        fprop inputs are the same, bit for bit, as before the operations were added (same
        generator calls, same order). The values come from ``torch.Generator(device).manual_seed(seed)``:
        the same on every run of one device type (CPU and CUDA streams differ).

        Raises:
            ValueError: unknown kind, or a kind this problem cannot have (see `supports_kind`).
        """
        reason = self.supports_kind(kind)
        if reason:
            raise ValueError(reason)
        g = torch.Generator(device=device).manual_seed(seed)
        kw = {"generator": g, "device": device}
        nchw_x = (self.N, self.C, self.H, self.W)
        kcrs_w = (self.K, self.C_per_group, self.R, self.S)
        nkpq_y = (self.N, self.K, self.P, self.Q)
        shapes = {"x": nchw_x, "w": kcrs_w, "dy": nkpq_y}
        a_name, b_name = self.inputs
        if kind in ("normal", "cancel"):
            a = torch.randn(shapes[a_name], **kw)
            b = torch.randn(shapes[b_name], **kw) / math.sqrt(self.reduction_length)
        else:
            ma, mb = self.int_ranges
            a = torch.randint(-ma, ma + 1, shapes[a_name], **kw).float()
            b = torch.randint(-mb, mb + 1, shapes[b_name], **kw).float()
        if kind == "cancel":
            if self.op == "fprop":  # x channels c and c + C/g/2 equal, w negated
                cg = self.C_per_group
                xg = a.view(self.N, self.groups, cg, self.H, self.W)
                xg[:, :, cg // 2 :] = xg[:, :, : cg // 2]
                b[:, cg // 2 :] = -b[:, : cg // 2]
            elif self.op == "dgrad":  # dy channels k and k + K/g/2 equal, w negated
                kg = self.K // self.groups
                dyg = a.view(self.N, self.groups, kg, self.P, self.Q)
                dyg[:, :, kg // 2 :] = dyg[:, :, : kg // 2]
                wg = b.view(self.groups, kg, self.C_per_group, self.R, self.S)
                wg[:, kg // 2 :] = -wg[:, : kg // 2]
            else:  # wgrad: images n and n + N/2 with x equal, dy negated
                h = self.N // 2
                a[h:] = a[:h]
                b[h:] = -b[:h]
        a, b = self.from_logical(a), self.from_logical(b)
        return a.to(self.torch_dtype).contiguous(), b.to(self.torch_dtype).contiguous()

    def from_logical(self, t: torch.Tensor) -> torch.Tensor:
        """A logical NCHW (x, y, dx, dy) or KCRS (w, dw) tensor in this problem's layout, contiguous.

        NHWC stores activations as (N, H, W, C) and filters as KRSC: both are the permutation
        (0, 2, 3, 1) of the logical tensor. A no-op for NCHW.
        """
        return t.permute(0, 2, 3, 1).contiguous() if self.layout == "NHWC" else t

    def to_logical(self, t: torch.Tensor) -> torch.Tensor:
        """View any of the six tensors (x, w, y, dx, dw, dy) of this layout as logical NCHW/KCRS.

        The inverse of `from_logical`: a permuted view for NHWC (no copy), ``t`` itself for NCHW.
        """
        return t.permute(0, 3, 1, 2) if self.layout == "NHWC" else t

    def to_layout(self, x_nchw: torch.Tensor, w_kcrs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Permute NCHW/KCRS tensors into this problem's layout (a no-op for NCHW)."""
        if self.layout == "NHWC":
            return x_nchw.permute(0, 2, 3, 1).contiguous(), w_kcrs.permute(0, 2, 3, 1).contiguous()
        return x_nchw, w_kcrs

    def to_nchw(self, t: torch.Tensor) -> torch.Tensor:
        """View an x or y tensor of this layout as logical NCHW (a permuted view for NHWC)."""
        return t.permute(0, 3, 1, 2) if self.layout == "NHWC" else t

    def w_to_kcrs(self, w: torch.Tensor) -> torch.Tensor:
        """View a filter of this layout as logical KCRS."""
        return w.permute(0, 3, 1, 2) if self.layout == "NHWC" else w

    def torch_kwargs(self) -> dict:
        """Keyword arguments for ``torch.nn.functional.conv2d``."""
        return {"stride": self.stride, "padding": self.padding, "dilation": self.dilation, "groups": self.groups}
