"""python -m benchmarks.notebooks: execute the day notebooks in place and keep their outputs.

    python -m benchmarks.notebooks                                  # every notebooks/day_*.ipynb, in order
    python -m benchmarks.notebooks notebooks/day_01_naive.ipynb     # just these
    python -m benchmarks.notebooks --full                           # QUICK = False inside the notebooks

Each notebook runs top to bottom in a fresh ``python3`` kernel whose working directory is the
notebook's own folder, with a time limit per cell. A notebook is written back only when every
cell succeeded; then its outputs are kept and the volatile metadata (per-cell execution
timestamps, notebook-level widget state) is removed, so re-running changes only what the GPU
measured. When a cell fails, the file on disk is left exactly as it was, the error is printed,
the remaining notebooks still run, and the command exits 1.

The notebooks read ``CONV2D_DAYS_QUICK`` from the environment (``--full`` sets it to 0), which
the kernel inherits from this process.

Each notebook that ran is also measured, for the README's curriculum table: its wall time and
its peak GPU memory, read inside its kernel after the last cell (a cell appended for the run and
removed before saving): the CUDA context and whatever else the process holds outside torch's
allocator (the device's used memory minus torch's reserved memory, `torch.cuda.mem_get_info`)
plus torch's peak reserved memory (`torch.cuda.max_memory_reserved`, cuDNN's workspaces
included). The rows go to ``benchmarks/results/<gpu>/notebooks.csv`` (one per notebook, the
latest run's), with the GPU and versions.

Exit status: 0 if every notebook ran, 1 if any cell failed, 2 on bad arguments (missing file).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
QUICK_ENV = "CONV2D_DAYS_QUICK"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def default_notebooks() -> list[Path]:
    """The day notebooks, ``notebooks/day_*.ipynb``, in curriculum (file name) order."""
    return sorted(NOTEBOOK_DIR.glob("day_*.ipynb"))


def strip_volatile(nb) -> None:
    """Remove metadata that changes on every run, in place; outputs are kept.

    Drops each cell's ``metadata.execution`` (start/end timestamps), the notebook's
    ``metadata.widgets`` (ipywidgets state), and widget-view entries from output bundles (they
    cannot render without that state; their ``text/plain`` fallback stays).
    """
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        kept = []
        for out in cell.outputs:
            data = out.get("data")
            if data is not None and WIDGET_MIME in data:
                data.pop(WIDGET_MIME)
                if not data:
                    continue
            kept.append(out)
        cell.outputs = kept


MEMORY_TAG = "__conv2d_days_memory__"
MEMORY_CELL = f"""import json as _json, torch as _torch
_m = {{"used": 0, "reserved": 0, "peak_reserved": 0}}
if _torch.cuda.is_available():
    _free, _total = _torch.cuda.mem_get_info()
    _m = {{"used": _total - _free, "reserved": _torch.cuda.memory_reserved(),
          "peak_reserved": _torch.cuda.max_memory_reserved()}}
print("{MEMORY_TAG}" + _json.dumps(_m))"""


def peak_memory(measures: dict) -> int:
    """Peak GPU bytes of a notebook's process from `MEMORY_CELL`'s measures: what it held outside
    torch's allocator at the end (the CUDA context, modules) plus torch's peak reserved memory."""
    return max(measures["used"] - measures["reserved"], 0) + measures["peak_reserved"]


def execute(path: Path, timeout: int, kernel: str):
    """Execute the notebook at ``path``; return ``(notebook, error, peak GPU bytes or None)``.

    ``error`` is None on success, else a message naming the failing cell (the notebook is then
    partially executed and must not be saved). The peak is measured by `MEMORY_CELL`, appended
    for the run and removed from the returned notebook.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:  # noqa: BLE001 - not JSON (e.g. merge-conflict markers), not a notebook, unreadable
        error = f"cannot read {path.name} as a notebook: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        return None, error, None
    nb.cells.append(nbformat.v4.new_code_cell(MEMORY_CELL))
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=kernel,
        allow_errors=False,
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as e:
        return nb, f"{type(e).__name__}: {e}", None
    probe = nb.cells.pop()
    for i, cell in enumerate(nb.cells):  # belt and braces: nbclient raises on errors already
        if cell.cell_type == "code" and any(o.get("output_type") == "error" for o in cell.outputs):
            return nb, f"cell {i} has an error output", None
    text = "".join(o.get("text", "") for o in probe.outputs if o.get("output_type") == "stream")
    line = next((ln for ln in text.splitlines() if ln.startswith(MEMORY_TAG)), None)
    return nb, None, peak_memory(json.loads(line.removeprefix(MEMORY_TAG))) if line else None


