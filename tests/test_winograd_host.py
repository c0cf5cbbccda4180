"""The Winograd kernels of days 20 and 21 from their own source, run on the CPU (tests/hostrun.py:
the .cu compiled as C++ with std::threads for the GPU threads, a barrier for __syncthreads and the
C library's fmaf).

Not a model of the kernels but their code: day 21's fused kernels (21_winograd_fused.cu) write every
output (y and the workspace start NaN), stay within `winograd_model`, agree with `simulate_fused`
to rounding, give a batch's images bit for bit as alone, and equal day 20's pipeline
(20_winograd.cu, run the same way) bit for bit: the same transforms and the same fmaf chain over
the channels. A planted fault (the main grid one block short) is seen. Skipped without g++.
"""

from __future__ import annotations

import dataclasses

import hostrun
import numpy as np
import pytest
import torch

from days import day20_winograd as w20
from days import day21_winograd_fused as w21
from helpers.problem import Conv2dProblem
from helpers.reference import compare

pytestmark = pytest.mark.skipif(not hostrun.host_available(), reason="g++ is not on PATH")

LAYOUTS = ("NCHW", "NHWC")
# (N, C, H, W, K, padding): several tile and filter blocks, C past BC and not a multiple, K past BK.
SHAPES = [(2, 11, 13, 10, 37, 1), (1, 9, 6, 5, 40, (2, 0)), (3, 5, 9, 7, 6, 0)]


def problem(spec, layout: str) -> Conv2dProblem:
    n, c, h, w, k, pad = spec
    return Conv2dProblem(N=n, C=c, H=h, W=w, K=k, R=3, S=3, padding=pad, layout=layout)


@pytest.fixture(scope="module")
def exes():
    """The drivers of both files for F(2) and F(4), with every entry of both layouts."""
    out = {}
    for m in (2, 4):
        for kind, v in (("fused", w21.WINOGRAD_FUSED[m]), ("pipeline", w20.WINOGRAD[m])):
            entries = {k.entry for lay in LAYOUTS for k in v.plan(problem(SHAPES[0], lay)).launches}
            out[kind, m] = hostrun.build(v.cu_file, v.defines, entries)
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("spec", SHAPES, ids=str)
def test_the_fused_kernels_source_on_the_cpu(spec, m, layout, exes):
    p = problem(spec, layout)
    x, w = p.make_inputs(seed=7)
    y = hostrun.run_plan(w21.WINOGRAD_FUSED[m].plan(p), x.numpy(), w.numpy(), exes["fused", m])
    assert not np.isnan(y).any()
    r = compare(p, x, w, torch.from_numpy(y), model=w20.winograd_model(m))
    assert r["nonfinite"] == 0 and r["worst_err_over_bound"] <= 1, r
    sim = w21.simulate_fused(p, x.numpy(), w.numpy(), m, np.float32)
    np.testing.assert_allclose(y, sim, rtol=0, atol=1e-5 * max(1.0, float(np.abs(sim).max())))
    pipe = hostrun.run_plan(w20.WINOGRAD[m].plan(p), x.numpy(), w.numpy(), exes["pipeline", m])
    assert np.array_equal(y, pipe), float(np.abs(y - pipe).max())


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [2, 4])
def test_a_batch_is_its_images_alone_bit_for_bit(m, layout, exes):
    p = problem(SHAPES[2], layout)
    x, w = p.make_inputs(seed=5)
    v = w21.WINOGRAD_FUSED[m]
    y = hostrun.run_plan(v.plan(p), x.numpy(), w.numpy(), exes["fused", m])
    p1 = dataclasses.replace(p, N=1, name="")
    for n in range(p.N):
        y1 = hostrun.run_plan(v.plan(p1), x[n:n + 1].numpy(), w.numpy(), exes["fused", m])
        assert np.array_equal(y[n:n + 1], y1), n


def test_a_grid_one_block_short_is_seen(exes):
    p = problem(SHAPES[0], "NHWC")
    x, w = p.make_inputs(seed=7)
    v = w21.WINOGRAD_FUSED[4]
    short = v.with_output_launch(lambda c: dataclasses.replace(c, grid=(c.grid[0] - 1, 1, 1)), "short_grid")
    y = hostrun.run_plan(short.plan(p), x.numpy(), w.numpy(), exes["fused", 4])
    assert np.isnan(y).any()
