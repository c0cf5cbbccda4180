"""`helpers.show`: what the notebooks show besides a check and a benchmark, tested without a GPU
(an excerpt is the file's lines; the occupancy estimate's arithmetic; the edge table's rows)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from helpers import show, suites
from helpers.compile import kernel_path


def test_an_excerpt_is_the_files_lines_between_its_markers():
    lines = kernel_path("12_igemm_pipelined.cu").read_text().splitlines()
    a, b = show.excerpt_lines("12_igemm_pipelined.cu", "for (int t = 0; t < steps; ++t) {", "__syncthreads();")
    assert "for (int t = 0" in lines[a - 1] and "__syncthreads();" in lines[b - 1] and a < b
    assert all("__syncthreads();" not in x for x in lines[a - 1 : b - 1])  # the first one after `first`
    md = show.excerpt_markdown("12_igemm_pipelined.cu", "for (int t = 0; t < steps; ++t) {", "__syncthreads();")
    assert md == f"**kernels/conv2d/12_igemm_pipelined.cu**, lines {a}–{b}\n\n```cuda\n" + "\n".join(
        lines[a - 1 : b]) + "\n```"
    one = show.excerpt_lines("12_igemm_pipelined.cu", "__syncthreads();")
    assert one[0] == one[1] and one[0] > 1
    later = show.excerpt_lines("12_igemm_pipelined.cu", "__syncthreads();", after="for (int t = 0; t < steps; ++t) {")
    assert later == (b, b)
    with pytest.raises(ValueError, match="no line containing 'not in the file'"):
        show.excerpt_lines("12_igemm_pipelined.cu", "not in the file")


def test_the_whole_file_is_shown_as_it_is():
    md = show.source_markdown("01_naive.cu")
    assert md == f"**kernels/conv2d/01_naive.cu**\n\n```cuda\n{kernel_path('01_naive.cu').read_text()}\n```"


# An A100's limits (CUDA C++ Programming Guide, "Compute Capabilities", 8.0): 2,048 threads,
# 32 blocks, 65,536 registers and 164 KB of shared memory per SM, 1 KB reserved per block.
A100 = {"threads": 2048, "blocks": 32, "registers": 65536, "smem": 167936, "smem_reserved": 1024}


@pytest.mark.parametrize("regs, threads, smem, expect", [
    (64, 256, 0, (4, "registers")),          # 64 x 32 = 2,048 registers a warp, 8 warps: 65,536 / 16,384
    (32, 256, 0, (8, "warp slots")),         # 1,024 a warp: 8 blocks by registers and by warps (a tie: warps named)
    (32, 324, 0, (5, "warp slots")),         # 11 warps: 64 // 11 = 5 (2,048 // 324 = 6 by threads is wrong)
    (40, 1024, 0, (1, "registers")),         # 1,280 a warp, 40,960 a block: 1 by registers, 2 by warp slots
    (16, 128, 48 * 1024, (3, "shared memory")),  # 49,152 + 1,024 a block: 167,936 / 50,176 = 3
    (24, 32, 0, (32, "blocks per SM")),      # 768 registers a warp rounds to 768; 64 by warp slots, 32 by the limit
    (255, 128, 0, (2, "registers")),         # 8,160 a warp rounds up to 8,192: 65,536 / 32,768
])
def test_the_occupancy_estimate_takes_the_tightest_limit(regs, threads, smem, expect):
    assert show.resident_blocks_per_sm(regs, threads, smem, A100) == expect


def test_the_edge_table_checks_what_the_variant_claims_and_says_why_not(monkeypatch):
    """One row per edge problem: checked (with each kind's result), refused by the variant with
    its reason, or left out as a 2^31-element problem while skip_big is on."""
    edge = suites.suite("edge")
    big = [p for p in edge if suites.is_big(p)]
    refused_name = next(p.name for p in edge if not suites.is_big(p))
    variant = SimpleNamespace(supports=lambda p: "no, planted" if p.name == refused_name else None)
    calls = []

    def fake_check(v, p, kind):
        calls.append((p.name, kind))
        bad = kind == "int" and p.name == edge[-1].name
        return SimpleNamespace(kind=kind, ok=not bad, worst_err_over_bound=0.5, rel_l2=1e-7,
                               exact=True if kind == "int" else None, repeat_bitwise=True,
                               reason="planted" if bad else "")

    monkeypatch.setattr(show, "check", fake_check)
    checked, refused = show.check_edge(variant)
    assert big, "the edge suite has a 2^31-element problem"
    assert set(refused["problem"]) == {refused_name, *(p.name for p in big)}
    assert refused.set_index("problem").loc[refused_name, "why not"] == "no, planted"
    assert len(checked) == len(edge) - len(refused) and len(calls) == 2 * len(checked)
    last = checked.set_index("problem").loc[edge[-1].name] if edge[-1] not in big else None
    if last is not None:
        assert not last["ok"] and last["failure"] == "int: planted"
    assert checked["ok"].sum() == len(checked) - (last is not None)
    calls.clear()
    checked_all, _ = show.check_edge(variant, kinds=("normal",), skip_big=False)
    assert len(checked_all) == len(edge) - 1 and all(k == "normal" for _, k in calls)
