"""The named problem suites: sizes, the edge categories (`helpers.suites`), dtype/layout conversion."""

from __future__ import annotations

from dataclasses import replace

import pytest

from helpers import suites
from helpers.problem import Conv2dProblem
from helpers.suites import SUITES, is_big, suite


@pytest.mark.parametrize("name", sorted(SUITES))
def test_every_suite_is_nonempty_fixed_and_named(name: str):
    a, b = suite(name), suite(name)
    assert a and a == b  # fixed, not sampled
    assert all(isinstance(p, Conv2dProblem) and p.name for p in a)
    assert all(p.dtype == "fp32" and p.layout == "NCHW" for p in a)


def test_resnet50():
    probs = suite("resnet50")
    assert len(probs) == 19 * 2
    assert sorted({p.N for p in probs}) == [32, 256]
    for n in (32, 256):
        layers = [p for p in probs if p.N == n]
        assert len(layers) == 19 and len({(p.C, p.H, p.K, p.R, p.stride) for p in layers}) == 19
    f = probs[0]
    assert (f.N, f.C, f.H, f.K, f.R, f.padding, f.stride) == (32, 64, 56, 256, 1, (0, 0), (1, 1))
    assert {p.R for p in probs} == {1, 3} and {p.stride for p in probs} == {(1, 1), (2, 2)}
    assert all(p.padding == ((p.R - 1) // 2,) * 2 for p in probs)


def test_depthwise():
    probs = suite("depthwise")
    assert len(probs) == 8
    assert all(p.C == p.K == p.groups and p.N == 32 and (p.R, p.S) == (3, 3) and p.padding == (1, 1) for p in probs)
    assert [(p.C, p.H, p.stride[0]) for p in probs] == [
        (32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (384, 14, 1), (576, 14, 1), (960, 7, 1),
    ]


def test_quick_is_small_and_same():
    probs = suite("quick")
    assert all(p.is_same for p in probs)
    assert sum(p.flops for p in probs) < 5e9
    assert any(p.N > 1 for p in probs)


def test_seed_is_single_image_same_fp32():
    probs = suite("seed")
    assert all(p.N == 1 and p.is_same and p.R == p.S for p in probs)
    assert {p.R for p in probs} == {1, 3, 5, 9}
    assert min(p.C for p in probs) == 1 and max(p.C for p in probs) == 512
    assert min(p.H for p in probs) == 64 and max(p.H for p in probs) == 1024


# The edge suite's categories (helpers.suites): each must have at least one problem.
EDGE_CATEGORIES = {
    "H != W": lambda p: p.H != p.W,
    "sizes dividing no tile (37x53)": lambda p: (p.H, p.W) == (37, 53),
    "image smaller than the filter": lambda p: p.H < p.R or p.W < p.S,
    "R != S": lambda p: p.R != p.S,
    "even filter": lambda p: p.R % 2 == 0 or p.S % 2 == 0,
    "stride_h != stride_w": lambda p: p.stride[0] != p.stride[1],
    "pad_h != pad_w": lambda p: p.padding[0] != p.padding[1],
    "pad >= R/2": lambda p: p.padding[0] >= p.R / 2 and p.padding[0] > (p.R - 1) // 2,
    "stride > R": lambda p: p.stride[0] > p.R,
    "(H + 2pad - R) % stride != 0": lambda p: (p.H + 2 * p.padding[0] - p.R) % p.stride[0] != 0,
    "dilation": lambda p: p.dilation != (1, 1),
    "groups": lambda p: p.groups > 1,
    "C = 1": lambda p: p.C == 1,
    "C = 3": lambda p: p.C == 3,
    "C = 45": lambda p: p.C == 45,
    "K not a multiple of 8": lambda p: p.K % 8 != 0 and p.K > 8,
    "N > 1": lambda p: p.N > 1,
    ">= 2^31 elements": is_big,
    "N*K > 65535 (grid z)": lambda p: p.N * p.K > 65535,
    "P > 65535*8 (grid y)": lambda p: p.P > 65535 * 8,
}


@pytest.mark.parametrize("category", list(EDGE_CATEGORIES))
def test_edge_covers_category(category: str):
    assert any(EDGE_CATEGORIES[category](p) for p in suite("edge")), f"no edge problem for {category!r}"


def test_edge_has_a_cancellable_problem_and_one_big():
    probs = suite("edge")
    assert any(p.C_per_group % 2 == 0 for p in probs)  # kind="cancel" needs an even C/groups
    assert sum(is_big(p) for p in probs) == 1
    big = next(p for p in probs if is_big(p))
    assert big.x_numel >= 2**31 and big.y_numel >= 2**31


def test_is_big_threshold():
    assert suites.BIG_ELEMENTS == 2**31
    assert not is_big(Conv2dProblem(N=1, C=1, H=4, W=4, K=1, R=1, S=1))
    assert is_big(Conv2dProblem(N=2, C=1, H=2**15, W=2**15, K=1, R=1, S=1))  # x has exactly 2^31
    assert is_big(Conv2dProblem(N=1, C=1, H=2**15, W=2**15, K=2, R=1, S=1))  # y has 2^31


@pytest.mark.parametrize("dtype, layout", [("fp16", None), (None, "NHWC"), ("bf16", "NHWC")])
def test_suite_conversion(dtype, layout):
    base = suite("edge")
    conv = suite("edge", dtype=dtype, layout=layout)
    assert len(conv) == len(base)
    for a, b in zip(base, conv):
        assert b.dtype == (dtype or "fp32") and b.layout == (layout or "NCHW")
        assert (a.N, a.C, a.H, a.W, a.K, a.R, a.S, a.stride, a.padding, a.dilation, a.groups) == (
            b.N, b.C, b.H, b.W, b.K, b.R, b.S, b.stride, b.padding, b.dilation, b.groups,
        )
        assert (a.P, a.Q) == (b.P, b.Q)
        if layout == "NHWC":
            assert b.x_shape == (a.N, a.H, a.W, a.C)


@pytest.mark.parametrize("op", ["dgrad", "wgrad", "fprop"])
def test_suite_op_conversion(op: str):
    base = suite("resnet50")
    conv = suite("resnet50", op=op)
    assert len(conv) == len(base)
    for a, b in zip(base, conv):
        assert b.op == op and (b.dtype, b.layout) == (a.dtype, a.layout)
        assert replace(b, op="fprop") == a  # the same shapes, only the operation differs
        assert b.name == (a.name if op == "fprop" else f"{op} {a.name}")
    both = suite("depthwise", dtype="fp16", layout="NHWC", op="dgrad")
    assert all((p.dtype, p.layout, p.op) == ("fp16", "NHWC", "dgrad") for p in both)
    assert all(p.op == "fprop" for p in suite("edge"))  # default: fprop, names as committed


def test_suite_unknown_op():
    with pytest.raises(ValueError, match="op must be one of"):
        suite("quick", op="bgrad")


def test_unknown_suite():
    with pytest.raises(KeyError, match="known: .*quick"):
        suite("tiny")
