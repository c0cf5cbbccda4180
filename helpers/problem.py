"""`Conv2dProblem`: one forward convolution (fprop), its output size, cost and GEMM view.

Names follow the field (cuDNN, CUTLASS, the implicit-GEMM papers):

* input  ``x``: N images of C channels, H rows, W columns;
* filter ``w``: K output channels, C/groups input channels, R rows, S columns;
* output ``y``: N images of K channels, P rows, Q columns, where
  ``P = (H + 2·pad_h − dil_h·(R−1) − 1) // stride_h + 1`` (Q likewise, with W, S).

This is ``torch.nn.functional.conv2d`` (a cross-correlation: no filter flip). Layout "NCHW"
stores x as (N, C, H, W), w as (K, C/g, R, S), y as (N, K, P, Q); "NHWC" stores x as
(N, H, W, C), w as (K, R, S, C/g) ("KRSC"), y as (N, P, Q, K).
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
    """The implicit-GEMM view of fprop: GEMM-M = N·P·Q, GEMM-N = K, GEMM-K = C/groups·R·S."""

    m: int
    n: int
    k: int


@dataclass(frozen=True)
class Conv2dProblem:
    """One conv2d forward problem, validated on construction.

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
        name: a short label for tables; a generated one if empty.

    Raises:
        ValueError: a non-positive or non-integer size (bools, floats and strings are refused;
            numpy integers become ints), channels not divisible by groups, an unknown dtype
            or layout, or a (dilated) filter larger than the padded image (P or Q < 1).
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
    def inputs(self) -> tuple[str, str]:
        """The op's inputs: fprop (x, w), dgrad (dy, w), wgrad (x, dy)."""
        return {"fprop": ("x", "w"), "dgrad": ("dy", "w"), "wgrad": ("x", "dy")}[self.op]

    @property
    def output(self) -> str:
        """The op's output: fprop y, dgrad dx, wgrad dw."""
        return {"fprop": "y", "dgrad": "dx", "wgrad": "dw"}[self.op]

    def tensor_shape(self, name: str) -> tuple[int, int, int, int]:
        """Shape of tensor ``name`` in this layout: x/dx `x_shape`, w/dw `w_shape`, y/dy `y_shape`."""
        shapes = {"x": self.x_shape, "dx": self.x_shape, "w": self.w_shape, "dw": self.w_shape,
                  "y": self.y_shape, "dy": self.y_shape}  # fmt: skip
        if name not in shapes:
            raise ValueError(f"no tensor {name!r}; known: {', '.join(shapes)}")
        return shapes[name]

    @property
    def x_numel(self) -> int:
        return math.prod(self.x_shape)

    @property
    def w_numel(self) -> int:
        return math.prod(self.w_shape)

    @property
    def y_numel(self) -> int:
        return math.prod(self.y_shape)

    @property
    def flops(self) -> int:
        """Floating-point operations of the direct convolution: 2·N·K·P·Q·(C/groups)·R·S."""
        return 2 * self.N * self.K * self.P * self.Q * self.C_per_group * self.R * self.S

    @property
    def min_bytes(self) -> int:
        """Fewest bytes a kernel must move through device memory: x and w read once, y written once."""
        return self.itemsize * (self.x_numel + self.w_numel + self.y_numel)

    @property
    def gemm(self) -> GemmShape:
        """Implicit-GEMM view: M = N·P·Q, N = K, K = C/groups·R·S (per group)."""
        return GemmShape(self.N * self.P * self.Q, self.K, self.C_per_group * self.R * self.S)

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
        """A compact, unique-enough description, e.g. ``N1 C3 64x64 K16 3x3 s1 p1``."""
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
        return s

    def as_dict(self) -> dict:
        """Flat fields for a DataFrame row (problem columns of `helpers.bench`)."""
        return {
            "problem": self.name,
            "N": self.N, "C": self.C, "H": self.H, "W": self.W,
            "K": self.K, "R": self.R, "S": self.S, "P": self.P, "Q": self.Q,
            "stride_h": self.stride[0], "stride_w": self.stride[1],
            "pad_h": self.padding[0], "pad_w": self.padding[1],
            "dil_h": self.dilation[0], "dil_w": self.dilation[1],
            "groups": self.groups, "dtype": self.dtype, "layout": self.layout,
            "gflop": self.flops / 1e9, "min_mb": self.min_bytes / 1e6,
        }  # fmt: skip

    # ---- inputs ------------------------------------------------------------------------
    def make_inputs(
        self, device: str | torch.device = "cpu", kind: str = "normal", seed: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Seeded inputs ``(x, w)`` in this problem's layout and dtype, contiguous, on ``device``.

        kinds:
          * ``"normal"``: x ~ N(0, 1), w ~ N(0, 1)/sqrt(C/groups·R·S), so outputs stay O(1);
          * ``"int"``: small integers, x in [-3, 3], w in [-2, 2]. Every product and partial sum
            is an integer below 2^24 while C/groups·R·S < 2^21, so fp32 accumulation in any
            order is exact and outputs must equal the reference bit for bit;
          * ``"cancel"``: normal values, but within each group the second half of the input
            channels repeats the first and the filter negates it, so every exact output is 0
            (needs C/groups even).

        The values come from ``torch.Generator(device).manual_seed(seed)``: the same on every run
        of one device type (CPU and CUDA streams differ).

        Raises:
            ValueError: unknown kind, or "cancel" with an odd C/groups.
        """
        g = torch.Generator(device=device).manual_seed(seed)
        nchw_x = (self.N, self.C, self.H, self.W)
        kcrs_w = (self.K, self.C_per_group, self.R, self.S)
        kw = {"generator": g, "device": device}
        if kind in ("normal", "cancel"):
            x = torch.randn(nchw_x, **kw)
            w = torch.randn(kcrs_w, **kw) / math.sqrt(self.gemm.k)
        elif kind == "int":
            x = torch.randint(-3, 4, nchw_x, **kw).float()
            w = torch.randint(-2, 3, kcrs_w, **kw).float()
        else:
            raise ValueError(f"kind must be 'normal', 'int' or 'cancel'; got {kind!r}")
        if kind == "cancel":
            cg = self.C_per_group
            if cg % 2:
                raise ValueError(f"kind='cancel' needs an even C/groups; got {cg}")
            xg = x.view(self.N, self.groups, cg, self.H, self.W)
            xg[:, :, cg // 2 :] = xg[:, :, : cg // 2]
            w[:, cg // 2 :] = -w[:, : cg // 2]
        x, w = self.to_layout(x, w)
        return x.to(self.torch_dtype).contiguous(), w.to(self.torch_dtype).contiguous()

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
