"""``python -m benchmarks``: help, argument errors and the plain no-GPU message (exit codes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import gpu

ROOT = Path(__file__).resolve().parents[1]


def bench_cli(*args: str) -> subprocess.CompletedProcess:
    """Run ``python -m benchmarks ARGS`` from the repository root; capture its output."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_help():
    r = bench_cli("--help")
    assert r.returncode == 0, r.stderr
    for opt in ("--suite", "--variants", "--dtype", "--skip-big"):
        assert opt in r.stdout
    assert "quick" in r.stdout and "edge" in r.stdout


def test_unknown_suite_exits_2():
    r = bench_cli("--suite", "no_such_suite")
    assert r.returncode == 2
    assert "invalid choice" in r.stderr and "no_such_suite" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_dtype_exits_2():
    r = bench_cli("--dtype", "fp8")
    assert r.returncode == 2 and "invalid choice" in r.stderr


@pytest.mark.skipif(gpu.has_gpu(), reason="a GPU is present: the no-GPU message does not apply")
def test_no_gpu_exits_2_with_a_plain_message():
    r = bench_cli("--suite", "quick")
    assert r.returncode == 2
    assert "needs an NVIDIA GPU" in r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout == ""
    assert not list((ROOT / "benchmarks" / "results").glob("none/*"))  # nothing written for "no GPU"


def test_unknown_variant_exits_2_with_a_plain_message():
    """Reported as a bad argument on any machine (it used to be hidden behind the no-GPU message)."""
    r = bench_cli("--variants", "naive", "no_such_variant")
    assert r.returncode == 2
    assert "no variant 'no_such_variant'" in r.stderr and "known: " in r.stderr
    assert "Traceback" not in r.stderr


def plot_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.plot", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_plot_without_arguments_prints_usage():
    r = plot_cli()
    assert r.returncode == 2 and "usage: python -m benchmarks.plot" in r.stderr


def test_plot_missing_or_foreign_csv_exits_2_with_a_plain_message(tmp_path: Path):
    r = plot_cli(str(tmp_path / "missing.csv"))
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    foreign = tmp_path / "foreign.csv"
    foreign.write_text("a,b\n1,2\n")
    r = plot_cli(str(foreign))
    assert r.returncode == 2 and "lacks the column" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "foreign.png").exists()


def test_default_variants_follow_dtype_and_layout():
    """No flags: every variant (each adapted); --layout/--dtype: the ones that take them as they are."""
    from benchmarks.__main__ import default_variants, parse_args
    from helpers.variants import all_variants

    assert default_variants(parse_args([])) == [v for v in all_variants() if v.op == "fprop"]
    nhwc = {v.name for v in default_variants(parse_args(["--layout", "NHWC"]))}
    assert nhwc == {"im2col", "igemm_simt", "igemm_simt_analytic", "winograd_f2", "winograd_f4", "winograd_f2_fused",
                    "winograd_f4_fused"}
    fp16 = {v.name for v in default_variants(parse_args(["--dtype", "fp16", "--layout", "NHWC"]))}
    assert fp16 == {"igemm_wmma", "igemm_mma", "igemm_pipelined", "igemm_production", "igemm_wgmma", "igemm_split_k"}
    fp32 = {v.name for v in default_variants(parse_args(["--dtype", "fp32"]))}
    assert fp32 == {v.name for v in all_variants() if "NCHW" in v.layouts and "fp32" in v.dtypes}
    assert {"winograd_f2", "winograd_f4"} <= fp32  # --suite resnet50 --dtype fp32 runs day 20's variants


@pytest.mark.parametrize(
    "content, message", [("", "is empty"), ("variant,problem\n", "has a header but no rows"), (None, "is a folder")]
)
def test_plot_bad_csv_is_a_message_not_a_traceback(tmp_path: Path, capsys, content, message):
    from benchmarks.plot import main as plot_main

    target = tmp_path / "r.csv"
    if content is None:
        target = tmp_path
    else:
        target.write_text(content)
    assert plot_main([str(target)]) == 2
    assert message in capsys.readouterr().err


def test_readme_table_without_markers_is_a_message(tmp_path: Path, capsys):
    from benchmarks.readme_table import main as rt_main

    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n")
    assert rt_main(["--check", "--readme", str(readme)]) == 2
    assert "must contain <!-- overview:start -->" in capsys.readouterr().err
    assert rt_main(["--check", "--readme", str(tmp_path / "missing.md")]) == 2


