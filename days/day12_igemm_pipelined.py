"""Day 12: ``igemm_pipelined``, day 11's mma.sync kernel fed by a cp.async multistage pipeline.

``kernels/conv2d/12_igemm_pipelined.cu`` keeps day 11's GEMM view, 128 x 128 x 32 block tile,
8 warps of 64 x 32, swizzled stages, ``ldmatrix``, ``mma.sync`` m16n8k16 and plain fp16/bf16
store, and replaces day 11's register-staged double buffering with a ring of ``STAGES``
shared-memory stages that 16-byte ``cp.async`` copies fill ``STAGES - 1`` steps ahead of the
math: one commit group per step (empty ones at the tail), ``cp.async.wait_group STAGES-2`` and
one ``__syncthreads()`` per step. It has one iterator, CUTLASS's "optimized" one: per pixel a
pointer to tap (0, 0) and a mask of the filter taps inside the image, computed once; padding and
out-of-range rows and channels are zero-filled by the copy itself (src-size 0).

What it takes: fp16/bf16 NHWC, groups = 1, C % 8 == 0 (16-byte copies; days 11 and 13 take any
C), R, S <= 16 (the tap masks), any stride, padding and dilation; x and w 16-byte aligned and y
4-byte aligned where K is even (day 11's `days.day11_igemm_mma.tensor_core_check`); the ring's
dynamic shared memory, STAGES * 16 KB, within the device's limit; sm_80+ (cp.async, bf16
mma.sync); the 32-bit arithmetic of days 09-11 (`days.day09_igemm_simt.igemm_supports`).

* ``igemm_pipelined`` (registered): ``STAGES`` = 3, 48 KB, what every GPU gives a block without
  opting in; `make_pipelined` builds the same kernel with another ring depth (not registered).
* `replay` and `ring_loop`: the ring simulated in Python, one thread's events replayed under the
  rules of ``cp.async`` groups and barriers (`PipelineHazard` names the first broken one).
* `edge_c8`: the edge suite's groups = 1 problems with C rounded up to a multiple of 8, so that
  its spatial cases (padding, strides, dilations, sizes that divide no tile, grids past 65,535)
  reach this kernel; the suite as it is has only two problems with C % 8 == 0.

Day 13 (``igemm_production``) grows this kernel into the production one. Sources: the PTX ISA
("cp.async", "cp.async.commit_group", "cp.async.wait_group"); NVIDIA CUTLASS,
``docs/efficient_gemm.md`` (software pipelining through shared memory) and
``docs/implicit_gemm_convolution.md`` (the optimized iterator's masks).
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from helpers.problem import Conv2dProblem
from helpers.suites import edge
from helpers.variants import LaunchConfig, Variant, register

from .day09_igemm_simt import Tile, igemm_supports, tile_covers, vec_path
from .day11_igemm_mma import KB, MMA_THREADS, MMA_TILE, tensor_core_check
from .kit import FULL_SIZES, TENSOR_CORE_CC, cdiv, gemm_tile_launch, single_kernel

CU_FILE = "12_igemm_pipelined.cu"
STAGES = 3  # the registered variant's ring: 3 x 16 KB = 48 KB
MAX_MASKED_TAPS = 16  # one mask bit per filter row (bits 0..15) and column (16..31)


def ring_bytes(stages: int) -> int:
    """Dynamic shared memory of a ring of ``stages`` stages: A[128][32] and B[128][32] halves each."""
    return stages * (MMA_TILE[0] + MMA_TILE[1]) * KB * 2


def pipelined_supports(p: Conv2dProblem) -> str | None:
    """Day 11's claim (`days.day09_igemm_simt.igemm_supports`: groups = 1 and the 32-bit limits),
    C % 8 == 0 for the 16-byte copies and R, S <= `MAX_MASKED_TAPS` for the tap masks. None, or
    the reason."""
    reason = igemm_supports(p)
    if reason:
        return reason
    if not vec_path(p):
        return (
            f"the cp.async ring copies 8 channels (16 bytes) at a time: needs C % 8 == 0; got C = {p.C} "
            "(igemm_mma and igemm_production take any C)"
        )
    if max(p.R, p.S) > MAX_MASKED_TAPS:
        return (
            f"the tap masks keep one bit per filter row and column: needs R, S <= {MAX_MASKED_TAPS}; "
            f"got R = {p.R}, S = {p.S} (igemm_mma and igemm_production take any filter)"
        )
    return None


def _entry(p: Conv2dProblem) -> str:
    return f"conv2d_igemm_pipelined_{p.dtype}"


def make_pipelined(stages: int = STAGES, name: str | None = None) -> Variant:
    """The day-12 variant with a ring of ``stages`` stages (``-DSTAGES``); ``name`` defaults to
    ``igemm_pipelined`` for the registered depth and ``igemm_pipelined_s<stages>`` otherwise.
    A ring past the device's shared memory is refused per problem by `Variant.supports`.

    Raises:
        ValueError: ``stages`` < 2 (one stage loading and one computing).
    """
    if stages < 2:
        raise ValueError(f"stages = {stages}: a ring needs at least 2 (one stage loading, one computing)")

    def launch(p: Conv2dProblem) -> LaunchConfig:
        return gemm_tile_launch(p, *MMA_TILE, MMA_THREADS, shared_bytes=ring_bytes(stages))

    return Variant(
        name=name or ("igemm_pipelined" if stages == STAGES else f"igemm_pipelined_s{stages}"),
        day=12,
        cu_file=CU_FILE,
        summary=f"tensor cores: day 11 fed by a {stages}-stage cp.async ring (16-byte copies, tap masks), "
        "128x128x32 tile",
        supports_fn=pipelined_supports,
        launches_fn=single_kernel(_entry, launch, f"x w y {FULL_SIZES} groups"),
        covers_fn=lambda p, cfg: tile_covers(p, cfg, Tile(*MMA_TILE)),
        defines={"STAGES": stages},
        dtypes=("fp16", "bf16"),
        layouts=("NHWC",),
        accum="fp32",
        tensor_check_fn=tensor_core_check,
        min_cc=TENSOR_CORE_CC,
        min_cc_why="cp.async, mma.sync m16n8k16 with bf16, ldmatrix",
    )


def edge_c8(dtype: str = "fp16") -> list[Conv2dProblem]:
    """The edge suite's groups = 1 problems in ``dtype`` NHWC with C rounded up to a multiple of 8
    (C = 1, 3, 45 become 8, 8, 48): every spatial edge case, in the channel counts this kernel takes."""
    return [replace(p, C=cdiv(p.C, 8) * 8, dtype=dtype, layout="NHWC", name="") for p in edge() if p.groups == 1]


# ---- the ring, simulated -------------------------------------------------------------------------


class PipelineHazard(AssertionError):
    """A schedule of the ring broke one of `replay`'s rules."""


