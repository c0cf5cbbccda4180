"""The tuner's measured machine on the CPU (issue 46, item 2): no GPU's number in the cost model
(``helpers/tune/machine.py`` read as source, and the check run on planted constants), the
`Machine` record and its JSON schema, the machine cache (key, round trip, a second call that
measures nothing, a damaged file), the committed records and the CPU tests' machine, the probe's
kernel file (its entries, registers and spills on every architecture, and the constants the Python
side shares with it), and the command line without a GPU. The probe itself runs in
``tests/gpu/test_machine_probe_gpu.py``."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import conftest
import pytest

from helpers import compile as hc
from helpers import gpu
from helpers import tune as ht
from helpers.problem import Conv2dProblem
from helpers.tune import machine as hm
from helpers.tune import probe

ROOT = Path(__file__).resolve().parents[1]
MACHINE_PY = ROOT / "helpers" / "tune" / "machine.py"
ENV = {"gpu": "NVIDIA H200", "driver": "580.00", "cuda": "13.0", "nvcc": "release 13.0", "torch": "2.13.0",
       "probe": "0123456789abcdef"}
TEST_MACHINE = hm.Machine(**conftest.TEST_MACHINE_INPUTS)


# ---- no GPU's number in the model -------------------------------------------------------------------------------

# The numbers machine.py may hold besides `FITTED`'s values, each an arithmetic or unit constant.
ALLOWED = {
    0: "comparisons, the minimum of a count",
    1: "at least one block, the stages in flight, a full cover",
    2: "2 FLOP per multiply-add; 2 bytes per fp16/bf16 element",
    4: "the 4-norm that combines the three times",
    0.25: "the 4-norm's root",
    32: "threads per warp (every architecture of the series)",
    256: "registers are allocated per warp in units of 256 (sm_75 to sm_120)",
    1e3: "GB/s -> bytes per microsecond",
    1e6: "TFLOP/s -> FLOP per microsecond",
}
# What the model held before issue 46 (the H200's rates and limits): named in a failure.
GPU_CONSTANTS = {620: "the H200's mma.sync TFLOP/s", 4000: "the H200's DRAM GB/s", 10000: "the H200's L2 GB/s",
                 1980: "the H200's clock (MHz)", 132: "the H200's SMs", 228 * 1024: "sm_90's shared memory per SM",
                 50 * 2**20: "the H200's L2 bytes", 65536: "registers per SM", 2048: "threads per SM (sm_90)",
                 1024: "sm_80+'s shared memory reserved per block", 3.0: "the launch cost (µs) assumed"}


def _fold(node: ast.AST):
    """The number a constant expression (a literal, or literals joined by + - * / // ** and unary -)
    evaluates to, else None."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _fold(node.operand)
        return None if v is None else (-v if isinstance(node.op, ast.USub) else v)
    if isinstance(node, ast.BinOp):
        a, b = _fold(node.left), _fold(node.right)
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b, ast.Div: lambda: a / b,
               ast.FloorDiv: lambda: a // b, ast.Pow: lambda: a**b}
        if a is not None and b is not None and type(node.op) in ops:
            return ops[type(node.op)]()
    return None


def numbers_in(source: str, fitted: tuple[str, ...]) -> list[tuple[int, object]]:
    """(line, value) of every maximal constant expression of ``source`` outside the module-level
    assignments of the names in ``fitted``."""
    tree = ast.parse(source)
    skip = {id(n) for stmt in tree.body if isinstance(stmt, (ast.Assign, ast.AnnAssign))
            for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
            if isinstance(t, ast.Name) and t.id in fitted for n in ast.walk(stmt)}
    found, inside = [], set()
    for node in ast.walk(tree):
        if id(node) in skip or id(node) in inside:
            continue
        v = _fold(node)
        if v is not None:
            found.append((node.lineno, v))
            inside |= {id(n) for n in ast.walk(node)}
    return found


def gpu_constants(source: str, fitted: tuple[str, ...]) -> list[str]:
    """The numbers of ``source`` (`numbers_in`) that are not `ALLOWED`, each with its line and, when
    it is one, which GPU constant it is."""
    bad = []
    for line, v in numbers_in(source, fitted):
        if v not in ALLOWED:
            what = next((f" ({why})" for c, why in GPU_CONSTANTS.items() if math.isclose(v, c)), "")
            bad.append(f"line {line}: {v!r}{what}")
    return bad


def test_the_cost_model_holds_no_gpus_constant():
    """machine.py's numbers are the fitted coefficients (`FITTED`, each marked in its comment)
    and arithmetic or unit constants (`ALLOWED`); any rate or limit of a GPU fails."""
    src = MACHINE_PY.read_text()
    assert not gpu_constants(src, hm.FITTED), gpu_constants(src, hm.FITTED)
    for name in hm.FITTED:
        (line,) = [ln for ln in src.splitlines() if ln.startswith(f"{name} = ")]
        assert re.search(r"#\s*(fitted|set by hand)", line), f"{name} is not documented as fitted: {line}"
        assert isinstance(getattr(hm, name), (int, float))


@pytest.mark.parametrize("plant, found", [
    ("H200 = Machine(sms=132, smem_per_sm=228 * 1024)\n", "132 (the H200's SMs)"),
    ("X = 228 * 1024\n", "233472 (sm_90's shared memory per SM)"),
    ("L2 = 50 * 2**20\n", "52428800 (the H200's L2 bytes)"),
    ("def f(mc):\n    return 620.0 * mc.sms / 132\n", "620.0 (the H200's mma.sync TFLOP/s)"),
])
def test_the_constant_check_catches_a_planted_gpu_number(plant, found):
    src = MACHINE_PY.read_text() + "\n" + plant
    assert any(found in b for b in gpu_constants(src, hm.FITTED)), gpu_constants(src, hm.FITTED)


def test_the_constant_check_catches_a_default_and_an_inlined_limit():
    src = MACHINE_PY.read_text()
    with_default = src.replace("    dram_gbps: float\n", "    dram_gbps: float = 4000.0\n", 1)
    inlined = src.replace("mc.blocks_per_sm))", "32))", 1).replace("t.shared_bytes + mc.smem_reserved_per_block",
                                                                  "t.shared_bytes + 1024", 1)
    assert with_default != src and inlined != src
    assert [b for b in gpu_constants(with_default, hm.FITTED) if "4000.0" in b]
    assert [b for b in gpu_constants(inlined, hm.FITTED) if "1024" in b]
    assert not gpu_constants(src.replace("COVER_WARPS = 4", "COVER_WARPS = 6"), hm.FITTED)  # a coefficient may change


def test_machine_fields_have_no_defaults_and_the_model_reads_its_limits():
    assert all(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
               for f in dataclasses.fields(hm.Machine))
    assert hm.FIELDS == tuple(conftest.TEST_MACHINE_INPUTS)
    t = ht.GemmTile(m=128, n=128, k=64, bm=128, bn=128, bk=32, warp_m=64, warp_n=64, threads=128, stages=2,
                    shared_bytes=10 * 1024, regs=32)
    assert ht.occupancy(t, TEST_MACHINE) == 16  # threads: 2048 / 128
    assert ht.occupancy(t, dataclasses.replace(TEST_MACHINE, blocks_per_sm=5)) == 5
    assert ht.occupancy(t, dataclasses.replace(TEST_MACHINE, smem_reserved_per_block=15 * 1024)) == 8  # 200 / 25


# ---- the Machine record -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value, message", [
    ("sms", 0, "must be positive"),
    ("sms", 100.0, "must be an int"),
    ("sms", True, "must be an int"),
    ("dram_gbps", -1.0, "must be positive"),
    ("mma_tflops", math.nan, "must be a finite number"),
    ("l2_gbps", "6000", "must be a finite number"),
])
def test_a_machine_refuses_a_value_that_is_no_rate_or_limit(field, value, message):
    with pytest.raises(ValueError, match=f"Machine.{field} {message}"):
        dataclasses.replace(TEST_MACHINE, **{field: value})
    dataclasses.replace(TEST_MACHINE, smem_reserved_per_block=0)  # sm_75 reserves none