def test_notebooks_go_on_past_a_file_that_is_no_notebook(tmp_path: Path, capsys):
    """A non-JSON file (merge-conflict markers) fails by itself; the notebooks after it still run."""
    from benchmarks import notebooks as nbrun

    bad = tmp_path / "day_98_bad.ipynb"
    bad.write_text('{"cells": [\n<<<<<<< HEAD\n]}\n')
    also_bad = tmp_path / "README.md"
    also_bad.write_text("# not a notebook\n")
    ran = []
    real = nbrun.execute

    def spy(path, timeout, kernel):
        ran.append(path.name)
        return real(path, timeout, kernel)

    nbrun.execute, saved = spy, nbrun.execute
    try:
        assert nbrun.main([str(bad), str(also_bad)]) == 1
    finally:
        nbrun.execute = saved
    err = capsys.readouterr().err
    assert ran == ["day_98_bad.ipynb", "README.md"]
    assert "cannot read day_98_bad.ipynb as a notebook: NotJSONError" in err and "2 notebook(s) failed" in err
    assert bad.read_text().startswith('{"cells": [\n<<<<<<<')  # left as it was


def test_a_dtype_no_variant_takes_exits_2_with_what_they_take():
    r = bench_cli("--dtype", "fp16")
    assert r.returncode == 2
    assert "no variant takes fp16 NCHW" in r.stderr and "fp16 NHWC" in r.stderr and "Traceback" not in r.stderr


def stand_in_gpu(monkeypatch):
    """Make ``python -m benchmarks`` believe a GPU is there (has_gpu, init, versions); return the
    ``helpers.bench`` module, whose ``bench`` the test then replaces."""
    import importlib

    hg = importlib.import_module("helpers.gpu")
    monkeypatch.setattr(hg, "has_gpu", lambda: True)
    monkeypatch.setattr(hg, "init", lambda device=0: None)
    monkeypatch.setattr(hg, "versions", lambda: {"gpu": "Test GPU", "driver": "0", "cuda": "0", "torch": "0",
                                                 "cudnn": "0", "pycuda": "0"})
    return importlib.import_module("helpers.bench")


