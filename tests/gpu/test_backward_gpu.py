"""Day 14 on a real GPU: dgrad and wgrad against the float64 reference on the shapes that break
backward kernels, dgrad's in-place B on every optimized tile (unit and strided entries),
split-K's determinism (serial and parallel bitwise equal, every split factor), NaN-poisoned
workspaces, and planted faults that the checks must catch.

The generic tests (tests/gpu/test_correctness.py) also run both operations over the edge, quick
and depthwise suites; these add what is particular to the backward pass.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from days.day13_igemm_production import ProductionConfig, TileDescription, choose_swizzle
from days.day14_backward import dgrad as dg
from days.day14_backward import make_wgrad
from helpers import gpu
from helpers.check import check
from helpers.launch import prepare, run
from helpers.problem import Conv2dProblem
from helpers.reference import bitwise_equal, compare
from helpers.suites import BACKWARD_EDGES
from helpers.variants import get

pytestmark = pytest.mark.gpu

NHWC = dict(dtype="fp16", layout="NHWC")
# The backward edge cases (helpers.suites.BACKWARD_EDGES), each as a dgrad and a wgrad problem (fp16 NHWC).
EDGES = BACKWARD_EDGES
BACKWARD = ["dgrad", "wgrad", "wgrad_serial"]


@pytest.fixture(scope="module", autouse=True)
def context():
    return gpu.init()


def within_bound(p: Conv2dProblem, a, b, out) -> bool:
    """No NaN/Inf and every element inside the float64 reference's rounding bound."""
    d = compare(p, a, b, out)
    return d["nonfinite"] == 0 and d["worst_err_over_bound"] <= 1


def problem(name: str, op: str, **over) -> Conv2dProblem:
    return Conv2dProblem(**{**EDGES[name], **NHWC, **over}, op=op)


@pytest.mark.parametrize("kind", ["normal", "int"])
@pytest.mark.parametrize("edge", list(EDGES))
@pytest.mark.parametrize("name", BACKWARD)
def test_backward_edges(name: str, edge: str, kind: str):
    v = get(name)
    p = problem(edge, v.op)
    assert v.supports(p) is None, v.supports(p)
    r = check(v, p, kind=kind)
    assert r.ok and r.repeat_bitwise and r.nonfinite == 0, f"{name} on {p.name} ({kind}): {r.reason}"
    if kind == "int":
        assert r.exact, f"{name} on {p.name}: integer inputs but not bit-exact"


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_dgrad_with_channels_not_a_multiple_of_8(dtype: str):
    """K % 8 != 0 or C % 8 != 0: the phases take day 13's analytic or few-channels iterator on the
    transposed phase filters (a filter launch first); C % 8 != 0: element stores."""
    for over in (dict(K=5, C=3), dict(K=13, C=21), dict(K=24, C=7)):
        p = Conv2dProblem(N=2, H=11, W=9, R=3, S=3, stride=2, padding=1, dtype=dtype, layout="NHWC", op="dgrad", **over)
        assert not dg.in_place(p) and get("dgrad").launches(p)[0].name == "filter"
        r = check("dgrad", p, kind="int")
        assert r.ok and r.exact, f"{p.name}: {r.reason}"


# Problems for dgrad's in-place B on every optimized tile: C = 136 and K = 200 leave a part-filled
# GEMM-N tile (c >= C masked) and a part-filled BK step (rows k >= K masked) on every tile.
IN_PLACE = {
    "3x3 stride 2, odd H, W": dict(N=2, C=136, H=13, W=11, K=200, R=3, S=3, stride=2, padding=1),
    "3x3 unit stride (dgrad_unit_*)": dict(N=2, C=136, H=9, W=10, K=200, R=3, S=3, padding=1),
    "3x2 stride (2, 1), dilation (2, 1)": dict(N=2, C=72, H=15, W=12, K=72, R=3, S=2, stride=(2, 1), padding=1,
                                               dilation=(2, 1)),
    "stride 3 > 2x2 filter": dict(N=2, C=64, H=11, W=13, K=24, R=2, S=2, stride=3, padding=1),
    "strided 1x1": dict(N=4, C=128, H=14, W=14, K=64, R=1, S=1, stride=2),
}


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("edge", list(IN_PLACE))
@pytest.mark.parametrize("tile", [t for t, its in dg.instantiated().items() if "optimized" in its])
def test_dgrad_in_place_on_every_optimized_tile(tile: str, edge: str, dtype: str, monkeypatch):
    """Each optimized tile (forced: day 13's rule picks 128x128x64 only on large layers) reads B from
    w in place — no filter launch, no workspace — and gives dx exactly on integer inputs, the same
    bits twice; w is left as it was."""
    p = Conv2dProblem(**IN_PLACE[edge], dtype=dtype, layout="NHWC", op="dgrad")
    t = TileDescription.parse(tile)
    forced = ProductionConfig(t, "optimized", choose_swizzle(dg.phase_gemm_problem(p), t))
    monkeypatch.setattr(dg, "choose_config", lambda q: forced)
    v = get("dgrad")
    assert v.supports(p) is None, v.supports(p)
    ks = v.launches(p)
    assert "filter" not in [k.name for k in ks] and v.workspace_bytes(p) == 0
    assert all(f"_{tile}_optimized_" in k.entry for k in ks if k.name.startswith("phase_"))
    r = check(v, p, kind="int")
    assert r.ok and r.exact and r.repeat_bitwise, f"{tile} on {p.name}: {r.reason}"
    dy, w = p.make_inputs(device="cuda", seed=3)
    w0 = w.clone()
    plan, out = prepare(v, p, dy, w)
    assert plan.workspace is None
    plan()
    torch.cuda.synchronize()
    assert bitwise_equal(w, w0) and within_bound(p, dy, w, out)