def test_from_dict_names_missing_and_unknown_fields():
    d = TEST_MACHINE.as_dict()
    assert hm.Machine.from_dict(d) == TEST_MACHINE
    with pytest.raises(ValueError, match=r"missing \['l2_gbps'\], unknown \['l2_tbps'\]"):
        hm.Machine.from_dict({**{k: v for k, v in d.items() if k != "l2_gbps"}, "l2_tbps": 6.0})
    with pytest.raises(ValueError, match="a machine is a JSON object"):
        hm.Machine.from_dict([1, 2])


def test_record_json_schema_and_round_trip(tmp_path):
    rec = probe.record(TEST_MACHINE, ENV, date="2026-12-07")
    assert set(rec) == {"schema", "gpu", "environment", "date", "source", "machine"}
    assert rec["schema"] == probe.SCHEMA == 1 and rec["gpu"] == ENV["gpu"] and rec["environment"] == ENV
    assert list(rec["machine"]) == list(hm.FIELDS)
    path = tmp_path / "machine.json"
    path.write_text(json.dumps(rec))
    assert probe.load(path) == TEST_MACHINE  # floats survive JSON exactly
    path.write_text(json.dumps({**rec, "schema": 2}))
    with pytest.raises(ValueError, match="not a machine record of schema 1"):
        probe.load(path)
    path.write_text(json.dumps({**rec, "machine": {**rec["machine"], "sms": -4}}))
    with pytest.raises(ValueError, match=f"{path}: Machine.sms must be positive"):
        probe.load(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        probe.load(path)
    with pytest.raises(FileNotFoundError):
        probe.load(tmp_path / "none.json")


def test_limits_come_from_the_device_info_and_a_missing_one_is_named():
    info = SimpleNamespace(name="a GPU", cc=(8, 6), **{k: conftest.TEST_MACHINE_INPUTS[k] for k in hm.FIELDS[:7]})
    assert probe.limits_of(info) == {k: conftest.TEST_MACHINE_INPUTS[k] for k in hm.FIELDS[:7]}
    with pytest.raises(ValueError, match="reported no blocks_per_sm for a GPU"):
        probe.limits_of(SimpleNamespace(**{**vars(info), "blocks_per_sm": None}))
    with pytest.raises(ValueError, match="compute capability 8.0 or newer.*is 7.5"):
        probe.measure(SimpleNamespace(**{**vars(info), "cc": (7, 5), "name": "Tesla T4"}))
    fields = {f.name for f in dataclasses.fields(gpu.DeviceInfo)}
    assert {"threads_per_sm", "blocks_per_sm", "smem_reserved_per_block"} <= fields
    assert gpu._driver_attribute(None, 0) is None
    v = gpu._driver_attribute(106, 0)  # MAX_BLOCKS_PER_MULTIPROCESSOR: None without a driver, never an error
    assert v is None or v > 0


# ---- the cache --------------------------------------------------------------------------------------------------


def test_the_key_is_the_tuners_environment_plus_torch_and_the_probes_source(tmp_path, monkeypatch):
    assert probe.machine_key(ENV) == "NVIDIA H200|580.00|13.0|release 13.0|2.13.0|0123456789abcdef"
    for k in ENV:
        assert probe.machine_key({**ENV, k: "other"}) != probe.machine_key(ENV), k
    monkeypatch.setattr(gpu, "versions", lambda: {"gpu": "NVIDIA H200", "driver": "580", "cuda": "13.0"})
    env = probe.probe_environment()
    tune_env = ht.TuneCache(tmp_path / "t.json").environment
    assert {k: env[k] for k in tune_env} == tune_env and env["torch"] == probe.torch.__version__
    kdir = tmp_path / "kernels"
    shutil.copytree(hc.KERNEL_DIR, kdir)
    monkeypatch.setattr(hc, "KERNEL_DIR", kdir)
    before = probe.machine_key()
    (kdir / probe.PROBE_FILE).write_text((kdir / probe.PROBE_FILE).read_text() + "\n// edited\n")
    assert probe.machine_key() != before  # an edited probe measures again


@pytest.fixture
def stub_probe(monkeypatch):
    """`probe.measure` counted and answering TEST_MACHINE, the environment fixed (``stub.env``,
    changeable), this process's answers forgotten."""
    stub = SimpleNamespace(calls=0, env=dict(ENV))

    def measure(info=None):
        stub.calls += 1
        return TEST_MACHINE

    monkeypatch.setattr(probe, "measure", measure)
    monkeypatch.setattr(probe, "probe_environment", lambda: dict(stub.env))
    monkeypatch.setattr(probe, "_memo", {})
    return stub


def test_machine_for_measures_once_then_answers_from_the_cache(tmp_path, stub_probe, monkeypatch):
    path = tmp_path / "machine.json"
    assert probe.machine_for(path=path) == TEST_MACHINE and stub_probe.calls == 1
    assert probe.machine_for(path=path) == TEST_MACHINE and stub_probe.calls == 1  # this process's answer
    monkeypatch.setattr(probe, "_memo", {})  # another process: the file answers
    assert probe.machine_for(path=path) == TEST_MACHINE and stub_probe.calls == 1
    data = json.loads(path.read_text())
    assert list(data) == [probe.machine_key(ENV)] and probe.from_record(data[probe.machine_key(ENV)]) == TEST_MACHINE
    stub_probe.env["driver"] = "590.1"  # a new driver: measured again, both kept
    assert probe.machine_for(path=path) == TEST_MACHINE and stub_probe.calls == 2
    assert len(json.loads(path.read_text())) == 2
    monkeypatch.setenv(probe.MACHINE_CACHE_ENV, str(tmp_path / "env.json"))
    assert probe.default_machine_cache_path() == tmp_path / "env.json"


def test_a_damaged_cache_is_one_warning_and_a_new_measurement(tmp_path, stub_probe):
    path = tmp_path / "machine.json"
    path.write_text("{damaged")
    with pytest.warns(probe.MachineCacheWarning, match="unreadable"):
        assert probe.machine_for(path=path) == TEST_MACHINE
    assert stub_probe.calls == 1 and list(json.loads(path.read_text())) == [probe.machine_key(ENV)]
    key = probe.machine_key(ENV)
    path.write_text(json.dumps({key: {"schema": 1, "machine": {"sms": 1}}, "other": probe.record(TEST_MACHINE, ENV)}))
    probe._memo.clear()
    with pytest.warns(probe.MachineCacheWarning, match="1 malformed records"):
        assert probe.machine_for(path=path) == TEST_MACHINE
    assert stub_probe.calls == 2 and set(json.loads(path.read_text())) == {key, "other"}


def test_the_search_ranks_with_the_measured_machine(monkeypatch):
    """`enumerate_search` hands the space `machine_for`'s answer (it used `Machine.of`, an H200 scaled)."""
    from helpers.tune import search as hts

    monkeypatch.setattr(gpu, "device_info", lambda device=0: SimpleNamespace(smem_per_block_optin=227 * 1024,
                                                                            cc=(9, 0)))
    monkeypatch.setattr(hts, "machine_for", lambda info=None, path=None: TEST_MACHINE)
    seen = []
    sp = ht.space_of("igemm_production")
    spy = dataclasses.replace(sp, candidates=lambda p, m: seen.append(m) or sp.candidates(p, m))
    ht.enumerate_search(spy, Conv2dProblem(N=8, C=64, H=28, W=28, K=128, R=3, S=3, padding=1, dtype="fp16",
                                           layout="NHWC"))
    assert seen == [TEST_MACHINE]


# ---- committed records ------------------------------------------------------------------------------------------


def test_the_h200_record_is_what_day_15s_committed_runs_were_ranked_with():
    """``helpers.tune.H200`` (day 15's figures) is benchmarks/results/nvidia-h200/machine.json: the
    numbers machine.py held before issue 46 (its record says so: not a probe measurement)."""
    rec = json.loads(probe.committed_path("nvidia-h200").read_text())
    assert rec["source"].startswith("not measured by helpers.tune.probe")
    h = ht.H200
    assert h == probe.committed("nvidia-h200") == probe.from_record(rec)
    assert (h.sms, h.smem_per_sm, h.smem_reserved_per_block, h.regs_per_sm, h.threads_per_sm, h.blocks_per_sm) == (
        132, 228 * 1024, 1024, 65536, 2048, 32)
    assert (h.mma_tflops, h.dram_gbps, h.l2_gbps, h.launch_us) == (620.0, 4000.0, 10000.0, 3.0)


def test_a_missing_committed_record_says_how_to_write_it():
    with pytest.raises(FileNotFoundError, match="python -m benchmarks.machine"):
        probe.committed("nvidia-no-such-gpu")
    with pytest.raises(AttributeError):
        ht.H100  # noqa: B018 - only H200 is a lazy name


def test_the_cpu_tests_machine_is_the_committed_h100_record_or_the_test_inputs(tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "RESULTS", tmp_path)
    assert conftest.model_machine() == TEST_MACHINE  # nothing committed: the test inputs
    measured = dataclasses.replace(TEST_MACHINE, sms=132, mma_tflops=600.0)
    path = probe.committed_path(conftest.MODEL_MACHINE_GPU)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(probe.record(measured, ENV)))
    assert conftest.model_machine() == measured


