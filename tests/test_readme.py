"""The README's generated sections are up to date, and the CI script runs the README's command."""

from __future__ import annotations

import math
import os
import re
import stat
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import readme_table as rt

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TEST_COMMAND = "python -m ruff check . && python -m pytest -q tests"
VENV = "python3 -m venv .venv && . .venv/bin/activate"
TORCH_CPU = "torch==2.13.0+cpu --extra-index-url https://download.pytorch.org/whl/cpu"
README_COMMAND = f"python -m pip install -r requirements-cpu.txt && {TEST_COMMAND}"
README_LINES = [VENV, f"python -m pip install {TORCH_CPU}", README_COMMAND]


def test_committed_readme_is_not_stale():
    text = README.read_text()
    assert rt.render_readme(text) == text, "README.md is stale: run `python -m benchmarks.readme_table` and commit"
    assert rt.render_results() == (ROOT / "RESULTS.md").read_text(), "RESULTS.md is stale: run the same and commit"


def test_readme_opens_on_the_picture_the_table_and_start_here():
    """The first screen: one sentence, the overview (its picture and each day's table), then
    "Start here"; the install commands come later; the README stays short (results in RESULTS.md)."""
    text = README.read_text()
    heads = re.findall(r"^## (.+)$", text, re.M)
    assert heads[0] == "Start here" and heads.index("Setup") > heads.index("The days")
    overview = text[text.index("<!-- overview:start -->") : text.index("<!-- overview:end -->")]
    assert "![" in overview and "| day | idea |" in overview
    assert text.index("<!-- overview:start -->") < text.index("## Start here") < text.index("```bash")
    assert "<!-- results:start -->" not in text and "[RESULTS.md](RESULTS.md)" in text
    prose = re.sub(r"<!-- (curriculum|overview):start -->.*?<!-- (curriculum|overview):end -->", "", text, flags=re.S)
    assert len(prose.split()) < 1300, len(prose.split())  # the generated tables apart: ~2,200 words in all
    assert "[HARNESS.md](HARNESS.md)" in text  # the harness and adding a variant: a page of their own


def test_regenerating_twice_changes_nothing():
    once = rt.render_readme(README.read_text())
    assert rt.render_readme(once) == once


def test_readme_links_existing_files():
    text = README.read_text() + (ROOT / "HARNESS.md").read_text()
    links = re.findall(r"\]\(((?:notebooks|benchmarks|kernels|helpers|tests)/[^)#]+)\)", text)
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_readme_and_ci_run_the_same_command():
    """The README's (b), three lines (a venv, PyTorch's CPU build, the requirements and the
    tests), is what .ci/run runs (quietly)."""
    text = README.read_text()
    assert "\n".join(README_LINES) in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in ci
    assert VENV in ci and f"python -m pip install -q {TORCH_CPU}" in ci
    assert "python -m pip install -q -r requirements-cpu.txt" in ci
    assert TEST_COMMAND in ci
    assert os.stat(ROOT / ".ci" / "run").st_mode & stat.S_IXUSR, ".ci/run must be executable"


