"""`python -m benchmarks.same_code`: a kernel's machine code compared between two builds, on the CPU.

A kernel moved into a header compiles to the same ``.text`` bytes; one changed instruction does
not, and a kernel that exists on one side only is named.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import same_code as sc

KERNEL = """
extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""
MOVED = ('#include "moved.cuh"\n', "#pragma once\n" + KERNEL)  # (the .cu, the header it includes)


def cubin(folder: Path, files: dict[str, str]) -> bytes:
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    return sc.build(folder, "k.cu", "sm_80", [])


@pytest.mark.nvcc
def test_a_move_into_a_header_is_the_same_code_and_a_changed_instruction_is_not(tmp_path):
    base = cubin(tmp_path / "a", {"k.cu": KERNEL})
    assert set(sc.text_sections(base)) == {".text.axpy"}
    moved = cubin(tmp_path / "b", {"k.cu": MOVED[0], "moved.cuh": MOVED[1]})
    assert sc.compare(base, moved) == (1, [])
    changed = cubin(tmp_path / "c", {"k.cu": KERNEL.replace("a * x[i] + y[i]", "a * x[i] - y[i]")})
    assert sc.compare(base, changed) == (1, ["differs: axpy"])
    renamed = cubin(tmp_path / "d", {"k.cu": KERNEL.replace("axpy", "axpby")})
    assert sc.compare(base, renamed) == (0, ["only at REV: axpy", "only now: axpby"])


def test_not_a_cubin_and_a_missing_file_are_refused(capsys):
    with pytest.raises(ValueError, match="ELF64"):
        sc.text_sections(b"not an elf")
    assert sc.main(["HEAD", "99_no_such.cu"]) == 2
    assert "no such kernel file" in capsys.readouterr().err
