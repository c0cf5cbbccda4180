"""`helpers.bench.bench` on the CPU, with the GPU parts stood in: problems adapted per variant
against their own cuDNN baseline, faults recorded as rows while the run goes on, problems too big
for the free memory skipped with a reason, rows handed out as the run goes, and checked and
unchecked timings never mixed."""

from __future__ import annotations

import importlib
import math
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from helpers.problem import Conv2dProblem
from helpers.reference import CheckResult
from helpers.timing import Timing
from helpers.variants import get

hb = importlib.import_module("helpers.bench")  # the module (`helpers.bench` is also the function)

P = Conv2dProblem(N=1, C=8, H=8, W=8, K=8, R=3, S=3, padding=1)  # fp32 NCHW, "same"
P2 = Conv2dProblem(N=2, C=8, H=6, W=6, K=8, R=1, S=1)


@pytest.fixture
def stand_in(monkeypatch):
    """Every GPU call of `bench` replaced: variant times 2 ms, cuDNN times 1 ms (4 ms in fp16 NHWC),
    checks pass unless ``state["fail"]`` names the variant, ``state["raise"]`` maps a variant to
    the exception its check raises, and ``state["free"]`` is the device's free memory."""
    state = {"fail": set(), "raise": {}, "free": 10**12, "emptied": 0}
    info = SimpleNamespace(smem_per_block_optin=227 * 1024, cc=(9, 0))
    monkeypatch.setattr(importlib.import_module("helpers.gpu"), "device_info", lambda: info)
    monkeypatch.setattr(hb._SuiteProblem, "inputs", lambda self, p: p.make_inputs())
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (state["free"], 2 * state["free"]))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: state.__setitem__("emptied", state["emptied"] + 1))

    def cudnn_launcher(p, a, b):
        return ("cudnn", p)

    def time_gpu(fn, **kw):
        if isinstance(fn, tuple):  # a baseline
            ms = 4.0 if fn[1].dtype == "fp16" else 1.0
        else:
            ms = 2.0
        return Timing(ms, ms, ms, 5)

    def check(plan, kind="normal", **kw):
        v, p = plan.variant, plan.problem
        if v.name in state["raise"]:
            raise state["raise"][v.name]
        ok = v.name not in state["fail"]
        return CheckResult(v.name, p.name, kind, ok, "" if ok else "planted", 0.0, 0.5, 1e-7, 0,
                           True if kind == "int" else None, True)

    monkeypatch.setattr(hb, "cudnn_launcher", cudnn_launcher)
    monkeypatch.setattr(hb, "time_gpu", time_gpu)
    monkeypatch.setattr(hb, "run_check", check)
    monkeypatch.setattr(hb, "prepare", lambda plan, *a, **kw: ("launch", None))
    return state


def run_bench(variants, problems=(P,), **kw) -> pd.DataFrame:
    return hb.bench(variants, list(problems), progress=False, **kw)


def test_adapted_problems_run_against_their_own_baseline(stand_in):
    df = run_bench(["naive", "igemm_simt", "igemm_pipelined"])
    rows = df.set_index("variant")
    assert rows.loc["naive", "layout"] == "NCHW" and rows.loc["naive", "x_cudnn"] == 0.5  # 1 ms / 2 ms
    assert rows.loc["igemm_simt", "layout"] == "NHWC" and rows.loc["igemm_pipelined", "dtype"] == "fp16"
    assert rows.loc["igemm_pipelined", "x_cudnn"] == 2.0  # against cuDNN in fp16 NHWC (4 ms), not fp32 NCHW
    baselines = df[df.status == "baseline"].variant.tolist()
    assert baselines == ["cudnn", "cudnn fp32 NHWC", "cudnn fp16 NHWC"]
    no_adapt = run_bench(["igemm_simt"], adapt=False).set_index("variant")
    assert no_adapt.loc["igemm_simt", "status"].startswith("unsupported: igemm_simt takes layout NHWC")


