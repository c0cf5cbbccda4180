"""`Conv2dProblem` agrees with torch on output shapes, costs, layouts, inputs and refusals."""

from __future__ import annotations

import math
import random
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers.problem import Conv2dProblem


def random_args(rng: random.Random) -> dict:
    """Small random conv2d parameters, sometimes invalid (groups, filter size, 'same' + stride)."""
    g = rng.choice([1, 1, 1, 2, 3, 4])
    a = dict(
        N=rng.randint(1, 3),
        C=g * rng.randint(1, 3) + rng.choice([0, 0, 0, 0, 1]),  # sometimes not divisible by groups
        H=rng.randint(1, 12),
        W=rng.randint(1, 12),
        K=g * rng.randint(1, 3) + rng.choice([0, 0, 0, 0, 1]),
        R=rng.randint(1, 6),
        S=rng.randint(1, 6),
        groups=g,
    )
    a["stride"] = rng.choice([1, 2, 3, (1, 2), (3, 1)])
    a["dilation"] = rng.choice([1, 1, 2, (1, 3), (2, 1)])
    if rng.random() < 0.15:
        a["padding"] = "same"
        a["R"] |= 1  # torch's "same" for odd filters is ours; even filters differ (see below)
        a["S"] |= 1
    else:
        a["padding"] = rng.choice([0, 1, 2, (0, 1), (3, 0), (1, 4)])
    return a


