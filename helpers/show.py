"""What the day notebooks show and measure besides a kernel's own check and benchmark: kernel
source whole or in excerpts, Python source, the edge suite's checks as a table, the copy
bandwidth (a memory roof) and an occupancy estimate.

Every day used to define these in its own notebook (``show_source`` thirteen times,
``resident_blocks_per_sm`` eight times in four versions); here they are one copy, linted and
tested. The kernel's text is always read from its file in ``kernels/conv2d``, the only copy, and
the Markdown it renders has a fixed shape a test reads back (``tests/test_notebooks.py``), so a
notebook that shows a kernel edited after the notebook ran is caught:

* whole: ``**kernels/conv2d/<file>**`` then the file in a ``cuda`` block;
* an excerpt: ``**kernels/conv2d/<file>**, lines <a>–<b>`` then lines a..b (1-based, inclusive).

    from helpers.show import show_source, show_excerpt, check_edge
    show_excerpt("13_igemm_production.cu", "struct TileDesc", "};")
"""

from __future__ import annotations

import inspect

import pandas as pd
import torch
from IPython.display import Markdown, display

from . import gpu, suites
from .check import check
from .compile import kernel_path
from .timing import time_gpu
from .variants import get


def source_markdown(cu_file: str) -> str:
    """The Markdown `show_source` renders for ``kernels/conv2d/<cu_file>`` (the whole file)."""
    return f"**kernels/conv2d/{cu_file}**\n\n```cuda\n{kernel_path(cu_file).read_text()}\n```"


def show_source(cu_file: str) -> None:
    """Render a kernel file (the only copy of the kernel) whole, as a highlighted CUDA block.

    Raises:
        FileNotFoundError: no such file in ``kernels/conv2d``.
    """
    display(Markdown(source_markdown(cu_file)))


def excerpt_lines(cu_file: str, first: str, last: str | None = None, after: str | None = None) -> tuple[int, int]:
    """The 1-based, inclusive line range (a, b) of an excerpt of ``kernels/conv2d/<cu_file>``.

    Line a is the first line containing ``first`` (searching after the first line containing
    ``after``, when given); line b is the first line at or after a containing ``last``, or a
    itself when ``last`` is None.

    Raises:
        ValueError: a marker is not found (the file changed: the excerpt must be re-chosen).
    """
    lines = kernel_path(cu_file).read_text().splitlines()

    def find(text: str, start: int) -> int:
        for i in range(start, len(lines)):
            if text in lines[i]:
                return i
        raise ValueError(f"kernels/conv2d/{cu_file}: no line containing {text!r} after line {start}")

    a = find(first, find(after, 0) + 1 if after is not None else 0)
    b = find(last, a) if last is not None else a
    return a + 1, b + 1


def excerpt_markdown(cu_file: str, first: str, last: str | None = None, after: str | None = None) -> str:
    """The Markdown `show_excerpt` renders: a heading naming the file and its lines, then the lines."""
    a, b = excerpt_lines(cu_file, first, last, after)
    text = "\n".join(kernel_path(cu_file).read_text().splitlines()[a - 1 : b])
    return f"**kernels/conv2d/{cu_file}**, lines {a}–{b}\n\n```cuda\n{text}\n```"


def show_excerpt(cu_file: str, first: str, last: str | None = None, after: str | None = None) -> None:
    """Render the lines of a kernel file from the line containing ``first`` to the next line
    containing ``last`` (`excerpt_lines`), headed by the file and its line numbers.

    Raises:
        ValueError: a marker is not in the file.
    """
    display(Markdown(excerpt_markdown(cu_file, first, last, after)))


def show_python(*objs) -> None:
    """Render the source of Python functions or classes from the repository (`inspect.getsource`)."""
    display(Markdown("```python\n" + "\n\n".join(inspect.getsource(o) for o in objs) + "\n```"))


