"""Run a plan's kernels from their own ``.cu`` source on the CPU (no GPU): the file compiled as
C++20 with ``tests/host_shim.h`` (each block's threads are std::threads, ``__syncthreads`` a
barrier, ``fmaf`` the C library's single-rounding one, no other contraction), its launches run as
the plan gives them (grid, block, arguments; buffers NaN-filled but x and w), and y read back.

The arithmetic is the kernel's, operation by operation, so a float32 result is the one the GPU
gives for the same sequence of roundings (normal numbers; nvcc keeps fp32 denormals by default).
Slow (a std::thread per GPU thread): for small problems. Used by tests/test_winograd_host.py.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from helpers import compile as hc
from helpers.variants import Buffer, Plan

HERE = Path(__file__).resolve().parent
BUILD_DIR = Path(tempfile.gettempdir()) / "conv2d_hostrun"

DRIVER = """#include "host_shim.h"
#include "{cu_file}"
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <string>

using HostEntry = void (*)(HostDim3, HostDim3, const std::vector<HostArg>&);
static const std::map<std::string, HostEntry> entries = {{
{table}
}};

int main(int argc, char** argv) {{
    if (argc != 2) return 2;
    std::ifstream in(argv[1]);
    std::map<std::string, std::vector<float>> bufs;
    std::string cmd;
    while (in >> cmd) {{
        if (cmd == "buffer") {{
            std::string name, file;
            long long n;
            in >> name >> n >> file;
            auto& b = bufs[name];
            b.assign((size_t)n, std::numeric_limits<float>::quiet_NaN());
            if (file != "-") {{
                std::ifstream f(file, std::ios::binary);
                f.read(reinterpret_cast<char*>(b.data()), n * 4);
            }}
        }} else if (cmd == "launch") {{
            std::string entry;
            HostDim3 g, b;
            int nargs;
            in >> entry >> g.x >> g.y >> g.z >> b.x >> b.y >> b.z >> nargs;
            std::vector<HostArg> args;
            for (int a = 0; a < nargs; ++a) {{
                std::string kind;
                in >> kind;
                if (kind == "p") {{
                    std::string name;
                    long long off;
                    in >> name >> off;
                    args.push_back({{bufs.at(name).data() + off / 4, 0}});
                }} else {{
                    long long v;
                    in >> v;
                    args.push_back({{nullptr, v}});
                }}
            }}
            auto it = entries.find(entry);
            if (it == entries.end()) {{
                std::fprintf(stderr, "no entry %s\\n", entry.c_str());
                return 3;
            }}
            it->second(g, b, args);
        }} else if (cmd == "dump") {{
            std::string name, file;
            in >> name >> file;
            const auto& b = bufs.at(name);
            std::ofstream f(file, std::ios::binary);
            f.write(reinterpret_cast<const char*>(b.data()), (std::streamsize)(b.size() * 4));
        }}
    }}
    return 0;
}}
"""


def host_available() -> bool:
    return shutil.which("g++") is not None


def build(cu_file: str, defines: dict, entries: set[str]) -> Path:
    """The driver for ``cu_file`` with ``defines`` and ``entries``, built once (cached by content)."""
    call = "[](HostDim3 g, HostDim3 b, const std::vector<HostArg>& v) {{ host_call({e}, g, b, v); }}"
    table = ",\n".join(f'    {{"{e}", ' + call.format(e=e) + "}" for e in sorted(entries))
    src = DRIVER.format(cu_file=cu_file, table=table)
    flags = hc.define_flags(defines)
    key = hashlib.sha256("\n".join([src, *flags, hc.source_hash(cu_file), (HERE / "host_shim.h").read_text()])
                         .encode()).hexdigest()[:16]
    exe = BUILD_DIR / f"{Path(cu_file).stem}_{key}"
    if not exe.exists():
        BUILD_DIR.mkdir(parents=True, exist_ok=True)
        cpp = exe.with_suffix(".cpp")
        cpp.write_text(src)
        cmd = ["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-pthread", f"-I{HERE}", f"-I{hc.KERNEL_DIR}",
               *flags, str(cpp), "-o", str(exe)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"g++ failed on {cu_file}:\n{r.stderr[-4000:]}")
    return exe


def run_plan(plan: Plan, x: np.ndarray, w: np.ndarray, exe: Path | None = None) -> np.ndarray:
    """y (float32, the problem's layout) of ``plan``'s launches run on the CPU from x and w (float32,
    the problem's layout); y and the workspace start NaN."""
    p = plan.problem
    exe = exe or build(plan.sources[0], plan.variant.defines, {k.entry for k in plan.launches})
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        np.ascontiguousarray(x, dtype=np.float32).tofile(d / "x")
        np.ascontiguousarray(w, dtype=np.float32).tofile(d / "w")
        lines = [f"buffer x {x.size} {d / 'x'}", f"buffer w {w.size} {d / 'w'}", f"buffer y {p.y_numel} -",
                 f"buffer workspace {max(1, -(-plan.workspace_bytes // 4))} -"]
        for k in plan.launches:
            args = [f"p {a.name} {a.offset}" if isinstance(a, Buffer) else f"i {int(a)}" for a in k.args]
            lines.append(" ".join(["launch", k.entry, *map(str, k.config.grid), *map(str, k.config.block),
                                   str(len(args)), *args]))
        lines.append(f"dump y {d / 'y'}")
        (d / "script").write_text("\n".join(lines) + "\n")
        r = subprocess.run([str(exe), str(d / "script")], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"{exe.name} failed ({r.returncode}): {r.stderr[-2000:]}")
        return np.fromfile(d / "y", dtype=np.float32).reshape(p.y_shape)