def test_wgrad_refuses_channels_not_a_multiple_of_8():
    p = Conv2dProblem(N=2, C=3, H=16, W=16, K=64, R=7, S=7, stride=2, padding=3, op="wgrad", **NHWC)
    assert "C % 8 == 0" in get("wgrad").supports(p)


@pytest.mark.parametrize("splits", [1, 2, 3, 7, 32])
def test_serial_and_parallel_split_k_are_bitwise_equal(splits: int):
    """Both modes add the same fp32 slice partials in slice order: the same bits, run after run."""
    p = Conv2dProblem(N=4, C=32, H=20, W=20, K=64, R=3, S=3, padding=1, op="wgrad", **NHWC)
    x, dy = p.make_inputs(device="cuda", seed=5)
    par = run(make_wgrad("wgrad_par", "parallel", splits=splits), p, x, dy).clone()
    ser = make_wgrad("wgrad_ser", "serial", splits=splits)
    for _ in range(3):
        assert bitwise_equal(run(ser, p, x, dy), par), f"splits {splits}: serial differs from parallel"
    assert within_bound(p, x, dy, par)


@pytest.mark.parametrize("name", BACKWARD)
def test_nan_poisoned_workspace_is_never_read_before_written(name: str):
    """dgrad's workspace (the transposed phase filters: K = 60, so the analytic iterator) and
    wgrad's (partials, semaphores) filled with 0xFF bytes change nothing."""
    v = get(name) if name == "dgrad" else make_wgrad(name, "serial" if name == "wgrad_serial" else "parallel", splits=4)
    K = 60 if name == "dgrad" else 64  # dgrad with K = 64 reads w in place: no workspace
    p = Conv2dProblem(N=8, C=64, H=14, W=14, K=K, R=3, S=3, stride=2, padding=1, op=v.op, **NHWC)
    a, b = p.make_inputs(device="cuda", seed=2)
    clean = run(v, p, a, b).clone()
    plan, out = prepare(v, p, a, b)
    assert plan.workspace is not None
    plan.workspace.fill_(255)  # 0xFFFFFFFF: NaN as fp32 partials, -1 as semaphores, NaN halves
    out.fill_(float("nan"))
    plan()
    torch.cuda.synchronize()
    assert bitwise_equal(out, clean), f"{name}: a NaN-poisoned workspace changed the result"


def test_wgrad_long_reduction_at_n256_within_the_bound():
    """GEMM-K = 256 * 56 * 56 = 802,816 terms (ResNet-50's first 3x3 layer at N = 256), fp32
    partials: inside the bound for every split factor tried."""
    p = Conv2dProblem(N=256, C=64, H=56, W=56, K=64, R=3, S=3, padding=1, op="wgrad", **NHWC)
    x, dy = p.make_inputs(device="cuda", seed=1)
    for splits in (1, 16, 128):
        out = run(make_wgrad("w", "parallel", splits=splits), p, x, dy)
        d = compare(p, x, dy, out)
        assert d["nonfinite"] == 0 and d["worst_err_over_bound"] <= 1, f"splits {splits}: {d}"


def test_dropped_slice_is_caught():
    """A planted fault: the reduction sums one slice fewer (as if a slice's partial were lost).
    The check must fail."""
    v = make_wgrad("w", "parallel", splits=4)
    p = Conv2dProblem(N=4, C=16, H=12, W=12, K=16, R=3, S=3, padding=1, op="wgrad", **NHWC)
    short = dataclasses.replace(v, name="wgrad_dropped_slice", launches_fn=lambda q, ep, cfg: [
        dataclasses.replace(k, args=k.args[:-1] + (type(k.args[-1])(3),)) if k.name == "reduce" else k
        for k in v.launches_fn(q, ep, cfg)])
    x, dy = p.make_inputs(device="cuda", seed=4)
    assert within_bound(p, x, dy, run(v, p, x, dy))
    assert not within_bound(p, x, dy, run(short, p, x, dy))


