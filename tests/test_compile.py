"""Every kernel compiles with plain nvcc for every architecture its variants target; no variant spills.

No GPU needed: `helpers.compile.nvcc_compile` runs ``nvcc -cubin -Xptxas -v``. Each variant says
which GPUs it builds for and with which ``-arch`` (`Variant.build_reason`, `Variant.target`:
e.g. sm_80+ for the tensor-core days, ``sm_90a`` for Hopper-only instructions), and these tests
build exactly that. Without nvcc on PATH the compile tests skip (the `parse_ptxas` unit tests
still run).
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from helpers import compile as hc
from helpers.suites import SUITES, suite
from helpers.variants import all_variants, get

KERNEL_FILES = sorted(p.name for p in hc.KERNEL_DIR.glob("*.cu"))
SPILL_CHECK_CC = (9, 0)



def _cc(arch: str) -> tuple[int, int]:
    digits = arch.removeprefix("sm_").rstrip("a")
    return int(digits[:-1]), int(digits[-1])


def builds(cu_file: str, arch: str) -> tuple[list[tuple[str, tuple]], list[str]]:
    """What the registered variants build from ``cu_file`` (their own file, or one a launch of
    theirs names: `variant_files`) for a GPU of ``arch``'s compute capability:
    ([(-arch target, -D defines)], [reasons of the variants that do not build there])."""
    cc = _cc(arch)
    todo, why_not = set(), []
    for v in all_variants():
        if cu_file not in variant_files(v):
            continue
        reason = v.build_reason(cc)
        if reason:
            why_not.append(reason)
        else:
            todo.add((v.target(cc), tuple(sorted(v.defines.items()))))
    if not todo and not why_not:  # a file no variant uses: built plainly, so it stays buildable
        todo.add((arch, ()))
    return sorted(todo, key=repr), why_not


@functools.cache
def compile_once(cu_file: str, target: str, defines: tuple[tuple[str, object], ...]) -> tuple[list, str]:
    """`helpers.compile.nvcc_compile`, cached per (file, target, defines) for the whole session."""
    return hc.nvcc_compile(cu_file, arch=target, defines=dict(defines))


def test_kernel_files_exist():
    assert KERNEL_FILES, f"no .cu files in {hc.KERNEL_DIR}"
    for v in all_variants():
        assert (hc.KERNEL_DIR / v.cu_file).is_file(), f"variant {v.name} names a missing file {v.cu_file}"


def test_build_targets_follow_the_variants():
    """The tensor-core days build for sm_80+ only, with the plain target, days 16-19 and 22 for
    sm_90a alone; the rest (days 01-09, days 20-21's CUDA-core Winograd) for every arch."""
    for v in all_variants():
        for arch in hc.ARCHS:
            reason = v.build_reason(_cc(arch))
            if 16 <= v.day <= 19 or v.day == 22:  # Hopper: sm_90a, which runs on compute capability 9.0 alone
                assert (reason is None) == (_cc(arch) == (9, 0)), (v.name, arch, reason)
                assert v.target(_cc(arch)) == arch + "a"
                continue
            if 10 <= v.day <= 15:
                assert (reason is None) == (_cc(arch) >= (8, 0)), (v.name, arch, reason)
            else:
                assert reason is None, (v.name, arch, reason)
            assert v.target(_cc(arch)) == arch


@pytest.fixture(scope="module")
def prewarmed():
    """Run every build the tests below need at once, on all cores (nvcc is single-threaded)."""
    jobs = {(f, t, d) for f in KERNEL_FILES for a in hc.ARCHS for t, d in builds(f, a)[0]}
    with ThreadPoolExecutor(max_workers=max(1, len(os.sched_getaffinity(0)))) as pool:
        for f in [pool.submit(compile_once, *job) for job in sorted(jobs, key=repr)]:
            try:
                f.result()
            except Exception:  # noqa: BLE001 - not cached: the test of that build runs it again and reports it
                pass


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", hc.ARCHS)
@pytest.mark.parametrize("cu_file", KERNEL_FILES)
def test_compiles(cu_file: str, arch: str, prewarmed):
    todo, why_not = builds(cu_file, arch)
    if not todo:
        pytest.skip("; ".join(why_not))
    for target, defines in todo:
        try:
            reports, _ = compile_once(cu_file, target, defines)
        except RuntimeError as e:
            hint = "" if defines else " (no registered variant uses this file, so it was built without -D defines)"
            pytest.fail(f"{e}{hint}")
        assert reports, f"{cu_file} ({target}, {dict(defines)}) has no __global__ entry in the ptxas report"
        assert all(r.arch == target for r in reports), (target, {r.arch for r in reports})


_entries: dict[str, dict[str, set[str]]] = {}


def variant_entries(variant) -> dict[str, set[str]]:
    """Entry points ``variant`` launches, by the kernel file each is built from
    (`KernelLaunch.source`): the entries of every launch of every problem of the named suites it
    supports, in its operation and layout and in each of its dtypes (`Variant.adapt`). Asked once
    per registered name."""
    if variant.name not in _entries:
        entries: dict[str, set[str]] = {}
        for name in SUITES:
            for p in suite(name):
                for dtype in variant.dtypes:
                    q = variant.adapt(replace(p, dtype=dtype, name=""), op=True)
                    if variant.supports(q, smem_limit=2**31) is None:
                        for k in variant.launches(q):
                            entries.setdefault(k.source(variant), set()).add(k.entry)
        _entries[variant.name] = entries
    return _entries[variant.name]


def variant_files(variant) -> set[str]:
    """The kernel files ``variant`` builds: its ``cu_file`` and any a launch of it names."""
    return {variant.cu_file} | set(variant_entries(variant))


def test_variant_entries_see_every_load_path():
    """The NHWC and fp16/bf16 variants are reached through `Variant.adapt`: more than one entry;
    the backward variants through their operation."""
    names = {v.name: set().union(*variant_entries(v).values()) for v in all_variants()}
    assert {"im2col_nhwc", "sgemm_nt_128x64", "sgemm_nt_128x128"} <= names["im2col"]
    assert len(names["igemm_simt"]) >= 4 and len(names["igemm_wmma"]) == len(names["igemm_mma"]) == 4
    assert names["dgrad"] and names["wgrad"] and "dgrad_rotate_filter" in names["dgrad_wgmma"]


def test_variant_files_are_the_variants_own_but_where_a_launch_names_another():
    """Every variant builds its own file alone, but days 18 and 22, whose fprop launches (day 22's
    where it does not split) are built from day 16's, and day 22's dgrad, whose rotation (and
    strided phases) are built from day 18's."""
    files = {v.name: variant_files(v) for v in all_variants()}
    assert {n: f for n, f in files.items() if len(f) > 1} == {"dgrad_wgmma": {"18_dgrad_wgmma.cu", "16_igemm_wgmma.cu"},
                                                              "igemm_split_k": {"22_split_k.cu", "16_igemm_wgmma.cu"},
                                                              "dgrad_split_k": {"22_split_k.cu", "18_dgrad_wgmma.cu",
                                                                                "16_igemm_wgmma.cu"}}
    day18 = variant_entries(get("dgrad_wgmma"))
    assert day18["18_dgrad_wgmma.cu"] == {"dgrad_rotate_filter", "dgrad_scatter_strided"}  # strided layers
    assert day18["16_igemm_wgmma.cu"] and all(e.startswith("igemm_wgmma_") for e in day18["16_igemm_wgmma.cu"])


@pytest.mark.nvcc
@pytest.mark.parametrize("variant", all_variants(), ids=lambda v: v.name)
def test_variant_entries_have_no_spills(variant):
    """The entries a variant launches exist in the file each launch is built from; no entry of
    those builds spills or uses a stack."""
    reason = variant.build_reason(SPILL_CHECK_CC)
    if reason:
        pytest.skip(reason)
    defines = tuple(sorted(variant.defines.items()))
    entries = variant_entries(variant)
    for cu_file in sorted(variant_files(variant)):
        reports, log = compile_once(cu_file, variant.target(SPILL_CHECK_CC), defines)
        by_entry = {r.entry: r for r in reports}
        missing = entries.get(cu_file, set()) - set(by_entry)
        assert not missing, (f"{variant.name}: entries {sorted(missing)} not in {cu_file}'s ptxas report "
                             f"{sorted(by_entry)}:\n{log}")
        for r in reports:
            assert r.registers > 0, r
            assert (r.spill_stores, r.spill_loads) == (0, 0), f"{variant.name}: {r.entry} spills on {r.arch}: {r}"
            assert r.stack_bytes == 0, f"{variant.name}: {r.entry} has a {r.stack_bytes}-byte stack frame on {r.arch}"


# ---- parse_ptxas ----------------------------------------------------------------------------

LOG_CUDA13 = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'conv2d_naive' for 'sm_90'
ptxas info    : Function properties for conv2d_naive
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 48 registers, used 0 barriers
ptxas info    : Compile time = 49.321 ms
ptxas info    : Compiling entry function 'conv2d_tiled' for 'sm_90'
ptxas info    : Function properties for conv2d_tiled
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 4624 bytes smem
"""

LOG_WITH_CMEM = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'conv2d_z_out' for 'sm_75'
ptxas info    : Function properties for conv2d_z_out
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 63 registers, 1024 bytes smem, 404 bytes cmem[0]
"""

LOG_SPILLS = """\
ptxas info    : Compiling entry function 'conv2d_blocked' for 'sm_86'
ptxas info    : Function properties for conv2d_blocked
    152 bytes stack frame, 148 bytes spill stores, 160 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 8192 bytes smem, 400 bytes cmem[0]
"""


def test_parse_ptxas_cuda13_without_cmem():
    reps = hc.parse_ptxas(LOG_CUDA13)
    assert [r.entry for r in reps] == ["conv2d_naive", "conv2d_tiled"]
    assert reps[0] == hc.PtxasReport("conv2d_naive", "sm_90", 48, 0, 0, 0, 0)
    assert reps[1] == hc.PtxasReport("conv2d_tiled", "sm_90", 40, 4624, 0, 0, 0)


def test_parse_ptxas_older_log_with_cmem():
    (r,) = hc.parse_ptxas(LOG_WITH_CMEM)
    assert r == hc.PtxasReport("conv2d_z_out", "sm_75", 63, 1024, 0, 0, 0)


def test_parse_ptxas_spills():
    (r,) = hc.parse_ptxas(LOG_SPILLS)
    assert (r.entry, r.arch, r.registers, r.shared_bytes) == ("conv2d_blocked", "sm_86", 255, 8192)
    assert (r.stack_bytes, r.spill_stores, r.spill_loads) == (152, 148, 160)


def test_parse_ptxas_empty_and_noise():
    assert hc.parse_ptxas("") == []
    assert hc.parse_ptxas("ptxas info    : 0 bytes gmem\nwarning: something\n") == []


def test_define_flags_sorted():
    assert hc.define_flags({"TILE": 16, "ACCUM": "double"}) == ["-DACCUM=double", "-DTILE=16"]
    assert hc.define_flags(None) == []


def test_kernel_path_missing():
    with pytest.raises(FileNotFoundError, match="no kernel file"):
        hc.kernel_path("99_does_not_exist.cu")


@pytest.mark.parametrize("top, included", [("14_dgrad.cu", "igemm_mainloop.cuh"),
                                           ("13_igemm_production.cu", "igemm_mainloop.cuh"),
                                           ("16_igemm_wgmma.cu", "hopper.cuh")])
def test_an_edit_to_an_included_file_changes_every_cache_key(top, included, tmp_path, monkeypatch):
    """The in-process module cache, the plan cache and nvcc_compile's cache key on `source_hash`
    (the file and everything it includes): an edit to a file the kernel includes (day 14's dgrad
    includes day 13's kernel; day 16 includes hopper.cuh) builds and plans again instead of running
    the stale code, and undoing the edit finds the old key. (They keyed on the file's own text or
    mtime, which an included file's edit leaves alone.)"""


    kdir = tmp_path / "kernels"
    kdir.mkdir()
    for f in hc.KERNEL_DIR.iterdir():
        (kdir / f.name).write_text(f.read_text())
    monkeypatch.setattr(hc, "KERNEL_DIR", kdir)
    assert f'#include "{included}"' in (kdir / top).read_text()
    v = next(v for v in all_variants() if v.cu_file == top)
    seen = []
    monkeypatch.setattr(hc, "nvcc_available", lambda: True)
    monkeypatch.setattr(hc, "_nvcc_compile_cached", lambda *key: seen.append(key) or ((), ""))

    def keys():
        hc.nvcc_compile(top, "sm_90a")
        # the module cache, the kernels a kept plan holds (`helpers.launch.compiled`'s key), nvcc's cache
        return hc._module_key(top, {"TILE": 1}, "sm_90a"), hc.source_hash(v.cu_file), seen[-1]

    before = keys()
    path = kdir / included
    original = path.read_text()
    path.write_text(original + "\n// an edit\n")
    edited = keys()
    assert all(a != b for a, b in zip(before, edited)), "a cache kept its key after an included file changed"
    path.write_text(original)
    assert keys() == before


@pytest.mark.parametrize("edited", ["18_dgrad_wgmma.cu", "16_igemm_wgmma.cu", "hopper.cuh", "conv2d_common.cuh"])
def test_an_edit_to_any_file_a_plan_builds_from_changes_its_key(edited, tmp_path, monkeypatch):
    """Day 18's plan builds from two files (its rotate kernel's, day 16's for the fprop launch):
    the key its kernels are kept under (`helpers.launch.sources_key`) follows an edit to either,
    and to a header either includes; undoing the edit finds the old key."""
    from helpers.launch import sources_key
    from helpers.problem import Conv2dProblem

    kdir = tmp_path / "kernels"
    kdir.mkdir()
    for f in hc.KERNEL_DIR.iterdir():
        (kdir / f.name).write_text(f.read_text())
    monkeypatch.setattr(hc, "KERNEL_DIR", kdir)
    v = get("dgrad_wgmma")
    plan = v.plan(Conv2dProblem(N=2, C=24, H=9, W=10, K=16, R=3, S=3, padding=1, op="dgrad", dtype="fp16",
                                layout="NHWC"))
    assert plan.sources == ("18_dgrad_wgmma.cu", "16_igemm_wgmma.cu")
    before = sources_key(plan)
    path = kdir / edited
    original = path.read_text()
    path.write_text(original + "\n// an edit\n")
    edited_key = sources_key(plan)
    changed = [a != b for a, b in zip(before, edited_key)]
    reaches = [f == edited or f'#include "{edited}"' in (kdir / f).read_text() for f in plan.sources]
    assert any(changed) and changed == reaches, (edited, changed, reaches)
    path.write_text(original)
    assert sources_key(plan) == before


def test_build_many_shares_runs_maps_every_job_to_its_module_and_rebuilds_a_failed_run_job_by_job(monkeypatch):
    """`helpers.compile.build_many` with stand-ins for pycuda's compiler and loader: day 13's tiles
    in one run per worker, each run its first tile's defines plus the others' entry lines; every
    job's cache key holds its run's module (so `load_kernel` builds nothing again); a run that
    fails to compile is built again tile by tile, and a tile that fails alone is left out."""
    import sys
    import types

    from days.day13_igemm_production import space, tune_defines
    from days.day13_igemm_production.tiles import tune_entry_line

    tiles = space.tiles()[:8]
    jobs = [("13_igemm_production.cu", tune_defines(t, "fp16")) for t in tiles]
    jobs.append(("09_igemm_simt.cu", None))  # another file's build: alone
    bad = jobs[5]  # the tile the stand-in compiler rejects, alone or in a run
    bad_line, bad_flags = tune_entry_line(*bad), hc.define_flags(bad[1])
    original = hc.kernel_path("13_igemm_production.cu").read_text()
    runs = []

    def compile_stub(src, options, **kw):
        appended = src[len(original):] if src.startswith(original) else ""
        runs.append((appended, options))
        if bad_line in appended or all(f in options for f in bad_flags):
            raise RuntimeError("nvcc failed")
        return f"cubin {len(runs)}".encode()

    compiler = types.ModuleType("pycuda.compiler")
    compiler.compile = compile_stub
    driver = types.ModuleType("pycuda.driver")
    driver.module_from_buffer = lambda cubin: ("module", cubin)
    for name, mod in {"pycuda": types.ModuleType("pycuda"), "pycuda.compiler": compiler,
                      "pycuda.driver": driver}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(hc.gpu, "init", lambda: None)
    monkeypatch.setattr(hc, "_modules", {})
    monkeypatch.setattr(hc, "_cubins", {})
    hc.build_many(jobs, "sm_90", workers=3, entry_line=space.SPACE.merge)

    first, again = runs[:4], runs[4:]  # three shared runs of 3, 3 and 2 tiles, and the other file's
    assert sorted(a.count("PIPE_TUNE_ENTRY(") for a, _ in first) == [0, 1, 2, 2]
    assert len(again) == 3 and all(a == "" for a, _ in again)  # the failed run, tile by tile
    for i, (cu_file, defines) in enumerate(jobs):
        assert hc.is_built(cu_file, defines, "sm_90") == (i != 5), (i, cu_file, defines)
    modules = [hc._modules[hc._module_key(f, d, "sm_90")] for i, (f, d) in enumerate(jobs) if i != 5]
    assert len(set(modules)) == 1 + 1 + 2 + 1  # two runs kept whole, the failed run's two good tiles, the other file
