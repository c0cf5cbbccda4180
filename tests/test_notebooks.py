"""The committed notebooks: valid, executed top to bottom without errors, named day by day.

The notebooks are executed on a GPU machine (nbclient) and committed with their outputs; here
we only read them, so a notebook committed unexecuted, half-executed, out of order or with an
error in an output fails CI, and so does one that shows a kernel file (``show_source``) other
than the one in ``kernels/conv2d`` now: the kernel changed after the notebook measured it.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"
KERNEL_DIR = ROOT / "kernels" / "conv2d"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))
NAME = re.compile(r"day_(\d{2})_[a-z0-9]+(?:_[a-z0-9]+)*\.ipynb")
CU_REF = re.compile(r"\b(\d{2}_[A-Za-z0-9_]+\.cu)\b")
RENDERED = re.compile(r"\*\*kernels/conv2d/(\S+)\*\*\n\n```cuda\n(.*)\n```", re.S)
EXCERPT = re.compile(r"\*\*kernels/conv2d/(\S+)\*\*, lines (\d+)–(\d+)\n\n```cuda\n(.*)\n```", re.S)

NB_PARAMS = [pytest.param(p, id=p.name) for p in NOTEBOOKS] or [
    pytest.param(None, marks=pytest.mark.skip(reason="no notebooks/*.ipynb committed yet"), id="none")
]


def read(path: Path) -> nbformat.NotebookNode:
    """Read and validate a notebook against the nbformat schema (raises on an invalid one)."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    return nb


def code_cells(nb: nbformat.NotebookNode) -> list:
    """The notebook's non-empty code cells, in order."""
    return [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]


@pytest.mark.parametrize("path", NB_PARAMS)
def test_executed_in_order_without_errors(path: Path):
    nb = read(path)
    cells = code_cells(nb)
    assert cells, f"{path.name} has no code"
    counts = [c.execution_count for c in cells]
    unexecuted = [i for i, n in enumerate(counts) if n is None]
    assert not unexecuted, f"{path.name}: code cells {unexecuted} were not executed"
    assert counts[0] == 1, (
        f"{path.name}: the first code cell has execution count {counts[0]}, not 1 (re-run from a fresh kernel)"
    )
    assert all(a < b for a, b in zip(counts, counts[1:])), f"{path.name}: execution counts out of order: {counts}"
    for i, c in enumerate(cells):
        for out in c.get("outputs", []):
            assert out.output_type != "error", f"{path.name} cell {i}: {out.get('ename')}: {out.get('evalue')}"
            if out.output_type == "stream" and out.name == "stderr":
                assert "Traceback" not in out.text, f"{path.name} cell {i}: a traceback on stderr:\n{out.text[-2000:]}"


@pytest.mark.parametrize("path", NB_PARAMS)
def test_kernel_files_referenced_exist(path: Path):
    nb = read(path)
    refs = {m for c in nb.cells for m in CU_REF.findall(c.source)}
    missing = sorted(r for r in refs if not (KERNEL_DIR / r).is_file())
    assert not missing, f"{path.name} refers to missing kernel files {missing} (looked in {KERNEL_DIR})"


def rendered_sources(nb: nbformat.NotebookNode) -> dict[str, tuple]:
    """The kernel files a notebook's outputs show whole (its ``show_source``: a Markdown output
    ``**kernels/conv2d/<file>**`` then the file in a ``cuda`` block): file name -> (text shown,
    the output holding it)."""
    shown = {}
    for c in code_cells(nb):
        for out in c.get("outputs", []):
            m = RENDERED.fullmatch(out.get("data", {}).get("text/markdown", ""))
            if m:
                shown[m.group(1)] = (m.group(2), out)
    return shown


def rendered_excerpts(nb: nbformat.NotebookNode) -> list[tuple[str, int, int, str]]:
    """The kernel excerpts a notebook's outputs show (`helpers.show.show_excerpt`: a Markdown
    output ``**kernels/conv2d/<file>**, lines a–b`` then those lines): (file, a, b, text shown)."""
    found = []
    for c in code_cells(nb):
        for out in c.get("outputs", []):
            m = EXCERPT.fullmatch(out.get("data", {}).get("text/markdown", ""))
            if m:
                found.append((m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)))
    return found


def stale_sources(nb: nbformat.NotebookNode) -> list[str]:
    """The kernel files shown in ``nb``, whole or in excerpts, whose text differs from the file's
    now (an excerpt: from the file's lines a..b now)."""
    stale = [f for f, (text, _) in rendered_sources(nb).items() if (KERNEL_DIR / f).read_text() != text]
    for f, a, b, text in rendered_excerpts(nb):
        path = KERNEL_DIR / f
        if not path.is_file() or "\n".join(path.read_text().splitlines()[a - 1 : b]) != text:
            stale.append(f"{f}, lines {a}–{b}")
    return stale


