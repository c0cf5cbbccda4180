"""Day 12 on the CPU: the lean cp.async-pipelined kernel's entry points, defines, write coverage,
refusals and tensor checks, and its builds.

* coverage: the kernel's tile grid writes every output element exactly once, on the edge suite
  with C rounded up to a multiple of 8 (`edge_c8`), on the edge suite as it is, and on seeded
  random problems with C % 8 == 0 (tests/test_variants.py also runs it on its own random
  problems, with the 48 KB limit every GPU allows);
* refusals with their reasons: dtype, layout, groups, C % 8, filters past the tap masks, the
  shared-memory limit of deeper rings, the 32-bit arithmetic; misaligned tensors before any GPU use;
* builds (nvcc on PATH): every target the variant declares (sm_80, 86, 89, 90, 120) without
  spills or a stack, in fewer registers than day 11's 16-byte entry on the same target (the ring
  stages nothing in registers); the PTX of STAGES = 2, 3, 4 waits for STAGES - 2 groups, and the
  planted faults drop exactly that wait (``-DPLANT_FAULT=1``) or the step's barrier (``=2``);
* the ring simulated (`replay`, `ring_loop`): the kernel's schedule has no hazard for 2-5 stages
  and 0-12 steps, refills never the slot being computed and computes on copies issued
  STAGES - 1 steps earlier; each planted mistake is caught with its reason. Registers with CUDA 13.0
  (``-Xptxas -v``, STAGES = 3): 145 on sm_80, sm_86 and sm_89, 150 on sm_90, 130 on sm_120 (day 11: 166 on sm_90).

The kernel itself runs in tests/gpu/test_pipelined_gpu.py.
"""

from __future__ import annotations

import random
import re
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import RecordingKernel

from days.day09_igemm_simt import vec_path
from days.day11_igemm_mma import MMA_TILE
from days.day12_igemm_pipelined import (
    CU_FILE,
    STAGES,
    PipelineHazard,
    edge_c8,
    make_pipelined,
    replay,
    ring_bytes,
    ring_loop,
)
from helpers import compile as hc
from helpers import gpu
from helpers.launch import prepare
from helpers.problem import Conv2dProblem
from helpers.suites import edge, is_big
from helpers.variants import MAX_GRID, Buffer, get

V = get("igemm_pipelined")
DTYPES = ("fp16", "bf16")
H200_SMEM = 227 * 1024
TARGETS = [a for a in hc.ARCHS if int(a.removeprefix("sm_").rstrip("a")) >= 80]


def nhwc(dtype: str = "fp16", **kw) -> Conv2dProblem:
    return Conv2dProblem(layout="NHWC", dtype=dtype, **kw)


def random_c8_problems(n: int = 40, seed: int = 12) -> list[Conv2dProblem]:
    """Seeded small NHWC problems with C % 8 == 0: strides, paddings, dilations, K and M that
    divide no tile, filters up to 16 (the tap masks' last bit)."""
    rng = random.Random(seed)
    out: list[Conv2dProblem] = []
    while len(out) < n:
        try:
            out.append(nhwc(
                rng.choice(DTYPES), N=rng.randint(1, 3), C=8 * rng.randint(1, 9), H=rng.randint(1, 40),
                W=rng.randint(1, 40), K=rng.choice([1, 7, 8, 64, 127, 128, 129, 200, 300]),
                R=rng.choice([1, 2, 3, 5, 7, 16]), S=rng.choice([1, 2, 3, 4, 16]),
                stride=(rng.randint(1, 3), rng.randint(1, 3)), padding=(rng.randint(0, 4), rng.randint(0, 4)),
                dilation=(rng.randint(1, 3), rng.randint(1, 2)),
            ))
        except ValueError:  # filter larger than the padded image: draw again
            continue
    return out


