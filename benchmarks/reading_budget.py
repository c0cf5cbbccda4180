"""python -m benchmarks.reading_budget: what each day asks a reader to read before its appendix.

    python -m benchmarks.reading_budget                   # every notebooks/day_*.ipynb, a table
    python -m benchmarks.reading_budget notebooks/day_12_igemm_pipelined.ipynb

A day is a lesson of about an hour: before its appendix at most about `BUDGET` of each measure
(day 12's shape, which cold readers graded A-). Counted from the notebook as committed, outputs
included, up to the first Markdown heading that names the appendix ("Appendix", or "A.1"-style
section numbers):

* ``words``: prose words of the Markdown cells and of the Markdown the code prints (generated
  paragraphs are read too), without code blocks and table rows;
* ``tables``: Markdown tables (in cells or printed) and HTML tables in outputs (a DataFrame);
* ``code_lines``: non-blank lines of the code cells;
* ``kernel_lines``: lines of CUDA shown, in ```cuda blocks of Markdown cells and outputs (a
  walked excerpt, or a whole file by ``show_source``).

`tests/test_notebooks.py` holds every day to the budget, with `TOLERANCE`, except the days it
lists as not yet within it (a list that may only shrink).

Exit status: 0 when every notebook given is within the budget, 1 otherwise.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET = {"words": 3000, "tables": 10, "code_lines": 400, "kernel_lines": 400}
TOLERANCE = 1.0  # the budget as the stop checklist counts it: nothing over
APPENDIX = re.compile(r"^#+\s*(?:[^\n]*\bappendix\b|A\.\d)", re.I)
CUDA_BLOCK = re.compile(r"```cuda\n(.*?)```", re.S)
CODE_BLOCK = re.compile(r"```.*?```", re.S)
TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$", re.M)
TABLE_ROW = re.compile(r"^\s*\|.*$", re.M)


def _prose(markdown: str) -> tuple[int, int, int]:
    """(words, tables, CUDA lines) of one Markdown text."""
    kernel = sum(m.group(1).count("\n") for m in CUDA_BLOCK.finditer(markdown))
    text = re.sub(r"^#+\s*", "", CODE_BLOCK.sub("", markdown), flags=re.M)  # a heading's marks are no words
    tables = len(TABLE_RULE.findall(text))
    words = len(TABLE_ROW.sub("", text).split())
    return words, tables, kernel


def measure(path: Path) -> dict:
    """The four measures of `BUDGET` for one notebook (see the module docstring)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    out = dict.fromkeys(BUDGET, 0)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            if APPENDIX.match(cell.source.strip()):
                break
            texts = [cell.source]
        elif cell.cell_type == "code":
            out["code_lines"] += sum(1 for line in cell.source.splitlines() if line.strip())
            texts = []
            for o in cell.get("outputs", []):
                data = o.get("data", {})
                out["tables"] += data.get("text/html", "").count("<table")
                texts.append(data.get("text/markdown", ""))
        else:
            continue
        for text in texts:
            words, tables, kernel = _prose(text)
            out["words"] += words
            out["tables"] += tables
            out["kernel_lines"] += kernel
    return out


def over(measures: dict) -> list[str]:
    """The measures past `BUDGET` × `TOLERANCE`, each as "name value > limit"."""
    return [f"{k} {v} > {BUDGET[k]}" for k, v in measures.items() if v > BUDGET[k] * TOLERANCE]


def main(argv: list[str] | None = None) -> int:
    paths = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    paths = paths or sorted((ROOT / "notebooks").glob("day_*.ipynb"))
    status = 0
    print(f"{'notebook':34s} {'words':>6s} {'tables':>6s} {'code':>5s} {'kernel':>6s}  (budget "
          f"{BUDGET['words']} / {BUDGET['tables']} / {BUDGET['code_lines']} / {BUDGET['kernel_lines']})")
    for p in paths:
        m = measure(p)
        bad = over(m)
        status |= bool(bad)
        print(f"{p.stem:34s} {m['words']:6d} {m['tables']:6d} {m['code_lines']:5d} {m['kernel_lines']:6d}"
              f"  {'over: ' + ', '.join(bad) if bad else 'within'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