@pytest.mark.parametrize("path", NB_PARAMS)
def test_rendered_kernel_sources_are_the_files(path: Path):
    """A kernel edited after its notebook was executed leaves the notebook showing (and having
    measured) other code: re-execute it on the GPU machine."""
    stale = stale_sources(read(path))
    assert not stale, f"{path.name} shows {stale} as they were when it was executed; the files have changed since"


def test_a_kernel_edited_after_the_run_is_caught():
    """Day 16 shows its two files whole in its appendix (A.5, `show_source`); a dropped line in
    the rendered kernel no longer matches the file and is caught."""
    nb = read(NB_DIR / "day_16_igemm_wgmma.ipynb")
    shown = rendered_sources(nb)
    assert {"16_igemm_wgmma.cu", "hopper.cuh"} <= set(shown) and not stale_sources(nb)
    out = shown["16_igemm_wgmma.cu"][1]
    out.data["text/markdown"] = out.data["text/markdown"].replace("wgmma_wait<1>();", "", 1)  # a dropped wait
    assert stale_sources(nb) == ["16_igemm_wgmma.cu"]


def test_an_excerpt_of_a_kernel_edited_after_the_run_is_caught():
    """An excerpt (`helpers.show.show_excerpt`) is read back from the file's lines now: the same
    text passes; a changed line, or lines moved by an edit above them, are caught."""
    from helpers.show import excerpt_markdown

    md = excerpt_markdown("12_igemm_pipelined.cu", "for (int t = 0; t < steps; ++t) {", "__syncthreads();")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("show_excerpt(...)", outputs=[
        nbformat.v4.new_output("display_data", data={"text/markdown": md})])])
    assert len(rendered_excerpts(nb)) == 1 and stale_sources(nb) == []
    out = nb.cells[0].outputs[0]
    out.data["text/markdown"] = md.replace("__syncthreads();", "", 1)  # a dropped barrier
    assert len(stale_sources(nb)) == 1
    a = int(re.search(r"lines (\d+)", md).group(1))
    out.data["text/markdown"] = md.replace(f"lines {a}–", f"lines {a + 1}–", 1)  # the file grew above it
    assert len(stale_sources(nb)) == 1


def test_names_are_consecutive_days():
    if not NOTEBOOKS:
        pytest.skip("no notebooks/*.ipynb committed yet")
    bad = [p.name for p in NOTEBOOKS if not NAME.fullmatch(p.name)]
    assert not bad, f"notebook names must look like day_NN_name.ipynb (lower case); got {bad}"
    days = [int(NAME.fullmatch(p.name).group(1)) for p in NOTEBOOKS]
    assert days == list(range(len(days))), f"notebook days must run 00, 01, 02, ... without gaps or repeats; got {days}"


def test_cu_reference_pattern():
    assert CU_REF.findall('show_source("01_naive.cu") and kernels/conv2d/04_shared_halo_threads.cu') == [
        "01_naive.cu",
        "04_shared_halo_threads.cu",
    ]
    assert CU_REF.findall("conv2d_common.cuh and file.cuda") == []


@pytest.mark.parametrize("path", NB_PARAMS)
def test_a_day_fits_its_reading_budget(path: Path):
    """Before its appendix a day asks for about 3,000 words, 10 tables, 400 lines of notebook code
    and 400 lines of kernel source (`benchmarks.reading_budget`)."""
    from benchmarks.reading_budget import measure, over

    bad = over(measure(path))
    assert not bad, f"{path.stem} is over its reading budget: {', '.join(bad)}"


def test_the_reading_budget_counts_what_a_reader_reads(tmp_path):
    """Prose, tables (Markdown and DataFrames), code lines and CUDA shown count before the
    appendix and not after it; a day made to exceed one measure fails the check."""
    from benchmarks.reading_budget import BUDGET, TOLERANCE, measure, over

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Day 99\n\nFive words of prose here.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"),
        nbformat.v4.new_code_cell("x = 1\n\ny = 2\n", outputs=[nbformat.v4.new_output(
            "display_data", data={"text/html": "<table></table>", "text/markdown": "```cuda\nint a;\nint b;\n```"})]),
        nbformat.v4.new_markdown_cell("## Appendix · forensics\n\n" + "word " * 5000),
        nbformat.v4.new_code_cell("z = 3\n"),
    ]
    path = tmp_path / "day_99_x.ipynb"
    nbformat.write(nb, path)
    assert measure(path) == {"words": 7, "tables": 2, "code_lines": 2, "kernel_lines": 2}
    assert not over(measure(path))
    extra = int(BUDGET["words"] * TOLERANCE)  # past the tolerance with the 7 words above
    nb.cells[0].source += "word " * extra
    nbformat.write(nb, path)
    assert over(measure(path)) == [f"words {extra + 7} > {BUDGET['words']}"]
