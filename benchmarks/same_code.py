"""python -m benchmarks.same_code REV FILE [FILE ...]: does a kernel refactor leave the machine code alone?

    python -m benchmarks.same_code main 13_igemm_production.cu 14_dgrad.cu
    python -m benchmarks.same_code HEAD~1 13_igemm_production.cu --archs sm_90 --define PIPE_TUNE_BM=128 ...

Builds each ``kernels/conv2d`` FILE twice per architecture, as it is at git revision REV (the whole
``kernels/conv2d`` folder of that revision, so its headers too) and as it is in the working tree,
with the harness's nvcc options (`helpers.compile.NVCC_OPTIONS`), and compares every kernel's
machine code: the bytes of each ``.text.<kernel>`` section of the two cubins (an ELF file; no
disassembler needed). Line information and file names live in other sections, so moving code
into a header changes nothing here, while any change in the instructions ptxas emits does.

Prints one line per (file, architecture) and a summary; exit status 0 when every kernel of every
build is byte-identical and both sides have the same kernels, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import struct
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = "kernels/conv2d"
ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_120")


def text_sections(cubin: bytes) -> dict[str, bytes]:
    """{section name: bytes} of every ``.text.*`` section of an ELF64 file (a cubin)."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not an ELF64 file")
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at, names_size = headers[shstrndx][4], headers[shstrndx][5]
    names = cubin[names_at : names_at + names_size]
    out = {}
    for name_off, _type, _flags, _addr, offset, size, *_ in headers:
        name = names[name_off : names.index(b"\0", name_off)].decode()
        if name.startswith(".text."):
            out[name] = cubin[offset : offset + size]
    return out


def build(folder: Path, cu_file: str, arch: str, defines: list[str]) -> bytes:
    """The cubin of ``folder/cu_file`` for ``arch`` (nvcc -cubin with the harness's options)."""
    from helpers.compile import NVCC_OPTIONS

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "k.cubin"
        cmd = ["nvcc", "-cubin", f"-arch={arch}", *NVCC_OPTIONS, *(f"-D{d}" for d in defines), "-o", str(out), cu_file]
        r = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"nvcc failed on {folder / cu_file} ({arch}):\n{r.stderr[-2000:]}")
        return out.read_bytes()


def compare(old: bytes, new: bytes) -> tuple[int, list[str]]:
    """(kernels compared, differences) of two cubins' machine code."""
    a, b = text_sections(old), text_sections(new)
    diffs = [f"only at REV: {k[6:]}" for k in sorted(set(a) - set(b))]
    diffs += [f"only now: {k[6:]}" for k in sorted(set(b) - set(a))]
    diffs += [f"differs: {k[6:]}" for k in sorted(set(a) & set(b)) if a[k] != b[k]]
    return len(set(a) & set(b)), diffs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.same_code", description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="the git revision to compare against (e.g. main, HEAD~1)")
    ap.add_argument("files", nargs="+", help=f"kernel files in {KERNELS}")
    ap.add_argument("--archs", nargs="+", default=list(ARCHS), help=f"default: {' '.join(ARCHS)}")
    ap.add_argument("--define", action="append", default=[], help="NAME=VALUE passed as -D to both builds")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = [f for f in args.files if not (ROOT / KERNELS / f).is_file()]
    if missing:
        print(f"python -m benchmarks.same_code: no such kernel file: {', '.join(missing)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        old_dir = Path(tmp) / "old"
        old_dir.mkdir()
        archive = subprocess.run(["git", "archive", args.rev, KERNELS], cwd=ROOT, capture_output=True)
        if archive.returncode:
            print(f"python -m benchmarks.same_code: git archive {args.rev}: {archive.stderr.decode()}", file=sys.stderr)
            return 2
        subprocess.run(["tar", "-x", "-C", str(old_dir)], input=archive.stdout, check=True)
        jobs = [(f, a) for f in args.files for a in args.archs]
        with ThreadPoolExecutor() as pool:
            olds = list(pool.map(lambda j: build(old_dir / KERNELS, j[0], j[1], args.define), jobs))
            news = list(pool.map(lambda j: build(ROOT / KERNELS, j[0], j[1], args.define), jobs))
    total, bad = 0, 0
    for (f, a), old, new in zip(jobs, olds, news):
        n, diffs = compare(old, new)
        total += n
        bad += len(diffs)
        print(f"{f} {a}: {n} kernels, {'byte-identical' if not diffs else f'{len(diffs)} differ'}")
        for d in diffs[:10]:
            print(f"    {d}")
    print(f"{total} kernels compared against {args.rev}: {'all byte-identical' if not bad else f'{bad} differences'}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