def check_edge(variant, kinds: tuple[str, ...] = ("normal", "int"), skip_big: bool = True):
    """Run `helpers.check.check` on every problem of the ``edge`` suite the variant supports.

    Args:
        variant: a variant or its name.
        kinds: the input kinds checked per problem ("normal": random normal, judged against the
            rounding bound; "int": small integers, bit-exact).
        skip_big: leave out the problems with a tensor of 2^31 elements or more (about 45 GB
            of GPU memory; `helpers.suites.is_big`).

    Returns:
        (checked, refused), two DataFrames: one row per problem checked (ok, worst error over
        the bound, relative L2 error, bit-exactness on integers, a second run bitwise equal,
        the failure if any), and one per problem left out with the reason (the variant's own
        refusal, or ``skip_big``).
    """
    v = get(variant) if isinstance(variant, str) else variant
    checked, refused = [], []
    for p in suites.suite("edge"):
        reason = v.supports(p)
        if not reason and skip_big and suites.is_big(p):
            reason = "skipped: a tensor of 2^31+ elements (skip_big; QUICK is on)"
        if reason:
            refused.append({"problem": p.name, "why not": reason})
            continue
        rs = [check(v, p, kind=k) for k in kinds]
        checked.append({
            "problem": p.name,
            "kinds": "+".join(r.kind for r in rs),
            "ok": all(r.ok for r in rs),
            "worst err / bound": max(r.worst_err_over_bound for r in rs),
            "rel L2 (max)": max(r.rel_l2 for r in rs),
            "int bit-exact": next((r.exact for r in rs if r.kind == "int"), None),
            "repeat bitwise": all(r.repeat_bitwise for r in rs),
            "failure": "; ".join(f"{r.kind}: {r.reason}" for r in rs if not r.ok),
        })
    return pd.DataFrame(checked), pd.DataFrame(refused)


def copy_bandwidth_gbps(nbytes: int = 2**28, device: str = "cuda") -> float:
    """Measured device-to-device copy bandwidth in GB/s (bytes read + written per second, the
    median of `helpers.timing.time_gpu`), a practical roof for a memory-bound kernel."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = time_gpu(lambda: dst.copy_(src))
    return 2 * nbytes / (t.ms_p50 * 1e-3) / 1e9


def sm_limits() -> dict[str, int]:
    """The current GPU's per-SM limits an occupancy estimate needs, from the driver: thread
    slots, resident blocks, registers, shared memory per SM and the shared memory CUDA reserves
    per block (bytes)."""
    import pycuda.driver as drv  # pycuda loads only with the NVIDIA driver; gpu.init made the context

    gpu.init()
    dev, a = drv.Context.get_device(), drv.device_attribute
    return {
        "threads": dev.get_attribute(a.MAX_THREADS_PER_MULTIPROCESSOR),
        "blocks": dev.get_attribute(a.MAX_BLOCKS_PER_MULTIPROCESSOR),
        "registers": dev.get_attribute(a.MAX_REGISTERS_PER_MULTIPROCESSOR),
        "smem": dev.get_attribute(a.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
        "smem_reserved": dev.get_attribute(a.RESERVED_SHARED_MEMORY_PER_BLOCK),
    }


def resident_blocks_per_sm(regs_per_thread: int, block_threads: int, smem_bytes: int,
                           limits: dict[str, int] | None = None) -> tuple[int, str]:
    """(blocks of one kernel an SM holds at once, the resource that limits it): an estimate.

    In the spirit of the CUDA occupancy calculator (CUDA C++ Best Practices Guide, "Occupancy"):
    warp slots (the SM's thread limit / 32, a block taking whole warps), registers (allocated per
    warp in chunks of 256), shared memory (the block's bytes plus what CUDA reserves per block) and
    the per-SM block limit, as `cuda_occupancy.h` counts them (``cudaOccMaxBlocksPerSMWarpsLimit``
    rounds a block up to whole warps; a 324-thread block is 11 warps, 5 of them in 64 slots). The real allocation has
    a few more rules; Nsight Compute measures it. ``limits``: `sm_limits()` of the current GPU
    unless given (a test passes its own).
    """
    lim = limits or sm_limits()
    warps = -(-block_threads // 32)
    regs_per_warp = -(-regs_per_thread * 32 // 256) * 256
    smem = smem_bytes + lim["smem_reserved"]
    by = {
        "warp slots": (lim["threads"] // 32) // warps,
        "registers": lim["registers"] // (regs_per_warp * warps),
        "shared memory": lim["smem"] // smem if smem else lim["blocks"],
        "blocks per SM": lim["blocks"],
    }
    limiter = min(by, key=by.get)
    return by[limiter], limiter