def test_a_fault_is_a_row_and_the_run_goes_on(stand_in):
    stand_in["raise"] = {"z_out": RuntimeError("an illegal memory access\nwas encountered"),
                         "shared": torch.cuda.OutOfMemoryError("CUDA out of memory")}
    df = run_bench(["naive", "z_out", "shared", "general"], problems=(P, P2))
    by = {(r.variant, r.problem): r for r in df.itertuples()}
    assert by[("z_out", P.name)].status == "error: RuntimeError: an illegal memory access was encountered"
    assert by[("z_out", P.name)].ok is False
    assert by[("shared", P.name)].status.startswith("error: OutOfMemoryError: CUDA out of memory")
    assert stand_in["emptied"] == 2  # once per OOM: P and P2
    assert by[("naive", P2.name)].status == "ok" and by[("general", P2.name)].status == "ok"


def test_failed_checks_are_not_timed(stand_in):
    stand_in["fail"] = {"naive"}
    row = run_bench(["naive"]).set_index("variant").loc["naive"]
    assert row.ok is False and row.status.startswith("FAIL normal: planted") and pd.isna(row.ms_p50)


def test_problems_too_big_for_free_memory_are_skipped(stand_in):
    big = Conv2dProblem(N=4, C=8, H=64, W=64, K=8, R=3, S=3, padding=1)
    assert hb.memory_needed(P) < hb.memory_needed(big)
    stand_in["free"] = hb.memory_needed(big)  # both fit
    assert len(run_bench(["naive"], problems=(P, big)).query("status == 'ok'")) == 2
    stand_in["free"] = hb.memory_needed(big) - 1  # the big one does not
    df = run_bench(["naive", "general"], problems=(P, big))
    skipped = df[df.problem == big.name]
    assert len(skipped) == 3 and skipped.status.str.startswith("skipped: needs about").all()  # cudnn + 2 variants
    assert "GB free" in skipped.status.iloc[0] and (df[df.problem == P.name].status != "").all()
    assert set(df[df.problem == P.name].status) == {"baseline", "ok"}


def test_rows_are_handed_out_as_the_run_goes(stand_in):
    seen = []
    run_bench(["naive"], problems=(P, P2), on_rows=lambda d: seen.append(len(d)))
    assert seen == [2, 4]  # after each problem: its baseline and its variant row


def test_checked_and_unchecked_timings_are_never_mixed(stand_in):
    checked = run_bench(["naive"])
    unchecked = run_bench(["naive"], check=False)
    assert unchecked.set_index("variant").loc["naive", "status"] == "unchecked"
    both = pd.concat([checked, unchecked.assign(x_cudnn=100.0)])
    assert hb.geomean_x_cudnn(both)["naive"] == pytest.approx(0.5)
    assert hb.geomean_x_cudnn(both, checked=False)["naive"] == pytest.approx(100.0)


def test_memory_needed_counts_inputs_outputs_and_bands():
    p = Conv2dProblem(N=2, C=1, H=32800, W=32800, K=1, R=3, S=3, padding=1)  # the edge suite's 2^31 problem
    need = hb.memory_needed(p)
    assert need == 2 * (p.x_numel + p.w_numel) * 4 + 3 * p.y_numel * 4 + hb.REFERENCE_BAND_BYTES
    assert 40e9 < need < 50e9
    assert get("naive").supports(p) is None


def test_unknown_free_memory_tries_the_problem(stand_in, monkeypatch):
    def broken():
        raise RuntimeError("no driver answer")

    monkeypatch.setattr(torch.cuda, "mem_get_info", broken)
    df = run_bench(["naive"])
    assert set(df.status) == {"baseline", "ok"}


def test_memory_needed_follows_the_op():
    p = Conv2dProblem(N=64, C=256, H=112, W=112, K=64, R=1, S=1, stride=2, dtype="fp16", layout="NHWC", op="dgrad")
    dy, w, dx = (math.prod(p.tensor_shape(n)) for n in ("dy", "w", "dx"))
    assert hb.memory_needed(p) == (2 * (dy + w) + 3 * dx) * 2 + hb.REFERENCE_BAND_BYTES
