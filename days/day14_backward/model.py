"""Day 14's mappings simulated in Python: dgrad's filter phases and wgrad's split-K (the kernels follow them).

dgrad computes dx = ∂L/∂x from dy and w (`helpers.problem`, op ``"dgrad"``). Per filter axis,
with stride s, padding pad and dilation d, an input row h of dx collects

    dx[h] = Σ_r  dy[(h + pad − r·d) / s] · w[r]     over the taps r whose (h + pad − r·d) is a
                                                    multiple of s and whose quotient is a row of dy.

With s = 1 every tap qualifies: dgrad is an fprop over dy with the filter turned around. With
s > 1 a naive implicit GEMM would walk all R taps for every h and multiply zeros for the taps
that fail the divisibility test (the zeros a stride inserts into dy). Split dx by **filter
phase** instead: the rows h ≡ φ (mod s) all keep the same taps T_φ = {r : (φ + pad − r·d) ≡ 0
(mod s)}, and for h = φ + s·i the dy row is i + o_r with o_r = (φ + pad − r·d) / s. Each phase
is then a unit-stride convolution of dy with a sub-filter of |T_φ| taps at offsets o_r, writing
every s-th row of dx; each tap belongs to exactly one phase, so the phases together do exactly
the useful multiplications, and a phase with no tap (stride larger than the dilated filter)
writes zeros.

`axis_phases` computes the phases of one axis and `dgrad_phases` those of both;
`dgrad_by_phases` composes dx from them in float64 (the model the kernel will follow, checked
in tests/test_backward.py against the harness's reference, `torch.ops.aten.convolution_backward`);
`dgrad_mac_counts` counts the multiplications of the naive walk and of the phase split.

wgrad computes dw from x and dy: a GEMM with M = K, N = C·R·S and GEMM-K = N·P·Q, the longest
reduction of the three operations (800,000 terms for a ResNet-50 layer at N = 256). **Split-K**
cuts GEMM-K into slices that separate blocks reduce, each into an fp32 partial; *serial* split-K
adds the partials into the output in slice order (blocks wait on a semaphore: deterministic),
*parallel* split-K writes them to an fp32 workspace that a second kernel sums and converts to the
output dtype. `split_k_slices` cuts GEMM-K into whole BK steps; `wgrad_split_k` computes dw from
fp32 partials summed in slice order, the arithmetic both kernels will do.

Sources: NVIDIA CUTLASS, ``docs/implicit_gemm_convolution.md`` (dgrad as an implicit GEMM; the
strided dgrad iterators) and ``docs/efficient_gemm.md`` (parallelized reductions: split-K,
serial and parallel).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from helpers.problem import Conv2dProblem


class AxisPhase(NamedTuple):
    """One filter phase of one axis: the dx rows ``phase + stride·i`` (i < ``rows``) and the taps
    that reach them, each with its dy offset (dy row = i + offset)."""

    phase: int
    rows: int
    taps: tuple[int, ...]
    offsets: tuple[int, ...]


def axis_phases(out_len: int, in_len: int, taps: int, stride: int, pad: int, dil: int) -> list[AxisPhase]:
    """The ``stride`` phases of one axis of dgrad.

    Args:
        out_len: dx's length on this axis (H or W: the forward input, not derived from dy, since
            with a stride several input sizes give the same dy).
        in_len: dy's length on this axis (P or Q).
        taps, stride, pad, dil: the filter length (R or S), stride, padding and dilation.

    Returns:
        One `AxisPhase` per φ in 0 .. stride − 1 (phases past ``out_len`` have ``rows`` = 0).
        A tap r is in phase φ when (φ + pad − r·dil) is a multiple of ``stride``; its offset is that
        quotient. Whether dy row i + offset exists (0 <= it < ``in_len``) is a bounds test per row,
        as padding is in fprop.
    """
    if stride < 1 or dil < 1 or taps < 1 or out_len < 1 or in_len < 1 or pad < 0:
        raise ValueError(f"bad axis: out_len {out_len}, in_len {in_len}, taps {taps}, stride {stride}, "
                         f"pad {pad}, dil {dil}")
    phases = []
    for phi in range(stride):
        rows = max(0, -(-(out_len - phi) // stride))
        sel = [r for r in range(taps) if (phi + pad - r * dil) % stride == 0]
        phases.append(AxisPhase(phi, rows, tuple(sel), tuple((phi + pad - r * dil) // stride for r in sel)))
    return phases


def dgrad_phases(p: Conv2dProblem) -> tuple[list[AxisPhase], list[AxisPhase]]:
    """The `axis_phases` of a dgrad problem's rows (H from P, R) and columns (W from Q, S).

    Raises:
        ValueError: not a dgrad problem, or groups != 1.
    """
    if p.op != "dgrad":
        raise ValueError(f"dgrad phases need a dgrad problem; got op {p.op!r}")
    if p.groups != 1:
        raise ValueError(f"groups = {p.groups}: the phase model covers groups = 1")
    return (
        axis_phases(p.H, p.P, p.R, p.stride[0], p.padding[0], p.dilation[0]),
        axis_phases(p.W, p.Q, p.S, p.stride[1], p.padding[1], p.dilation[1]),
    )


def dgrad_by_phases(p: Conv2dProblem, dy: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """dx from the filter phases, in float64: the simulation of a phase-split dgrad kernel.

    Args:
        p: a dgrad problem, groups = 1.
        dy: (N, K, P, Q) logical NCHW, any float dtype and device.
        w: (K, C, R, S) logical KCRS.

    Returns:
        dx, (N, C, H, W) float64: for each phase pair (φh, φw) a unit-stride correlation of dy
        with the taps of that phase, written to rows φh + sh·i and columns φw + sw·j; positions no
        tap reaches stay exactly 0.

    Raises:
        ValueError: not a dgrad problem, groups != 1, or tensors of the wrong shape.
    """
    ph_h, ph_w = dgrad_phases(p)
    if tuple(dy.shape) != (p.N, p.K, p.P, p.Q) or tuple(w.shape) != (p.K, p.C, p.R, p.S):
        raise ValueError(f"dy {tuple(dy.shape)} / w {tuple(w.shape)}: expected ({p.N}, {p.K}, {p.P}, {p.Q}) / "
                         f"({p.K}, {p.C}, {p.R}, {p.S})")
    dy64, w64 = dy.double(), w.double()
    dx = torch.zeros((p.N, p.C, p.H, p.W), dtype=torch.float64, device=dy.device)
    sh, sw = p.stride
    for a in ph_h:
        for b in ph_w:
            if not a.rows or not b.rows:
                continue
            acc = torch.zeros((p.N, p.C, a.rows, b.rows), dtype=torch.float64, device=dy.device)
            for r, orow in zip(a.taps, a.offsets):
                i0, i1 = max(0, -orow), min(a.rows, p.P - orow)  # dy row i + orow inside dy
                if i0 >= i1:
                    continue
                for s, ocol in zip(b.taps, b.offsets):
                    j0, j1 = max(0, -ocol), min(b.rows, p.Q - ocol)
                    if j0 >= j1:
                        continue
                    src = dy64[:, :, i0 + orow : i1 + orow, j0 + ocol : j1 + ocol]  # (N, K, i, j)
                    acc[:, :, i0:i1, j0:j1] += torch.einsum("nkij,kc->ncij", src, w64[:, :, r, s])
            dx[:, :, a.phase :: sh, b.phase :: sw] = acc
    return dx


def dgrad_mac_counts(p: Conv2dProblem) -> dict[str, int]:
    """Multiply-adds of dgrad's GEMM view: ``naive`` walks all R·S taps for every dx element
    (N·C·H·W·K·R·S, the implicit GEMM M = N·H·W, N = C, K = K·R·S); ``phases`` walks each dx
    element's phase taps only, dy row bounds included; ``useful`` is the same count restricted
    to taps whose dy element exists (what any correct kernel must do)."""
    ph_h, ph_w = dgrad_phases(p)
    phases = useful = 0
    for a in ph_h:
        for b in ph_w:
            phases += a.rows * b.rows * len(a.taps) * len(b.taps)
            rows_in = sum(sum(0 <= i + o < p.P for i in range(a.rows)) for o in a.offsets)
            cols_in = sum(sum(0 <= j + o < p.Q for j in range(b.rows)) for o in b.offsets)
            useful += rows_in * cols_in
    per_pair = p.N * p.C * p.K
    return {"naive": per_pair * p.H * p.W * p.R * p.S, "phases": per_pair * phases, "useful": per_pair * useful}


def split_k_slices(length: int, splits: int, bk: int = 32) -> list[tuple[int, int]]:
    """Cut a GEMM-K of ``length`` into at most ``splits`` slices [k0, k1) of whole ``bk`` steps.

    Every slice but the last is a multiple of ``bk`` long (a block walks whole steps); the slices
    are as equal as whole steps allow, none is empty, and together they cover 0 .. length once.
    Fewer than ``splits`` slices come back when GEMM-K has fewer steps than that.

    Raises:
        ValueError: ``length``, ``splits`` or ``bk`` below 1.
    """
    if length < 1 or splits < 1 or bk < 1:
        raise ValueError(f"split_k_slices: length {length}, splits {splits}, bk {bk} must all be >= 1")
    steps = -(-length // bk)
    n = min(splits, steps)
    bounds = [bk * (steps * i // n) for i in range(n)] + [length]
    return list(zip(bounds[:-1], bounds[1:]))


def wgrad_split_k(p: Conv2dProblem, x: torch.Tensor, dy: torch.Tensor, splits: int, bk: int = 32) -> torch.Tensor:
    """dw by split-K in fp32: the simulation of a split-K wgrad kernel (groups = 1).

    GEMM-K index m = (n·P + p)·Q + q walks the images' output pixels. Slice i of `split_k_slices`
    computes its partial dw[K][C·R·S] = dy[:, slice] · A[slice, :] in fp32, where A is x lowered to
    (N·P·Q) x (C·R·S) (`torch.nn.functional.unfold`); the partials are added in slice order in
    fp32, as serial split-K adds them into the output and as the parallel reduction sums them.

    Args:
        p: a wgrad problem, groups = 1.
        x: (N, C, H, W) logical NCHW; dy: (N, K, P, Q). Any float dtype; computed in fp32.
        splits, bk: as in `split_k_slices`.

    Returns:
        dw, (K, C, R, S) float32.

    Raises:
        ValueError: not a wgrad problem, groups != 1, or tensors of the wrong shape.
    """
    if p.op != "wgrad" or p.groups != 1:
        raise ValueError(f"wgrad_split_k needs a wgrad problem with groups = 1; got op {p.op!r}, groups {p.groups}")
    if tuple(x.shape) != (p.N, p.C, p.H, p.W) or tuple(dy.shape) != (p.N, p.K, p.P, p.Q):
        raise ValueError(f"x {tuple(x.shape)} / dy {tuple(dy.shape)}: expected ({p.N}, {p.C}, {p.H}, {p.W}) / "
                         f"({p.N}, {p.K}, {p.P}, {p.Q})")
    a = F.unfold(x.float(), (p.R, p.S), dilation=p.dilation, padding=p.padding, stride=p.stride)  # (N, CRS, PQ)
    a = a.permute(0, 2, 1).reshape(p.N * p.P * p.Q, p.C * p.R * p.S)  # GEMM-K rows m = (n, p, q)
    b = dy.float().permute(1, 0, 2, 3).reshape(p.K, p.N * p.P * p.Q)  # (K, GEMM-K)
    dw = torch.zeros((p.K, p.C * p.R * p.S), dtype=torch.float32, device=x.device)
    for k0, k1 in split_k_slices(p.N * p.P * p.Q, splits, bk):
        dw += b[:, k0:k1] @ a[k0:k1]  # one slice's fp32 partial, added in slice order
    return dw.reshape(p.K, p.C, p.R, p.S)