def torch_output_shape(a: dict) -> tuple[int, ...] | Exception:
    """Shape of ``F.conv2d`` on zero tensors of these parameters, or the exception torch raised."""
    x = torch.zeros(a["N"], a["C"], a["H"], a["W"])
    cg = max(1, a["C"] // a["groups"])
    w = torch.zeros(a["K"], cg, a["R"], a["S"])
    try:
        return tuple(
            F.conv2d(x, w, stride=a["stride"], padding=a["padding"], dilation=a["dilation"], groups=a["groups"]).shape
        )
    except (RuntimeError, ValueError) as e:
        return e


@pytest.mark.parametrize("seed", range(6))
def test_output_shapes_match_torch(seed: int):
    rng = random.Random(seed)
    n_valid = n_invalid = 0
    for _ in range(50):
        a = random_args(rng)
        want = torch_output_shape(a)
        if isinstance(want, Exception):
            with pytest.raises(ValueError):
                Conv2dProblem(**a)
            n_invalid += 1
            continue
        p = Conv2dProblem(**a)  # torch accepts it, so must we
        assert (p.N, p.K, p.P, p.Q) == want, f"{a}: ours {p.y_shape}, torch {want}"
        assert p.y_shape == want
        n_valid += 1
    assert n_valid >= 10 and n_invalid >= 3, (n_valid, n_invalid)  # the generator covers both sides


def test_same_padding():
    p = Conv2dProblem(N=1, C=2, H=9, W=7, K=3, R=5, S=3, padding="same")
    assert p.padding == (2, 1) and (p.P, p.Q) == (9, 7) and p.is_same
    # with dilation: torch's "same" pads dil*(R-1)/2 and keeps the size
    p = Conv2dProblem(N=1, C=2, H=9, W=7, K=3, R=3, S=3, padding="same", dilation=(2, 3))
    assert p.padding == (2, 3) and (p.P, p.Q) == (9, 7)
    assert not p.is_same  # is_same means dilation 1 (what days 01-02 take)
    # even filters: torch pads "same" unevenly, which a (pad_h, pad_w) pair cannot say: refused
    with pytest.raises(ValueError, match="uneven padding"):
        Conv2dProblem(N=1, C=2, H=9, W=7, K=3, R=4, S=2, padding="same")
    # ... unless the dilation makes the span even
    p = Conv2dProblem(N=1, C=2, H=9, W=7, K=3, R=4, S=3, padding="same", dilation=(2, 1))
    assert p.padding == (3, 1) and (p.P, p.Q) == (9, 7)


def test_costs_on_a_hand_computed_example():
    # N=2, C=6, H=10, W=8, K=4, R=3, S=5, stride (2, 1), padding (1, 2), dilation 1, groups 2
    p = Conv2dProblem(N=2, C=6, H=10, W=8, K=4, R=3, S=5, stride=(2, 1), padding=(1, 2), groups=2)
    assert (p.P, p.Q) == ((10 + 2 - 2 - 1) // 2 + 1, (8 + 4 - 4 - 1) // 1 + 1) == (5, 8)
    assert p.C_per_group == 3
    assert p.flops == 2 * 2 * 4 * 5 * 8 * 3 * 3 * 5 == 28800
    x, w, y = 2 * 6 * 10 * 8, 4 * 3 * 3 * 5, 2 * 4 * 5 * 8
    assert (p.x_numel, p.w_numel, p.y_numel) == (x, w, y) == (960, 180, 320)
    assert p.min_bytes == 4 * (960 + 180 + 320)
    assert p.gemm == (2 * 5 * 8, 4, 3 * 3 * 5) == (80, 4, 45)
    assert Conv2dProblem(**{**_base(), "dtype": "fp16"}).itemsize == 2
    assert Conv2dProblem(**{**_base(), "dtype": "fp64"}).min_bytes == 2 * Conv2dProblem(**_base()).min_bytes


def _base() -> dict:
    return dict(N=2, C=4, H=5, W=6, K=3, R=3, S=3, padding=1)


def test_layout_shapes():
    nchw = Conv2dProblem(N=2, C=6, H=5, W=7, K=4, R=3, S=1, groups=2)
    nhwc = Conv2dProblem(N=2, C=6, H=5, W=7, K=4, R=3, S=1, groups=2, layout="NHWC")
    assert nchw.x_shape == (2, 6, 5, 7) and nhwc.x_shape == (2, 5, 7, 6)
    assert nchw.w_shape == (4, 3, 3, 1) and nhwc.w_shape == (4, 3, 1, 3)
    assert nchw.y_shape == (2, 4, 3, 7) and nhwc.y_shape == (2, 3, 7, 4)
    assert nchw == Conv2dProblem(N=2, C=6, H=5, W=7, K=4, R=3, S=1, groups=2, name="other")  # name not compared


def test_layout_inputs_are_the_same_values():
    nchw = Conv2dProblem(**_base())
    nhwc = Conv2dProblem(**_base(), layout="NHWC")
    x1, w1 = nchw.make_inputs(seed=3)
    x2, w2 = nhwc.make_inputs(seed=3)
    assert tuple(x2.shape) == nhwc.x_shape and tuple(w2.shape) == nhwc.w_shape
    assert x2.is_contiguous() and w2.is_contiguous()
    assert torch.equal(nhwc.to_nchw(x2), x1) and torch.equal(nhwc.w_to_kcrs(w2), w1)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16", "fp64"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_make_inputs_shape_dtype(dtype: str, layout: str):
    p = Conv2dProblem(**_base(), dtype=dtype, layout=layout)
    x, w = p.make_inputs()
    assert tuple(x.shape) == p.x_shape and tuple(w.shape) == p.w_shape
    assert x.dtype == w.dtype == p.torch_dtype
    assert x.is_contiguous() and w.is_contiguous()


def test_make_inputs_seeded():
    p = Conv2dProblem(**_base())
    a, b, c = p.make_inputs(seed=1), p.make_inputs(seed=1), p.make_inputs(seed=2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_make_inputs_normal_scale():
    p = Conv2dProblem(N=4, C=16, H=16, W=16, K=16, R=3, S=3, padding=1)
    x, w = p.make_inputs()
    assert abs(float(x.std()) - 1) < 0.05
    assert abs(float(w.std()) * math.sqrt(p.gemm.k) - 1) < 0.15  # w ~ N(0, 1/(C·R·S))


def test_make_inputs_int():
    p = Conv2dProblem(N=2, C=6, H=9, W=9, K=6, R=3, S=3, padding=1, groups=3)
    x, w = p.make_inputs(kind="int")
    assert x.dtype == torch.float32
    assert torch.equal(x, x.round()) and torch.equal(w, w.round())
    assert int(x.min()) == -3 and int(x.max()) == 3  # 972 draws: every value of [-3, 3] shows up
    assert int(w.min()) == -2 and int(w.max()) == 2
    y = F.conv2d(x.double(), w.double(), **p.torch_kwargs())
    assert torch.equal(y, y.round())


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("groups", [1, 2])
def test_make_inputs_cancel(layout: str, groups: int):
    p = Conv2dProblem(N=2, C=8, H=7, W=6, K=4, R=3, S=3, padding=1, groups=groups, layout=layout)
    x, w = p.make_inputs(kind="cancel")
    assert float(x.abs().max()) > 0.5 and float(w.abs().max()) > 0.05  # real values, not zeros
    y = F.conv2d(p.to_nchw(x).double(), p.w_to_kcrs(w).double(), **p.torch_kwargs())
    assert float(y.abs().max()) <= 1e-12
    assert float(F.conv2d(p.to_nchw(x).abs().double(), p.w_to_kcrs(w).abs().double(), **p.torch_kwargs()).max()) > 1


def test_make_inputs_refusals():
    p = Conv2dProblem(N=1, C=3, H=5, W=5, K=2, R=3, S=3)
    with pytest.raises(ValueError, match="even C/groups"):
        p.make_inputs(kind="cancel")
    with pytest.raises(ValueError, match="kind must be"):
        p.make_inputs(kind="uniform")


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(N=0), "N must be a positive int"),
        (dict(C=0), "C must be a positive int"),
        (dict(H=0), "H must be a positive int"),
        (dict(W=-1), "W must be a positive int"),
        (dict(K=0), "K must be a positive int"),
        (dict(R=0), "R must be a positive int"),
        (dict(S=0), "S must be a positive int"),
        (dict(groups=0), "groups must be a positive int"),
        (dict(C=2.0), "C must be a positive int"),
        (dict(C=6, groups=4), "divisible by groups"),
        (dict(K=5, groups=2), "divisible by groups"),
        (dict(dtype="fp8"), "dtype must be one of"),
        (dict(layout="NCWH"), "layout must be one of"),
        (dict(op="backward"), r"op must be one of \('fprop', 'dgrad', 'wgrad'\)"),
        (dict(op=None), "op must be one of"),
        (dict(padding="same", stride=2), "padding='same' needs stride 1"),
        (dict(H=3, R=5, padding=0), "larger than the padded image"),
        (dict(W=4, S=3, dilation=(1, 2), padding=0), "larger than the padded image"),
        (dict(stride=0), "stride and dilation must be >= 1"),
        (dict(padding=-1), "padding >= 0"),
        (dict(stride=(1, 2, 3)), "must be an int or a pair"),
    ],
)
def test_bad_fields_raise(change: dict, match: str):
    args = dict(N=1, C=4, H=8, W=8, K=4, R=3, S=3, padding=1, groups=2)
    args.update(change)
    with pytest.raises(ValueError, match=match):
        Conv2dProblem(**args)