@pytest.mark.parametrize("edge, launch", [("odd H, W with stride 2", "phase_1_0"),
                                          ("stride 3 > 1x1 filter (dx rows no tap reaches)", "zero")])
def test_dropped_launch_is_caught(edge: str, launch: str):
    """A planted fault: one launch of a strided dgrad is not made (a phase's GEMM, or the zero
    launch of the pixels no tap reaches); its dx pixels stay NaN and the check must fail (and
    name the NaNs)."""
    v = get("dgrad")
    p = problem(edge, "dgrad")
    assert launch in [k.name for k in v.launches(p)]
    dropped = dataclasses.replace(v, name=f"dgrad_dropped_{launch}",
                                  launches_fn=lambda q, ep, cfg: [k for k in v.launches_fn(q, ep, cfg)
                                                                   if k.name != launch])
    dy, w = p.make_inputs(device="cuda", seed=4)
    d = compare(p, dy, w, run(dropped, p, dy, w))
    assert d["nonfinite"] > 0 and not within_bound(p, dy, w, run(dropped, p, dy, w))


def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


# A stem and two bottleneck blocks (C 16 -> 64 -> 128, stride 2), N = 8 images of 28 x 28, fp16
# channels_last: the same network on this series' kernels and on torch's. Each convolution's
# gradient differs from cuDNN's by its own rounding (fp32 accumulation, one fp16 rounding: a
# relative L2 error of a few u = 2^-11); through the blocks' batch norms and ReLUs the differences
# add up, to well under TRAIN_TOL, which a wrong kernel (below) exceeds many times over.
TRAIN_TOL = 1e-2