def test_a_crash_inside_bench_keeps_the_rows_and_says_the_csv_is_partial(tmp_path: Path, monkeypatch, capsys):
    """An exception bench does not turn into a row (outside any (variant, problem)) ends the run
    with exit 1 and a message; the CSV written so far stays."""

    import pandas as pd

    from benchmarks.__main__ import main

    hb = stand_in_gpu(monkeypatch)

    def bench(vs, probs, on_rows=None, **kw):
        on_rows(pd.DataFrame([{"variant": "naive", "problem": probs[0].name, "ok": True, "status": "ok"}]))
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(hb, "bench", bench)
    assert main(["--suite", "quick", "--variants", "naive", "--out", str(tmp_path), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "stopped: RuntimeError: CUDA error" in err and "it is partial" in err
    assert len(pd.read_csv(tmp_path / "quick.csv")) == 1


@pytest.mark.parametrize("naive_ran", [False, True])
def test_a_named_variant_that_ran_on_nothing_exits_1(tmp_path: Path, monkeypatch, capsys, naive_ran):
    """``--variants naive`` where naive refused every problem checked and timed nothing: exit 1
    with a message naming it and why; the same run where naive ran exits 0."""
    import importlib

    import pandas as pd

    from benchmarks.__main__ import main

    hb = stand_in_gpu(monkeypatch)
    monkeypatch.setattr(importlib.import_module("benchmarks.plot"), "redraw", lambda csv: csv)

    def bench(vs, probs, **kw):
        ran = {"ok": True, "status": "ok", "ms_p50": 2.0, "x_cudnn": 0.5}
        refused = {"ok": None, "status": "unsupported: naive: planted refusal", "ms_p50": None, "x_cudnn": None}
        naive = ran if naive_ran else refused
        return pd.DataFrame([
            {"variant": "cudnn", "problem": p.name, "ok": None, "status": "baseline", "ms_p50": 1.0, "x_cudnn": 1.0,
             "tflops": 1.0} for p in probs
        ] + [{"variant": "naive", "problem": p.name, "tflops": None, **naive} for p in probs])

    monkeypatch.setattr(hb, "bench", bench)
    rc = main(["--suite", "quick", "--variants", "naive", "--out", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    if naive_ran:
        assert rc == 0 and "ran on no problem" not in err
    else:
        assert rc == 1 and "naive ran on no problem of the quick suite (unsupported)" in err


def test_a_run_that_checked_nothing_exits_1(tmp_path: Path, monkeypatch, capsys):
    """``--suite depthwise --dtype fp16 --layout NHWC``: every fp16 NHWC variant refuses every
    depthwise problem, so no (variant, problem) pair is checked; the run exits 1 with the reason
    (it exited 0). The bench stand-in refuses every pair, as the real one does there."""
    import importlib

    import pandas as pd

    from benchmarks.__main__ import default_variants, main, parse_args
    from helpers.suites import suite

    args = ["--suite", "depthwise", "--dtype", "fp16", "--layout", "NHWC"]
    vs = default_variants(parse_args(args))
    probs = suite("depthwise", dtype="fp16", layout="NHWC")
    refused = {(v.name, p.name): v.supports(p, smem_limit=2**31) for v in vs for p in probs}
    assert vs and all(refused.values())
    hb = stand_in_gpu(monkeypatch)
    monkeypatch.setattr(importlib.import_module("benchmarks.plot"), "redraw", lambda csv: csv)

    def bench(vs, probs, **kw):
        return pd.DataFrame([
            {"variant": "cudnn", "problem": p.name, "ok": None, "status": "baseline", "ms_p50": 1.0, "x_cudnn": 1.0,
             "tflops": 1.0} for p in probs
        ] + [{"variant": v.name, "problem": p.name, "ok": None, "status": f"unsupported: {refused[v.name, p.name]}",
              "ms_p50": None, "x_cudnn": None, "tflops": None} for v in vs for p in probs])

    monkeypatch.setattr(hb, "bench", bench)
    rc = main([*args, "--out", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1 and "no variant was checked on any problem of the depthwise suite in fp16 NHWC (unsupported)" in err


def test_op_selects_the_variants_that_compute_it():
    from benchmarks.__main__ import default_variants, parse_args

    assert parse_args([]).op == "fprop"
    assert [v.name for v in default_variants(parse_args(["--op", "dgrad"]))] == [
        "dgrad", "dgrad_wgmma", "dgrad_split_k"]
    assert [v.name for v in default_variants(parse_args(["--op", "wgrad"]))] == [
        "wgrad", "wgrad_serial", "wgrad_wgmma"]
    assert all(v.op == "fprop" for v in default_variants(parse_args(["--op", "fprop"])))
    with pytest.raises(SystemExit):
        parse_args(["--op", "backward"])


def test_every_variant_has_a_smoke_problem():
    """`python -m benchmarks.smoke` (the run compute-sanitizer watches) finds a small problem for
    every registered variant, on an H200-like device and on an sm_80 one with 48 KB (the Hopper-only
    variants: on the H200 alone)."""
    from benchmarks.smoke import smoke_problem
    from helpers.variants import all_variants

    for v in all_variants():
        for limit, cc in ((227 * 1024, (9, 0)), (48 * 1024, (8, 0))):
            if v.build_reason(cc):
                continue
            for c in v.configs_fn() if v.configs_fn else [v]:  # smoke --configs: each one forced
                p = smoke_problem(c, smem_limit=limit, cc=cc)
                assert p is not None, (c.name, limit, cc)
                assert p.x_numel < 10_000 and c.supports(p, smem_limit=limit, cc=cc) is None


def test_smoke_configs_expands_the_variants_with_several(monkeypatch, capsys):
    """``--configs`` replaces day 16's automatic variant by each of its compiled configurations
    and each schedule that loops over tiles on a grid of one block (a pair for the clusters): the
    sanitizers must see them all; without a GPU the run stops with status 2 after that."""
    import benchmarks.smoke as smoke
    from days.day16_igemm_wgmma import ENTRIES, PERSISTENT_MODES
    from helpers import gpu, variants

    v = variants.get("igemm_wgmma")
    forced = v.configs_fn()
    loops = [e for e in ENTRIES if e.mode in PERSISTENT_MODES]
    assert [c.name for c in forced] == [f"igemm_wgmma[{e.name}]" for e in ENTRIES] + [
        f"igemm_wgmma[{e.name}]_grid{2 if e.mode.startswith('cluster') else 1}" for e in loops]
    assert all(c.configs_fn is None for c in forced)
    assert variants.get("igemm_production").configs_fn is None
    seen = []
    monkeypatch.setattr(gpu, "has_gpu", lambda: seen.append(1) or False)
    assert smoke.main(["--variants", "igemm_wgmma", "--configs"]) == 2 and seen


def test_device_session_script_parses_and_refuses_an_unknown_part(tmp_path: Path):
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "device_session.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    env = {**os.environ, "OUT": str(tmp_path)}
    r = subprocess.run(["bash", str(script), "nope"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "unknown part nope" in r.stderr


def test_device_session_parts_pack_what_they_have_by_their_deadline(tmp_path: Path):
    """A part whose deadline (PART_LIMIT) has passed runs no more steps but still packs its
    tarball and exits 1 (a device call cut at its limit returns no files at all)."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "device_session.sh"
    env = {**os.environ, "OUT": str(tmp_path), "PART_LIMIT": "3"}
    r = subprocess.run(["bash", str(script), "tests", "tests/test_cli.py"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 1 and "skipped: the part's deadline" in r.stdout, r.stdout + r.stderr
    assert (tmp_path / "tests.tar.gz").is_file() and (tmp_path / "pytest.log").is_file()


def test_notebooks_record_run_time_and_peak_memory(tmp_path: Path):
    """A notebook that ran is saved without the measuring cell, and its wall time and peak GPU
    memory (0 on a machine without one) go to results/<gpu>/notebooks.csv, one row per notebook."""
    import nbformat
    import pandas as pd

    from benchmarks import notebooks as nbrun

    path = tmp_path / "day_97_tiny.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    assert nbrun.main([str(path), "--results", str(tmp_path / "results")]) == 0
    saved = nbformat.read(path, as_version=4)
    assert len(saved.cells) == 1 and saved.cells[0].outputs[0]["text"] == "42\n"
    (csv,) = (tmp_path / "results").glob("*/notebooks.csv")
    df = pd.read_csv(csv)
    assert list(df.notebook) == ["day_97_tiny"] and df.day[0] == 97 and df.seconds[0] > 0
    assert df.peak_gpu_mib[0] >= 0 and bool(df.quick[0])
    assert nbrun.peak_memory({"used": 3 * 2**30, "reserved": 2**30, "peak_reserved": 5 * 2**30}) == 7 * 2**30


def test_train_step_help_and_no_gpu_message():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "benchmarks.train_step", "--help"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "--batch" in r.stdout and "--steps" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "benchmarks.train_step", "--batch", "0"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "must be at least 1" in r.stderr and "Traceback" not in r.stderr  # GPU or not
    if gpu.has_gpu():
        return
    r = subprocess.run([sys.executable, "-m", "benchmarks.train_step"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "needs an NVIDIA GPU" in r.stderr and "Traceback" not in r.stderr


def test_train_step_kernel_sets_by_gpu():
    """Day 14's kernels everywhere; Hopper's too on compute capability 9.0 only (sm_90a code)."""
    from benchmarks.train_step import kernel_sets
    from days.day19_wgrad_wgmma import HOPPER_KERNELS

    assert list(kernel_sets((8, 0))) == ["days 13-14"]
    assert list(kernel_sets((9, 0))) == ["days 13-14", "days 16-19 (Hopper)"]
    assert kernel_sets((9, 0))["days 16-19 (Hopper)"] == HOPPER_KERNELS
    assert list(kernel_sets((12, 0))) == ["days 13-14"]


def test_train_step_host_time_enqueues_without_synchronising(monkeypatch):
    """`host_ms`: one call and a synchronisation, then `HOST_STEPS` calls timed back to back with no
    synchronisation among them, then one outside the time; milliseconds per call."""
    import time

    import torch

    from benchmarks.train_step import HOST_STEPS, host_ms

    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("sync"))
    ms = host_ms(lambda: events.append("step") or time.sleep(0.002))
    assert events == ["step", "sync", *["step"] * HOST_STEPS, "sync"]
    assert 2.0 <= ms < 1000