def replay(events: list[tuple], stages: int) -> pd.DataFrame:
    """Replay one thread's events of a cp.async ring; raise `PipelineHazard` at the first broken rule.

    Every thread runs the same program, so one thread's events in program order stand for all.
    The rules: a commit group lands as late as allowed (only when a ``wait_group`` lets it); a read
    of a slot (``ldmatrix``) must find the step it expects, landed in this thread's wait *and*
    published to every thread by a barrier after that wait (the slot holds other threads' copies
    too); a copy into a slot must not race a slower warp (no read of that slot since the last
    barrier); an ``ldmatrix`` must not overwrite a fragment buffer that no ``mma`` has used yet.

    Events: ``("phase", label)``, ``("cp.async", step, slot)``, ``("commit",)``,
    ``("wait_group", n)``, ``("barrier",)``, ``("ldmatrix", step, slot, kk, buffer)`` (a read of
    GEMM-K slice kk of a slot into fragment buffer 0 or 1), ``("mma", step, kk, buffer)``.

    Returns one row per phase: the copies it issued, the groups committed and landed, what it
    loaded and computed, the phase that issued the copies it computed on, and each slot's step at
    the phase's end ("(in flight)": this thread has not waited for it yet).
    """
    committed = landed = published = 0  # groups 0..landed-1 waited for; 0..published-1 also behind a barrier
    slots: dict[int, tuple] = {}  # slot -> (step, its group, the phase that issued it)
    reads: set[int] = set()  # slots read since the last barrier
    frags: dict[int, list] = {}  # fragment buffer -> [(step, kk), used by an mma yet?]
    rows = []
    for kind, *a in events:
        if kind == "phase":
            rows.append(
                {"phase": a[0], "cp.async step→slot": "", "ldmatrix step.kk@slot→buf": "", "mma.sync step.kk": ""}
            )
            continue
        row = rows[-1]
        where = row["phase"]
        if kind == "cp.async":
            st, sl = a
            if sl in reads:
                raise PipelineHazard(
                    f"{where}: the copy of step {st} overwrites slot {sl}, which a slower warp may still read"
                )
            slots[sl] = (st, committed, where)
            row["cp.async step→slot"] += f"{st}→{sl} "
        elif kind == "commit":
            committed += 1
        elif kind == "wait_group":
            landed = max(landed, committed - a[0])
        elif kind == "barrier":
            published, reads = landed, set()
        elif kind == "ldmatrix":
            st, sl, kk, buf = a
            have = slots.get(sl)
            if have is None or have[0] != st:
                raise PipelineHazard(f"{where}: reads step {st} from slot {sl}, which holds step {have and have[0]}")
            if have[1] >= published:
                raise PipelineHazard(
                    f"{where}: reads step {st} from slot {sl} before every thread's copies (group {have[1]}) landed"
                )
            if buf in frags and not frags[buf][1]:
                raise PipelineHazard(f"{where}: ldmatrix overwrites fragment buffer {buf} before an mma used it")
            reads.add(sl)
            frags[buf] = [(st, kk), False]
            row["ldmatrix step.kk@slot→buf"] += f"{st}.{kk}@{sl}→{buf} "
            row.setdefault("its copy was issued in", have[2])
        elif kind == "mma":
            st, kk, buf = a
            if frags.get(buf, [None])[0] != (st, kk):
                raise PipelineHazard(f"{where}: the mma of {st}.{kk} finds {frags.get(buf, [None])[0]} in buffer {buf}")
            frags[buf][1] = True
            row["mma.sync step.kk"] += f"{st}.{kk} "
        row["groups committed"], row["groups landed"] = committed, landed
        for s, (st, g, _) in slots.items():
            row[f"slot {s}"] = f"{st}" + ("" if g < landed else " (in flight)")
    cols = ["phase", "cp.async step→slot", "groups committed", "groups landed", "ldmatrix step.kk@slot→buf",
            "mma.sync step.kk", "its copy was issued in"] + [f"slot {s}" for s in range(stages)]
    return pd.DataFrame(rows).reindex(columns=cols).astype(object).fillna("").set_index("phase")