def _batch():
    torch.manual_seed(0)
    x = torch.randn(8, 16, 28, 28, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    return x, torch.randint(0, 10, (8,), device="cuda")


def test_training_steps_agree_with_torch(monkeypatch):
    from days.day14_backward import train

    ran = []
    launch = train._launch
    monkeypatch.setattr(train, "_launch", lambda v, p, a, b: ran.append((p.op, p.stride)) or launch(v, p, a, b))
    x, labels = _batch()
    ours, ref = train.make_pair(16, 64, 32, 2)
    a, b = train.train_steps(ours, x, labels, 4), train.train_steps(ref, x, labels, 4)
    # every operation ran, dgrad also on the strided 1x1 convolutions (the filter-phase path)
    assert {op for op, _ in ran} == {"fprop", "dgrad", "wgrad"}
    assert ("dgrad", (2, 2)) in ran, sorted(set(ran))
    for la, lb in zip(a["loss"], b["loss"]):
        assert abs(la - lb) <= TRAIN_TOL * abs(lb), (a["loss"], b["loss"])
    assert a["loss"][-1] < a["loss"][0]  # it trains
    assert a["grads"].keys() == b["grads"].keys()
    for name, g in a["grads"].items():
        assert _rel_l2(g, b["grads"][name]) <= TRAIN_TOL, (name, _rel_l2(g, b["grads"][name]))


def test_a_wrong_wgrad_in_training_is_caught():
    """A planted fault: wgrad's reduction drops one of 4 slices; the first step's filter gradients
    then differ from torch's far beyond TRAIN_TOL."""
    from days.day14_backward import train

    v = make_wgrad("w", "parallel", splits=4)
    short = dataclasses.replace(v, name="wgrad_dropped_slice", launches_fn=lambda q, ep, cfg: [
        dataclasses.replace(k, args=k.args[:-1] + (type(k.args[-1])(3),)) if k.name == "reduce" else k
        for k in v.launches_fn(q, ep, cfg)])
    x, labels = _batch()
    ours, ref = train.make_pair(16, 64, 32, 2)
    for m in ours.modules():
        if isinstance(m, train._OnKernels):
            m.kernels = train.Kernels(wgrad=short)
    a, b = train.train_steps(ours, x, labels, 1), train.train_steps(ref, x, labels, 1)
    worst = max(_rel_l2(g, b["grads"][n]) for n, g in a["grads"].items() if g.dim() == 4)
    assert worst > 10 * TRAIN_TOL, worst


def test_a_launch_from_another_thread_works():
    """autograd runs backward on a thread of its own, where pycuda has no current context:
    `helpers.gpu.thread_context` pushes it there, and the kernels run as on the main thread."""
    import threading

    p = problem("strided 1x1, ResNet-style", "dgrad")
    dy, w = p.make_inputs(device="cuda", seed=1)
    want = run("dgrad", p, dy, w).clone()
    got = {}

    def work():
        with gpu.thread_context():
            got["dx"] = run("dgrad", p, dy, w).clone()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert "dx" in got and bitwise_equal(got["dx"], want)


@pytest.mark.parametrize("name", ["dgrad", "wgrad"])
def test_a_cached_plan_runs_on_new_tensors(name: str):
    """`prepare(..., cache=True)` the second time reuses the plan but binds the new call's tensors:
    its output is bitwise that of an uncached run on those tensors, not the first call's."""
    p = problem("strided 1x1, ResNet-style", name)
    a, b = p.make_inputs(device="cuda", seed=1), p.make_inputs(device="cuda", seed=2)
    plan, out_a = prepare(name, p, *a, cache=True)
    plan()
    plan, out_b = prepare(name, p, *b, cache=True)
    out_b.fill_(float("nan"))
    plan()
    want = run(name, p, *b)
    assert bitwise_equal(out_b, want) and not bitwise_equal(out_a, want)


def test_a_misaligned_filter_on_the_transposed_vector_path_is_refused_not_a_fault(misaligned):
    """C and K multiples of 8 with R > 16 take the transposed path, whose filter kernel reads w in
    16-byte loads: a w 2 bytes off is refused before any launch (it faulted and poisoned the
    context), and the context still runs a check afterwards."""
    p = Conv2dProblem(N=1, C=16, H=24, W=8, K=16, R=17, S=1, padding=(8, 0), op="dgrad", **NHWC)
    assert not dg.in_place(p)
    dy, w = p.make_inputs(device="cuda")
    with pytest.raises(ValueError, match=r"w\.data_ptr\(\) is not 16-byte aligned"):
        run("dgrad", p, dy, misaligned(w))
    r = check("dgrad", p)
    assert r.ok, r.reason


def test_a_gradient_penalty_through_the_kernels_raises_torchs_error():
    """The backward's kernels write tensors with no graph: a second derivative (create_graph=True)
    raises torch's once_differentiable error instead of silently dropping the penalty's share."""
    from days.day14_backward import train

    x = torch.randn(2, 16, 10, 9, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    w = torch.randn(16, 16, 3, 3, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    x.requires_grad_()
    w.requires_grad_()
    loss = train.conv2d(x, w, padding=1).float().square().sum()
    (dx,) = torch.autograd.grad(loss, x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        (loss + dx.float().square().sum()).backward()


@pytest.mark.parametrize("hopper", [False, True], ids=["days13-14", "hopper"])
def test_a_step_captured_in_a_cuda_graph_replays_the_eager_step(hopper: bool):
    """A forward + backward of day 14's net (`helpers.gpu.capture`: launched on the side stream,
    captured once) replayed on a new batch written into the captured input gives, bit for bit, the
    filter gradients of the same step run eagerly on the default stream; and the replay runs
    the series' kernels, not a stale copy of the first step (the gradients change with the batch)."""
    import torch.nn.functional as F

    from days.day14_backward import train

    if hopper and tuple(gpu.device_info().cc) != (9, 0):
        pytest.skip("the Hopper kernels need compute capability 9.0")
    from days.day19_wgrad_wgmma import HOPPER_KERNELS

    net, _ = train.make_pair(16, 64, 32, 2, kernels=HOPPER_KERNELS if hopper else train.Kernels())
    x, labels = _batch()
    static_x = x.clone()

    def step():
        net.zero_grad(set_to_none=True)
        F.cross_entropy(net(static_x).float(), labels).backward()

    g = gpu.capture(step)
    g.replay()
    first = {n: p.grad.clone() for n, p in net.named_parameters() if p.dim() == 4}
    static_x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    replayed = {n: p.grad.clone() for n, p in net.named_parameters() if p.dim() == 4}
    net.zero_grad(set_to_none=True)
    F.cross_entropy(net(static_x).float(), labels).backward()
    assert all(not bitwise_equal(first[n], replayed[n]) for n in first)
    for n, p in net.named_parameters():
        if p.dim() == 4:
            assert bitwise_equal(p.grad, replayed[n]), n


def test_a_launch_on_a_stream_not_ours_is_refused_before_it_runs():
    """torch's current stream must be the default or the side stream (`helpers.gpu.stream`):
    on a stream torch made, the call raises before any launch and the context stays usable."""
    p = problem("strided 1x1, ResNet-style", "dgrad")
    dy, w = p.make_inputs(device="cuda", seed=1)
    with torch.cuda.stream(torch.cuda.Stream()), pytest.raises(RuntimeError, match="helpers.gpu.stream"):
        run("dgrad", p, dy, w)
    side = gpu.stream()
    side.wait_stream(torch.cuda.current_stream())  # non-blocking: it waits for dy and w only when told
    with torch.cuda.stream(side):
        on_side = run("dgrad", p, dy, w).clone()
    assert bitwise_equal(on_side, run("dgrad", p, dy, w))