# ---- entry points, defines, launch ------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_entries_defines_and_launch(dtype):
    p = nhwc(dtype, N=2, C=64, H=15, W=13, K=70, R=3, S=3, padding=1)
    assert V.supports(p) is None and V.day == 12 and V.cu_file == CU_FILE == "12_igemm_pipelined.cu"
    assert V.entry_for(p) == f"conv2d_igemm_pipelined_{dtype}"
    assert V.defines == {"STAGES": STAGES} and STAGES == 3
    cfg = V.launch(p)
    assert cfg.block == (256, 1, 1) and cfg.grid == (-(-p.gemm.m // 128), 1, 1)
    assert cfg.shared_bytes == ring_bytes(3) == 3 * (128 + 128) * 32 * 2 == 48 * 1024  # fits without opting in


def test_kernel_arguments_match_the_launch_by_name():
    """The launch passes the entry's parameters in order, pointers by name, sizes as int32."""
    src = hc.kernel_path(CU_FILE).read_text()
    body = src.split("#define PIPELINED_ENTRY", 1)[1].replace("\\\n", " ")
    params = [d.strip() for d in re.search(r"conv2d_igemm_pipelined_##DT\((.*?)\)\s*\{", body, re.S)[1].split(",")]
    names = [d.split()[-1].lstrip("*") for d in params]
    p = nhwc(N=2, C=16, H=9, W=7, K=24, R=3, S=2, stride=(2, 1), padding=(1, 0), dilation=(1, 2))
    (launch,) = V.launches(p)
    got = {nm: (a.name if isinstance(a, Buffer) else int(a)) for nm, a in zip(names, launch.args, strict=True)}
    assert got == {
        "x": "x", "w": "w", "y": "y", "N": 2, "C": 16, "H": 9, "W": 7, "K": 24, "R": 3, "S": 2, "P": p.P,
        "Q": p.Q, "sh": 2, "sw": 1, "ph": 1, "pw": 0, "dh": 1, "dw": 2, "groups": 1,
    }
    assert all(isinstance(a, Buffer) == ("*" in d) for a, d in zip(launch.args, params))


@pytest.mark.parametrize("stages", [2, 4, 5])
def test_make_pipelined_other_depths(stages):
    v = make_pipelined(stages)
    p = nhwc(N=1, C=8, H=8, W=8, K=8, R=3, S=3, padding=1)
    assert v.name == f"igemm_pipelined_s{stages}" and v.defines == {"STAGES": stages}
    assert v.launch(p).shared_bytes == stages * 16 * 1024 and v.entry_for(p) == V.entry_for(p)
    assert make_pipelined(stages, name="mine").name == "mine"


def test_make_pipelined_refuses_a_ring_of_one():
    with pytest.raises(ValueError, match="stages = 1: a ring needs at least 2"):
        make_pipelined(1)


# ---- coverage -----------------------------------------------------------------------------------


def _check_covers(v, p: Conv2dProblem) -> None:
    cfg = v.launch(p)
    assert all(1 <= g <= lim for g, lim in zip(cfg.grid, MAX_GRID)), (p.name, cfg)
    assert cfg.grid[:2] == (-(-p.gemm.m // MMA_TILE[0]), -(-p.K // MMA_TILE[1]))
    counts = np.asarray(v.covers(p))
    assert counts.shape == (p.y_numel,)
    never, twice = int((counts == 0).sum()), int((counts > 1).sum())
    assert never == 0 and twice == 0, f"{p.name}: {never} outputs never written, {twice} more than once"


@pytest.mark.parametrize("dtype", DTYPES)
def test_covers_edge_suite_with_c_rounded_to_8(dtype):
    claimed = 0
    for p in edge_c8(dtype):
        assert p.C % 8 == 0 and p.dtype == dtype and p.layout == "NHWC"
        assert V.supports(p) is None, V.supports(p)  # every groups = 1 edge case, in 48 KB
        if is_big(p):
            continue
        claimed += 1
        _check_covers(V, p)
    assert claimed >= 19


def test_edge_c8_keeps_every_groups_one_case():
    ones = [p for p in edge() if p.groups == 1]
    c8 = edge_c8()
    assert len(c8) == len(ones) >= 20
    for a, b in zip(ones, c8):
        assert replace(a, C=b.C, dtype=b.dtype, layout=b.layout, name="") == replace(b, name="")
        assert b.C == -(-a.C // 8) * 8  # unchanged where C % 8 == 0 already


@pytest.mark.parametrize("dtype", DTYPES)
def test_covers_edge_suite_as_it_is(dtype):
    """The suite itself: C % 8 == 0 problems claimed (and covered), the rest refused for C % 8 or groups."""
    claimed = 0
    for p in edge():
        q = replace(p, dtype=dtype, layout="NHWC", name="")
        reason = V.supports(q)
        if reason is not None:
            assert ("C % 8 == 0" in reason) or ("groups=1" in reason), (q.name, reason)
            continue
        assert vec_path(q)
        claimed += 1
        _check_covers(V, q)
    assert claimed >= 2


def test_covers_random_problems():
    claimed = 0
    for p in random_c8_problems():
        assert V.supports(p) is None, (p.name, V.supports(p))
        claimed += 1
        _check_covers(V, p)
    assert claimed == 40


# ---- refusals -----------------------------------------------------------------------------------


OK = nhwc(N=1, C=8, H=8, W=8, K=8, R=3, S=3, padding=1)


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(dtype="fp32"), "takes dtype fp16/bf16; got fp32"),
        (dict(layout="NCHW"), "takes layout NHWC; got NCHW"),
        (dict(C=16, K=8, groups=2), "needs groups=1; got 2"),
        (dict(C=12), "needs C % 8 == 0; got C = 12 (igemm_mma and igemm_production take any C)"),
        (dict(C=3), "the cp.async ring copies 8 channels (16 bytes) at a time"),
        (dict(H=20, W=20, R=17, padding=0), "needs R, S <= 16; got R = 17, S = 3"),
        (dict(H=20, W=20, S=17, padding=0), "needs R, S <= 16; got R = 3, S = 17"),
    ],
)
def test_refusals_name_the_reason(change, words):
    reason = V.supports(replace(OK, name="", **change))
    assert reason is not None and reason.startswith("igemm_pipelined") and words in reason, reason


def test_filters_of_16_taps_are_claimed():
    assert V.supports(nhwc(N=1, C=8, H=20, W=20, K=8, R=16, S=16, padding=(3, 5))) is None


def test_shared_memory_limit():
    """The registered 3-stage ring fits the 48 KB every GPU allows; deeper rings need the device's
    opt-in limit and are refused past it, naming the bytes."""
    assert V.supports(OK, smem_limit=48 * 1024) is None
    assert "needs 49152 B of shared memory per block; the limit is 40960 B" in V.supports(OK, smem_limit=40 * 1024)
    deep = make_pipelined(4)
    assert "needs 65536 B of shared memory per block; the limit is 49152 B" in deep.supports(OK, smem_limit=48 * 1024)
    assert deep.supports(OK, smem_limit=99 * 1024) is None  # sm_86 / sm_89 / sm_120 opt in to 99 KB
    assert "needs 245760 B" in make_pipelined(15).supports(OK, smem_limit=H200_SMEM)  # past the H200's 227 KB


def test_build_target():
    assert "8.0 or newer (cp.async" in V.build_reason((7, 5))
    assert all(V.build_reason(cc) is None for cc in ((8, 0), (8, 6), (8, 9), (9, 0), (12, 0)))


@pytest.mark.parametrize(
    "p, words",
    [
        (nhwc(N=1, C=8, H=46341, W=46341, K=1, R=1, S=1), "P*Q"),  # int pq = m % (P*Q)
        (nhwc(N=1, C=2**31 - 8, H=1, W=1, K=1, R=1, S=1), "R*S*C"),  # CEIL_DIV(C, 32), the B offsets
        (nhwc(N=1, C=8, H=1, W=1, K=1, R=1, S=1, stride=(2**30, 1), padding=(2**30, 0)), "p*sh - ph + r*dh"),
    ],
    ids=["PQ", "RSC", "rows"],
)
def test_int32_limits(p, words):
    """Just past the kernel's 32-bit arithmetic (days 09-11's limits): refused, naming the expression
    (tests/test_int32_guards.py emulates the wrap); just inside: claimed."""
    reason = V.supports(p, smem_limit=2**31)
    assert reason is not None and words in reason, reason
    for inside in (nhwc(N=1, C=8, H=46340, W=46340, K=1, R=1, S=1), nhwc(N=1, C=2**31 - 32, H=1, W=1, K=1, R=1, S=1)):
        assert V.supports(inside, smem_limit=2**31) is None, inside.name


# ---- tensor checks --------------------------------------------------------------------------------


def test_tensor_check_names_the_misaligned_tensor(misaligned):
    p = nhwc(N=1, C=16, H=6, W=6, K=16, R=3, S=3, padding=1)
    x, w = p.make_inputs()
    y = torch.empty(p.y_shape, dtype=torch.float16)
    check = V.tensor_check_fn
    assert check(p, {"x": x, "w": w, "y": y}) is None and check(p, {"x": x, "w": w, "y": None}) is None
    assert "x.data_ptr() is not 16-byte aligned" in check(p, {"x": misaligned(x), "w": w, "y": y})
    assert "w.data_ptr() is not 16-byte aligned" in check(p, {"x": x, "w": misaligned(w), "y": y})
    assert "y.data_ptr() is not 4-byte aligned" in check(p, {"x": x, "w": w, "y": misaligned(y)})
    p7 = replace(p, K=7, name="")  # odd K: y is stored element by element, any alignment
    y7 = misaligned(torch.empty(p7.y_shape, dtype=torch.float16))
    assert check(p7, {"x": x, "w": p7.make_inputs()[1], "y": y7}) is None


def test_prepare_builds_with_the_stages_define(monkeypatch):
    """`prepare` compiles the entry with -DSTAGES and launches with the ring's dynamic shared memory."""
    built = []

    def load_kernel(cu_file, entry, defines=None, dynamic_smem=0, arch=None, params=0):
        built.append((cu_file, entry, dict(defines or {}), dynamic_smem, arch))
        return hc.CompiledKernel(function=RecordingKernel(entry, []), num_regs=145, shared_static_bytes=0,
                                 local_bytes=0, max_threads_per_block=256)

    monkeypatch.setattr("helpers.launch.check_tensors", lambda *a, **k: None)
    monkeypatch.setattr(gpu, "device_info", lambda: SimpleNamespace(smem_per_block_optin=H200_SMEM, cc=(9, 0)))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(hc, "load_kernel", load_kernel)
    p = nhwc("bf16", N=1, C=8, H=6, W=6, K=8, R=3, S=3, padding=1)
    for v, stages in ((V, 3), (make_pipelined(4), 4)):
        prepare(v, p, *p.make_inputs(), out=torch.empty(p.y_shape, dtype=torch.bfloat16))
        assert built[-1] == (CU_FILE, "conv2d_igemm_pipelined_bf16", {"STAGES": stages}, stages * 16384, "sm_90")


# ---- builds -------------------------------------------------------------------------------------


def test_targets_are_the_variants():
    cc = [(int(a[3:-1]), int(a[-1])) for a in hc.ARCHS]
    assert [a for a, c in zip(hc.ARCHS, cc) if V.build_reason(c) is None] == TARGETS
    assert TARGETS == ["sm_80", "sm_86", "sm_89", "sm_90", "sm_120"]


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", TARGETS)
def test_builds_without_spills_in_fewer_registers_than_day_11(arch):
    reports, log = hc.nvcc_compile(CU_FILE, arch=arch, defines=V.defines)
    by_entry = {r.entry: r for r in reports}
    assert set(by_entry) == {f"conv2d_igemm_pipelined_{d}" for d in DTYPES}, log
    day11 = {r.entry: r.registers for r in hc.nvcc_compile("11_igemm_mma.cu", arch=arch)[0]}
    for d in DTYPES:
        r = by_entry[f"conv2d_igemm_pipelined_{d}"]
        assert r.arch == arch and 0 < r.registers <= 255
        assert (r.spill_stores, r.spill_loads, r.stack_bytes) == (0, 0, 0), f"{r.entry} spills on {arch}: {r}"
        assert r.shared_bytes == 0, "the ring is dynamic shared memory"
        assert r.registers < day11[f"conv2d_igemm_mma_{d}_vec"], (r, day11)


def ptx(defines: dict) -> str:
    """The PTX of the kernel for sm_80 with these -D defines (nvcc -ptx; no GPU)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "k.ptx"
        cmd = ["nvcc", "-ptx", "-arch=sm_80", *hc.NVCC_OPTIONS, *hc.define_flags(defines), "-I", str(hc.KERNEL_DIR),
               str(hc.kernel_path(CU_FILE)), "-o", str(out)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        return out.read_text()


@pytest.mark.nvcc
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_ptx_waits_for_all_but_stages_minus_2_groups(stages):
    text = ptx({"STAGES": stages})
    waits = set(re.findall(r"cp\.async\.wait_group (\d+);", text))
    assert waits == {str(stages - 2), "0"}, waits  # the main loop's, and the last one after it
    assert "cp.async.commit_group;" in text and "cp.async.cg.shared.global" in text and "bar.sync" in text
    assert "ld.global" not in text, "every global read of the main loop is a cp.async"


@pytest.mark.nvcc
@pytest.mark.parametrize("plant, dropped", [(1, "cp.async.wait_group 1;"), (2, "bar.sync")])
def test_planted_fault_drops_exactly_one_instruction(plant, dropped):
    good, bad = ptx({"STAGES": 3}), ptx({"STAGES": 3, "PLANT_FAULT": plant})
    assert good.count(dropped) == 2 and dropped not in bad, dropped  # the main loop's, in each of the two entries
    for s in ("cp.async.wait_group 1;", "cp.async.wait_group 0;", "cp.async.commit_group;", "cp.async.cg.shared.global",
              "bar.sync", "mma.sync", "ldmatrix"):
        if s != dropped:
            assert good.count(s) == bad.count(s), s


# ---- the ring, simulated --------------------------------------------------------------------------


def _phase_slots(events: list[tuple]) -> dict[str, tuple[set, set]]:
    """{phase: (slots written by cp.async, slots read by ldmatrix)}."""
    out, ph = {}, None
    for kind, *a in events:
        if kind == "phase":
            ph = a[0]
            out[ph] = (set(), set())
        elif kind in ("cp.async", "ldmatrix"):
            out[ph][kind == "ldmatrix"].add(a[1])
    return out


@pytest.mark.parametrize("stages", [2, 3, 4, 5])
def test_the_kernels_ring_has_no_hazard(stages):
    for steps in range(13):
        ev = ring_loop(steps, stages)
        timeline = replay(ev, stages)  # raises PipelineHazard on a broken rule
        for t in range(steps):
            written, read = _phase_slots(ev)[f"step {t}"]
            assert not written & read, (steps, t)
            issued = timeline.at[f"step {t}", "its copy was issued in"]
            assert issued == ("prologue" if t < stages - 1 else f"step {t - stages + 1}"), (steps, t, issued)


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"empty_groups": False}, "before every thread's copies"),  # the tail's steps
        ({"wait": 2}, "before every thread's copies"),  # STAGES - 1: one group too many pending
        ({"wait_group": False}, "before every thread's copies"),  # PLANT_FAULT=1
        ({"barrier": False}, "before every thread's copies"),  # PLANT_FAULT=2
        ({"issue_before_barrier": True}, "which a slower warp may still read"),
        ({"ahead": 3}, "which holds step"),  # STAGES steps ahead: overwrites the slot about to be read
    ],
)
def test_each_planted_mistake_is_caught_with_its_reason(kw, words):
    replay(ring_loop(8, 3), 3)  # the same schedule without the mistake passes
    with pytest.raises(PipelineHazard, match=words):
        replay(ring_loop(8, 3, **kw), 3)


def test_replay_catches_a_fragment_buffer_overwritten_before_its_mma():
    ev = ring_loop(2, 3)
    i = ev.index(("mma", 0, 0, 0))
    with pytest.raises(PipelineHazard, match="before an mma used it"):
        replay(ev[:i] + [ev[i + 1]] + ev[i:], 3)  # slice 1's ldmatrix moved before slice 0's mma


@pytest.mark.nvcc
@pytest.mark.parametrize(
    "defines, words", [({}, "define STAGES"), ({"STAGES": 1}, "a ring needs one stage loading and one computing")]
)
def test_required_defines_fail_loudly(defines, words):
    with pytest.raises(RuntimeError, match=words):
        hc.nvcc_compile(CU_FILE, arch="sm_80", defines=defines)