def record(rows: list[dict], results: Path) -> Path:
    """Merge ``rows`` (notebook, day, seconds, peak_gpu_mib, quick) into ``results/<gpu>/notebooks.csv``
    with the GPU and versions (`helpers.gpu.versions`) and the date; a notebook's older row is
    replaced. Returns the CSV's path."""
    import datetime as dt

    import pandas as pd

    from helpers import gpu

    v = gpu.versions()
    meta = {"gpu": v["gpu"], "driver": v["driver"], "cuda": v["cuda"], "torch": v["torch"],
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")}
    csv = results / gpu.gpu_slug(v["gpu"]) / "notebooks.csv"
    csv.parent.mkdir(parents=True, exist_ok=True)
    new = pd.DataFrame([{**r, **meta} for r in rows])
    if csv.is_file():
        old = pd.read_csv(csv)
        new = pd.concat([old[~old.notebook.isin(new.notebook)], new], ignore_index=True)
    new.sort_values("notebook").to_csv(csv, index=False)
    return csv


def save(nb, path: Path) -> None:
    """Validate and write ``nb`` to ``path`` atomically (a temporary file, then a rename)."""
    import nbformat

    nbformat.validate(nb)
    tmp = path.with_name(path.name + ".tmp")
    nbformat.write(nb, tmp)
    os.replace(tmp, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.notebooks", description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", type=Path, help="notebooks to run (default: notebooks/day_*.ipynb)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds allowed per cell (default: 900)")
    ap.add_argument("--kernel", default="python3", help="Jupyter kernel name (default: python3)")
    ap.add_argument("--full", action="store_true", help="run with QUICK = False (bigger sweeps, every edge problem)")
    ap.add_argument("--no-record", dest="record", action="store_false",
                    help="do not write the run times and peak memory to results/<gpu>/notebooks.csv")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the notebooks; return the exit status."""
    args = parse_args(argv)
    paths = [p.resolve() for p in args.paths] or default_notebooks()
    missing = [p for p in paths if not p.is_file()]
    if missing or not paths:
        print(f"python -m benchmarks.notebooks: no such notebook: {', '.join(map(str, missing)) or 'none found'}",
              file=sys.stderr)
        return 2
    os.environ[QUICK_ENV] = "0" if args.full else "1"
    failed = []
    for path in paths:
        t0 = time.perf_counter()
        print(f"running {path.name} ...", flush=True)
        nb, error, peak = execute(path, args.timeout, args.kernel)
        dt = time.perf_counter() - t0
        if error:
            failed.append(path.name)
            print(f"FAILED  {path.name} after {dt:.0f} s; the file was left unchanged\n{error}", file=sys.stderr)
            continue
        strip_volatile(nb)
        save(nb, path)
        mib = None if peak is None else round(peak / 2**20)
        row = {"notebook": path.stem, "day": int(path.stem.split("_")[1]), "seconds": round(dt, 1),
               "peak_gpu_mib": mib, "quick": not args.full}
        print(f"ok      {path.name} ({dt:.0f} s, peak GPU memory {mib} MiB), outputs saved", flush=True)
        if args.record:  # one notebook at a time: a run stopped part-way keeps what it measured
            print(f"recorded its run time and peak GPU memory in {record([row], args.results)}", flush=True)
    if failed:
        print(f"\n{len(failed)} notebook(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