def ring_loop(
    steps: int,
    stages: int,
    kk_slices: int = KB // 16,
    *,
    empty_groups: bool = True,
    wait: int | None = None,
    wait_group: bool = True,
    barrier: bool = True,
    issue_before_barrier: bool = False,
    ahead: int | None = None,
) -> list[tuple]:
    """The main loop of ``12_igemm_pipelined.cu`` as one thread's events for `replay`.

    Prologue: steps 0 .. STAGES-2 into slots 0 .. STAGES-2, one commit each. Step t: wait_group
    STAGES-2, barrier, the copy of step t + STAGES-1 into slot (t + STAGES-1) % STAGES, commit, then
    per 16-wide slice kk of the step an ldmatrix and its mma on slot t % STAGES. The keywords break
    it on purpose: no empty groups at the tail, another ``wait`` count, no ``wait_group`` at all
    (``-DPLANT_FAULT=1``), no ``barrier`` (``-DPLANT_FAULT=2``), the refill issued before the
    barrier, copies ``ahead`` steps ahead instead of STAGES - 1.
    """
    wait = stages - 2 if wait is None else wait
    ahead = stages - 1 if ahead is None else ahead
    ev = [("phase", "prologue")]
    for st in range(ahead):
        if st < steps:
            ev.append(("cp.async", st, st % stages))
        if st < steps or empty_groups:
            ev.append(("commit",))
    for t in range(steps):
        ev.append(("phase", f"step {t}"))
        nxt = t + ahead
        refill = [("cp.async", nxt, nxt % stages)] if nxt < steps else []
        refill += [("commit",)] if nxt < steps or empty_groups else []
        sync = ([("wait_group", wait)] if wait_group else []) + ([("barrier",)] if barrier else [])
        ev += refill + sync if issue_before_barrier else sync + refill
        for kk in range(kk_slices):
            ev += [("ldmatrix", t, t % stages, kk, 0), ("mma", t, kk, 0)]
    return ev


register(make_pipelined())