# ---- the probe's kernel file ------------------------------------------------------------------------------------


def test_the_kernel_and_the_python_side_agree_on_the_launch():
    src = hc.kernel_path(probe.PROBE_FILE).read_text()
    assert re.search(rf"PROBE_THREADS = {probe.PROBE_THREADS}, PROBE_BLOCKS_PER_SM = {probe.BLOCKS_PER_SM};", src)
    for name, value in (("MMA_CHAINS", probe.MMA_CHAINS), ("FMA_CHAINS", probe.FMA_CHAINS),
                        ("FMA_UNROLL", probe.FMA_UNROLL)):
        assert re.search(rf"#define {name} {value}\n", src), name
    assert probe.FMA_ITERS % probe.FMA_UNROLL == 0
    assert probe.MMA_FLOP == 4096 and "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in src


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", hc.ARCHS)
def test_the_probe_compiles_without_spills_within_its_launch_bounds(arch):
    reports, log = hc.nvcc_compile(probe.PROBE_FILE, arch=arch)
    assert sorted(r.entry for r in reports) == ["probe_ffma", "probe_mma_f32acc"], log
    for r in reports:
        assert r.spill_stores == r.spill_loads == r.stack_bytes == 0, r
        assert r.registers <= 65536 // (probe.PROBE_THREADS * probe.BLOCKS_PER_SM), r  # 4 blocks of 256 resident


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
def test_the_probe_loops_issue_independent_mma_and_fma_chains(arch, tmp_path):
    """In the PTX (no cuobjdump here for SASS): the mma loop body is whole groups of `MMA_CHAINS`
    mma.sync (none on sm_75, where the body is compiled out), the FMA loop 4 x 8 fma.rn.f32 per trip
    at least."""
    out = tmp_path / "p.ptx"
    subprocess.run(["nvcc", "-ptx", f"-arch={arch}", *hc.NVCC_OPTIONS, "-I", str(hc.KERNEL_DIR),
                    str(hc.kernel_path(probe.PROBE_FILE)), "-o", str(out)], check=True, capture_output=True)
    ptx = out.read_text()
    bodies = dict(re.findall(r"\.entry (\w+)\((.*?)\n}\n", ptx, re.S))
    mma = bodies["probe_mma_f32acc"].count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")
    fma = bodies["probe_ffma"].count("fma.rn.f32")
    if arch == "sm_75":
        assert mma == 0
    else:
        assert mma > 0 and mma % probe.MMA_CHAINS == 0, mma
    assert fma >= probe.FMA_UNROLL * probe.FMA_CHAINS, fma


# ---- the command line -------------------------------------------------------------------------------------------


@pytest.mark.skipif(gpu.has_gpu(), reason="a GPU is present: the no-GPU message does not apply")
def test_the_command_line_without_a_gpu_exits_2_with_a_plain_message():
    r = subprocess.run([sys.executable, "-m", "benchmarks.machine"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "needs an NVIDIA GPU" in r.stderr and "Traceback" not in r.stderr
    assert not list((ROOT / "benchmarks" / "results").glob("none*"))


def test_describe_gives_every_field_a_unit_and_a_source():
    rows = probe.describe(TEST_MACHINE)
    assert [r[0] for r in rows] == list(hm.FIELDS)
    assert dict((r[0], r[1]) for r in rows)["dram_gbps"] == "2,000.00 GB/s"
    assert all(r[2] for r in rows)