def test_label_and_as_dict():
    p = Conv2dProblem(N=2, C=6, H=10, W=8, K=4, R=3, S=5, stride=(2, 1), padding=(1, 2), dilation=2, groups=2)
    assert p.name == p.label() == "N2 C6 10x8 K4 3x5 s2,1 p1,2 d2 g2"
    d = p.as_dict()
    assert (d["P"], d["Q"], d["stride_h"], d["pad_w"], d["dil_h"], d["groups"]) == (p.P, p.Q, 2, 2, 2, 2)
    assert d["gflop"] == pytest.approx(p.flops / 1e9)
    assert d["op"] == "fprop"
    w = replace(p, op="wgrad", name="")
    assert w.name == "wgrad N2 C6 10x8 K4 3x5 s2,1 p1,2 d2 g2" and w.as_dict()["op"] == "wgrad"


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(stride=True), "stride must be an int; got True"),
        (dict(padding=(True, 1)), "padding must be an int; got True"),
        (dict(padding=(1.5, 1)), "padding must be an int; got 1.5"),
        (dict(stride="12"), "stride must be an int; got '12'"),
        (dict(padding="valid"), "padding must be an int, a pair"),
        (dict(dilation=None), "dilation must be an int; got None"),
    ],
)
def test_odd_pair_values_raise_instead_of_being_coerced(change: dict, match: str):
    # bools, floats and strings were silently coerced: stride="12" became (1, 2), (1.5, 1) became (1, 1)
    args = dict(N=1, C=4, H=8, W=8, K=4, R=3, S=3, padding=1)
    args.update(change)
    with pytest.raises(ValueError, match=re.escape(match)):
        Conv2dProblem(**args)


def test_numpy_integers_are_accepted_as_ints():
    p = Conv2dProblem(N=np.int64(2), C=np.int32(4), H=8, W=8, K=4, R=3, S=3, stride=np.int64(2),
                      padding=np.array([1, 1]), dilation=(np.int64(1), 1))
    assert p == Conv2dProblem(N=2, C=4, H=8, W=8, K=4, R=3, S=3, stride=2, padding=1)
    assert type(p.N) is int and all(type(v) is int for v in p.stride + p.padding + p.dilation)