def test_cpu_requirements_pin_torch_and_leave_out_pycuda():
    reqs = [ln.split("#")[0].strip() for ln in (ROOT / "requirements-cpu.txt").read_text().splitlines()]
    reqs = [r for r in reqs if r]
    assert "torch==2.13.0+cpu" in reqs  # PyTorch's CPU build: an unpinned torch downloads a multi-GB CUDA build
    names = {re.split(r"[<>=!~\[ ]", r)[0].lower() for r in reqs}
    assert not names & {"pycuda", "lovely-tensors"}
    assert {"pytest", "ruff", "nbformat", "nbclient", "numpy", "pandas"} <= names
    runtime = {re.split(r"[<>=!~\[ ]", ln)[0].lower() for ln in (ROOT / "requirements.txt").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")}
    assert {"pycuda", "torch", "lovely-tensors", "jupyter", "tqdm", "scikit-image", "pytest", "ruff"} <= runtime
    floor = re.search(r"^pycuda>=(\d+)\.(\d+)", (ROOT / "requirements.txt").read_text(), re.M)
    assert floor and (int(floor[1]), int(floor[2])) >= (2026, 1)  # 2025.1.1 fails to build against CUDA 13


# ---- the generator on synthetic inputs -------------------------------------------------------


def test_no_results_yet(tmp_path: Path):
    assert rt.results_section(tmp_path) == rt.NO_RESULTS == "No results committed yet."


def _fake_results(results_dir: Path) -> None:
    meta = dict(gpu="NVIDIA H200", driver="580.95.05", cuda="13.0", torch="2.13.0", cudnn="91500",
                cudnn_fp32_precision="ieee", suite="quick", date="2026-11-30")
    nan = math.nan
    rows = [
        dict(variant="cudnn", day=0, problem="a", ok=None, status="baseline", ms_p50=1.0, x_cudnn=1.0),
        dict(variant="naive", day=1, problem="a", ok=True, status="ok", ms_p50=4.0, x_cudnn=0.25),
        dict(variant="z_out", day=2, problem="a", ok=True, status="ok", ms_p50=0.5, x_cudnn=2.0),
        dict(variant="cudnn", day=0, problem="b", ok=None, status="baseline", ms_p50=2.0, x_cudnn=1.0),
        dict(variant="naive", day=1, problem="b", ok=True, status="ok", ms_p50=2.0, x_cudnn=1.0),
        dict(variant="z_out", day=2, problem="b", ok=False, status="FAIL normal", ms_p50=nan, x_cudnn=nan),
        dict(variant="cudnn", day=0, problem="c", ok=None, status="baseline", ms_p50=1.0, x_cudnn=1.0),
        dict(variant="naive", day=1, problem="c", ok=None, status="unsupported: x", ms_p50=nan, x_cudnn=nan),
        dict(variant="z_out", day=2, problem="c", ok=True, status="ok", ms_p50=0.125, x_cudnn=8.0),
    ]
    rows = [{**r, "dtype": "fp32", "layout": "NCHW"} for r in rows]
    rows += [  # a variant run in its own layout, against its own baseline, and one that refused everything
        dict(variant="cudnn fp32 NHWC", day=0, problem="a", ok=None, status="baseline", ms_p50=1.0, x_cudnn=1.0,
             dtype="fp32", layout="NHWC"),
        dict(variant="im2col", day=8, problem="a", ok=True, status="ok", ms_p50=2.0, x_cudnn=0.5, dtype="fp32",
             layout="NHWC"),
        *[dict(variant="depthwise", day=7, problem=q, ok=None, status="unsupported: groups", ms_p50=nan,
               x_cudnn=nan, dtype="fp32", layout="NCHW") for q in "abc"],
    ]
    d = results_dir / "nvidia-h200"
    d.mkdir(parents=True)
    pd.DataFrame([{**r, **meta} for r in rows]).to_csv(d / "quick.csv", index=False)
    pd.DataFrame([{**r, **meta, "suite": "edge"} for r in rows[:3]]).to_csv(d / "edge.csv", index=False)
    l4 = results_dir / "nvidia-l4"
    l4.mkdir()
    pd.DataFrame([{**r, **meta, "gpu": "NVIDIA L4"} for r in rows[:2]]).to_csv(l4 / "quick.csv", index=False)


def test_results_tables(tmp_path: Path):
    _fake_results(tmp_path)
    out = rt.results_section(tmp_path)
    headings = re.findall(r"^### (.*)$", out, flags=re.M)
    assert headings == ["NVIDIA H200 — `quick`", "NVIDIA H200 — `edge`", "NVIDIA L4 — `quick`"]
    h200_quick = out.split("### ")[1]
    assert "driver 580.95.05 · CUDA 13.0 · torch 2.13.0 · cuDNN 91500 (fp32 precision: ieee)" in h200_quick
    assert "3 problems" in h200_quick and "2026-11-30" in h200_quick
    assert "| cudnn | baseline | fp32 NCHW | baseline | baseline | 3 | 1.000 |" in h200_quick
    assert "| naive | 01 | fp32 NCHW | 2 | 2 | 2 | 0.500 |" in h200_quick  # geomean(0.25, 1.0)
    assert "| z_out | 02 | fp32 NCHW | 3 | 2 | 2 | 4.000 |" in h200_quick  # geomean(2, 8); the failed run not timed
    assert "| cudnn fp32 NHWC | baseline | fp32 NHWC | baseline | baseline | 1 | 1.000 |" in h200_quick
    assert "| im2col | 08 | fp32 NHWC | 1 | 1 | 1 | 0.500 |" in h200_quick
    assert "| depthwise |" not in h200_quick  # refused every problem: counted, not a row of zeros
    assert "1 variant(s) refused every problem of this suite: depthwise." in h200_quick
    assert "[CSV](benchmarks/results/nvidia-h200/quick.csv)" in h200_quick


def test_tuning_and_training_step_tables(tmp_path: Path):
    """A GPU's tuning run (with the model's top-1 / top-3 over the exhaustive best where it swept,
    "—" where it did not) and its training step, eager and graphed, each a table after the suites."""
    gpu_dir = tmp_path / "nvidia-h100"
    gpu_dir.mkdir()
    pd.DataFrame({"problem": ["a", "b"], "status": ["ok", "ok"], "tune_s": [1.0, 2.0], "ms": [1.0, 1.0],
                  "best_ms": [1.0, 0.81], "sweep_best_ms": [1.0, 0.81], "top1_ms": [1.0, 0.9], "top3_ms": [1.0, 0.81],
                  "x_cudnn": [1.0, 1.0],
                  "rule_x_cudnn": [0.9, 0.9], "gpu": "NVIDIA H100"}).to_csv(gpu_dir / "tune_resnet50_x_fp16_NHWC.csv",
                                                                           index=False)
    pd.DataFrame({"problem": ["a"], "status": ["ok"], "tune_s": [1.0], "ms": [1.0], "gpu": "NVIDIA H100"}).to_csv(
        gpu_dir / "tune_outside_x_fp16_NHWC.csv", index=False)
    pd.DataFrame([{"kernels": "days 13-14", "ms_p50": 4.0, "torch_ms_p50": 3.0, "x_torch": 0.75, "host_ms": 5.0,
                   "torch_host_ms": 4.0, "graph_ms_p50": 2.0, "torch_graph_ms_p50": 2.5, "x_torch_graph": 1.25,
                   "gpu": "NVIDIA H100", "batch": 64, "torch": "2.11", "date": "2026-12-07"}]).to_csv(
        gpu_dir / rt.TRAIN_STEP_CSV, index=False)
    pd.DataFrame({"problem": ["a"], "status": ["ok"], "tune_s": [0.0], "config": ["c"]}).to_csv(
        gpu_dir / "tune_resnet50_x_fp16_NHWC_untimed.csv", index=False)  # --no-time: nothing tuned, no row
    out = rt.results_section(tmp_path)
    assert "untimed" not in out
    assert "| [resnet50_x_fp16_NHWC](benchmarks/results/nvidia-h100/tune_resnet50_x_fp16_NHWC.csv) | 2 of 2 | 3.0 | " \
           "1.000 | 0.900 | 0.900 | 0.949 | 1.000 |" in out  # top-1: geomean(1, 0.9)
    assert "| [outside_x_fp16_NHWC](benchmarks/results/nvidia-h100/tune_outside_x_fp16_NHWC.csv) | 1 of 1 | 1.0 | " \
           "— | — | — | — | — |" in out
    assert "### NVIDIA H100 — training step" in out and out.index("training step") > out.index("tuning")
    assert "| days 13-14 | 4.000 | 3.000 | 0.750 | 5.000 | 4.000 | 2.000 | 2.500 | 1.250 |" in out


def test_render_readme_replaces_only_between_markers(tmp_path: Path):
    _fake_results(tmp_path / "results")
    (tmp_path / "nb").mkdir()
    (tmp_path / "nb" / "day_01_naive.ipynb").write_text("{}")
    text = (
        "intro\n<!-- overview:start -->\nSTALE\n<!-- overview:end -->\n"
        "mid\n<!-- curriculum:start -->\nSTALE\n<!-- curriculum:end -->\nend\n"
    )
    new = rt.render_readme(text, results_dir=tmp_path / "results", nb_dir=tmp_path / "nb")
    assert new.startswith("intro\n<!-- overview:start -->\n![") and new.endswith("<!-- curriculum:end -->\nend\n")
    assert "\nmid\n<!-- curriculum:start -->\n| day |" in new and "STALE" not in new
    assert "| 01 | [day_01_naive](notebooks/day_01_naive.ipynb) |" in new
    assert "| 02 | planned |" in new
    assert rt.render_readme(new, results_dir=tmp_path / "results", nb_dir=tmp_path / "nb") == new


def test_overview_takes_each_days_fastest_variant_of_one_run(tmp_path: Path):
    """The first table: per day the variant with the best geomean over the problems it passed
    (z_out's failed problem left out), from the quick run that covers the most days (the H200's
    three days, not the L4's one)."""
    _fake_results(tmp_path)
    assert rt.overview_csv(tmp_path) == tmp_path / "nvidia-h200" / "quick.csv"
    out = rt.overview_section(tmp_path)
    assert "| 02 | one block z per output channel | `z_out` | 4.00 (2 of 3 layers) | — |" in out  # geomean(2, 8)
    assert "| 01 | one thread per output pixel | `naive` | 0.50 (2 of 3 layers) | — |" in out
    assert "| 16 | Hopper: TMA, wgmma, mbarriers | — | — | — |" in out
    assert "| 17 | Hopper: warp specialisation, the rule | — | — | — |" in out
    assert "| 18 | dgrad on Hopper | — | — | — |" in out  # a dgrad: not in the forward suites
    assert "NVIDIA H200" in out and "(benchmarks/results/overview.png)" in out
    assert rt.draw_overview(tmp_path / "o.png", tmp_path).stat().st_size > 10_000


def test_curriculum_shows_the_gpu_and_the_measured_notebook_costs(tmp_path: Path):
    """The GPU each day needs (day 16: sm_90a only), and from results/<gpu>/notebooks.csv each
    notebook's run time and peak memory, with whether it fits an 8 GB laptop GPU."""
    d = tmp_path / "nvidia-h100"
    d.mkdir()
    pd.DataFrame([
        dict(notebook="day_01_naive", day=1, seconds=90.0, peak_gpu_mib=700, quick=True, gpu="NVIDIA H100",
             date="2026-12-07"),
        dict(notebook="day_08_im2col", day=8, seconds=150.0, peak_gpu_mib=12 * 1024, quick=True, gpu="NVIDIA H100",
             date="2026-12-07"),
    ]).to_csv(d / "notebooks.csv", index=False)
    table = rt.curriculum_table(tmp_path, registered={1: ["naive"]}, results_dir=tmp_path)
    rows = {ln.split(" | ")[0]: ln for ln in table.splitlines() if ln.startswith("| ")}
    assert "| sm_75+ | 1.5 | 0.7 GiB | yes |" in rows["| 01"]
    assert "| sm_75+ | 2.5 | 12.0 GiB | no |" in rows["| 08"]
    assert "| sm_90a only | — | — | — |" in rows["| 16"] and "| sm_80+ |" in rows["| 13"]
    assert "| sm_90a only | — | — | — |" in rows["| 17"]  # day 16's kernel, no variant of its own
    assert "| sm_90a only | — | — | — |" in rows["| 18"]  # dgrad_wgmma: sm_90a, not yet measured
    assert "| sm_90a only | — | — | — |" in rows["| 19"]  # wgrad_wgmma: sm_90a, not yet measured
    assert "NVIDIA H100" in table.splitlines()[-1]


def test_curriculum_lists_registered_or_planned_variants(tmp_path: Path):
    table = rt.curriculum_table(tmp_path, registered={1: ["naive"], 4: ["a", "b"]}, results_dir=tmp_path)
    lines = table.split("\n\n")[0].splitlines()
    assert len(lines) == 2 + len(rt.CURRICULUM) and lines[2].startswith("| 00 | planned |")
    assert lines[3].endswith("| `naive` |") and lines[6].endswith("| `a`, `b` |")
    assert lines[4].endswith("| *z_out* |")


@pytest.mark.parametrize(
    "text",
    ["no markers", "<!-- results:start -->", "<!-- results:end --> <!-- results:start -->",
     "<!-- results:start --><!-- results:start --><!-- results:end -->"],
)
def test_replace_between_refuses_bad_markers(text: str):
    with pytest.raises(ValueError, match="results"):
        rt.replace_between(text, "results", "body")


def test_check_flag(tmp_path: Path):
    readme = tmp_path / "README.md"
    readme.write_text(README.read_text())
    assert rt.main(["--check", "--readme", str(readme)]) == 0
    readme.write_text(README.read_text().replace("<!-- overview:start -->\n", "<!-- overview:start -->\nstale\n"))
    assert rt.main(["--check", "--readme", str(readme)]) == 1
    assert rt.main(["--readme", str(readme)]) == 0
    assert readme.read_text() == README.read_text()


def test_unchecked_timings_are_listed_apart(tmp_path: Path):
    """Rows timed with --no-check never enter a variant's checked geomean."""
    rows = [
        dict(variant="cudnn", day=0, problem="a", ok=None, status="baseline", ms_p50=1.0, x_cudnn=1.0),
        dict(variant="naive", day=1, problem="a", ok=True, status="ok", ms_p50=4.0, x_cudnn=0.25),
        dict(variant="naive", day=1, problem="b", ok=None, status="unchecked", ms_p50=0.1, x_cudnn=10.0),
    ]
    d = tmp_path / "nvidia-h200"
    d.mkdir()
    pd.DataFrame([{**r, "gpu": "NVIDIA H200", "dtype": "fp32", "layout": "NCHW"} for r in rows]).to_csv(
        d / "quick.csv", index=False
    )
    out = rt.results_section(tmp_path)
    assert "| naive | 01 | fp32 NCHW | 1 | 1 | 1 | 0.250 |" in out
    assert "| naive (unchecked) | 01 | fp32 NCHW | unchecked | unchecked | 1 | 10.000 |" in out


def test_baselines_with_errors_and_memory_skips_are_not_refusals(tmp_path: Path):
    rows = [
        dict(variant="cudnn", day=0, problem="a", ok=None, status="baseline", ms_p50=1.0, x_cudnn=1.0),
        dict(variant="cudnn fp16 NHWC", day=0, problem="a", ok=None, status="error: cuDNN refused", ms_p50=math.nan,
             x_cudnn=math.nan),
        dict(variant="naive", day=1, problem="a", ok=True, status="ok", ms_p50=2.0, x_cudnn=0.5),
        dict(variant="naive", day=1, problem="b", ok=False, status="error: RuntimeError: fault", ms_p50=math.nan,
             x_cudnn=math.nan),
        dict(variant="z_out", day=2, problem="a", ok=None, status="skipped: needs about 40 GB", ms_p50=math.nan,
             x_cudnn=math.nan),
        dict(variant="depthwise", day=7, problem="a", ok=None, status="unsupported: groups", ms_p50=math.nan,
             x_cudnn=math.nan),
    ]
    d = tmp_path / "nvidia-h200"
    d.mkdir()
    pd.DataFrame([{**r, "gpu": "NVIDIA H200", "dtype": "fp32", "layout": "NCHW"} for r in rows]).to_csv(
        d / "quick.csv", index=False
    )
    out = rt.results_section(tmp_path)
    assert "| naive | 01 | fp32 NCHW | 2 | 1 | 1 | 0.500 |" in out  # the fault counts as checked, failed
    assert "| cudnn fp16 NHWC | baseline |" in out
    assert "1 variant(s) refused every problem of this suite: depthwise." in out
    assert "1 variant(s) skipped every problem (not enough device memory, or no input kind applies): z_out." in out
