"""The machine probe on a real GPU (issue 46, item 2; tests/test_machine_probe.py is the CPU half):
its values are plausible for the device, a second call answers from the cache with the same
Machine, and the tuner runs a real search with the measured machine."""

from __future__ import annotations

import dataclasses

import pytest

from helpers import gpu
from helpers import tune as ht
from helpers.problem import Conv2dProblem
from helpers.tune import probe

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def measured():
    """(the device's info, one `probe.measure` of it); the tests skip below sm_80 (no mma.sync f16)."""
    info = gpu.device_info()
    if info.cc < (8, 0):
        pytest.skip(f"the machine probe needs sm_80 or newer; {info.name} is sm_{info.cc[0]}{info.cc[1]}")
    return info, probe.measure(info)


def test_the_probes_values_are_plausible_for_the_device(measured):
    info, m = measured
    assert (m.sms, m.smem_per_sm, m.regs_per_sm, m.threads_per_sm, m.l2_bytes) == (
        info.sms, info.smem_per_sm, info.regs_per_sm, info.threads_per_sm, info.l2_bytes)
    assert m.blocks_per_sm == info.blocks_per_sm and m.smem_reserved_per_block == info.smem_reserved_per_block
    assert 100 < m.dram_gbps < 10_000, m  # 0.1 to 10 TB/s: a laptop GPU to an HBM3e part
    assert m.l2_gbps > m.dram_gbps, m
    assert m.mma_tflops > 1.5 * m.fma_tflops, m  # fp16 mma with fp32 sums: at least twice fp32 FMA on sm_80+
    if info.peak_fp32_tflops:  # the estimate at the driver's top clock: a ceiling the FMA probe nears
        assert 0.3 * info.peak_fp32_tflops < m.fma_tflops < 1.1 * info.peak_fp32_tflops, (m, info.peak_fp32_tflops)
    assert 0.5 < m.launch_us < 50, m


def test_a_second_call_answers_from_the_cache_with_the_same_machine(measured, tmp_path, monkeypatch):
    info, m = measured
    monkeypatch.setattr(probe, "_memo", {})
    calls = []
    real = probe.measure
    monkeypatch.setattr(probe, "measure", lambda info=None: calls.append(1) or real(info))
    path = tmp_path / "machine.json"
    first = probe.machine_for(info, path)
    assert len(calls) == 1
    assert probe.machine_for(info, path) is first and len(calls) == 1  # this process's answer
    monkeypatch.setattr(probe, "_memo", {})
    assert probe.machine_for(info, path) == first and len(calls) == 1  # the file's, as another process reads it
    for k in ("mma_tflops", "fma_tflops", "dram_gbps", "l2_gbps"):  # two measurements agree within 25 %
        assert 0.8 < getattr(first, k) / getattr(m, k) < 1.25, (k, first, m)


def test_the_tuner_runs_with_the_measured_machine(measured, tmp_path, monkeypatch):
    """A real search: its candidates are ranked on `machine_for`'s machine, and it finds a winner."""
    monkeypatch.setenv(probe.MACHINE_CACHE_ENV, str(tmp_path / "machine.json"))
    monkeypatch.setattr(probe, "_memo", {})
    sp = ht.space_of("igemm_production")
    seen = []
    spy = dataclasses.replace(sp, candidates=lambda p, mc: seen.append(mc) or sp.candidates(p, mc))
    p = Conv2dProblem(N=8, C=64, H=28, W=28, K=128, R=3, S=3, padding=1, dtype="fp16", layout="NHWC")
    row = ht.tune_problem(spy, p, ht.TuneCache(tmp_path / "tune.json"), keep=4)
    assert row["status"] == "ok" and row["ms"] > 0 and row["disagreed"] == 0 and row["faulted"] == 0
    assert seen and all(mc == probe.machine_for() for mc in seen)
    assert seen[0].sms == gpu.device_info().sms and seen[0] != ht.H200
