"""Shared pytest setup: the repository root on ``sys.path`` and the ``gpu`` / ``big`` / ``nvcc`` skips.

* ``@pytest.mark.gpu`` tests (and everything under ``tests/gpu``) are skipped unless torch sees a
  CUDA device **and** ``pycuda.driver`` imports (it needs the NVIDIA driver's ``libcuda.so.1``).
* ``@pytest.mark.big`` tests (tensors of 2^31 elements) are skipped unless the GPU has at least
  `BIG_MEMORY_BYTES` of memory.
* ``@pytest.mark.nvcc`` tests (they compile kernels, no GPU needed) are skipped unless ``nvcc`` is on PATH.
"""

from __future__ import annotations

import functools
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BIG_MEMORY_BYTES = 60 * 10**9


@pytest.fixture(autouse=True)
def every_source_hash_checks(monkeypatch):
    """Tests edit kernel files and call again at once: `helpers.compile.source_hash` re-checks
    on every call here (`SOURCE_RECHECK_S` 0; its own test sets it back)."""
    from helpers import compile as hc

    monkeypatch.setattr(hc, "SOURCE_RECHECK_S", 0.0)

# The machine the CPU tests give the tuner's cost model (`model_machine`): the committed measurement of
# the GPU the series publishes on, once `python -m benchmarks.machine` has written it there; until then
# TEST_MACHINE_INPUTS. Those are inputs chosen for the tests, round numbers that are no GPU's measurement:
# the tests that use them assert what must hold for any machine.
MODEL_MACHINE_GPU = "nvidia-h100-80gb-hbm3"
TEST_MACHINE_INPUTS = dict(sms=100, smem_per_sm=200 * 1024, smem_reserved_per_block=1024, regs_per_sm=65536,
                           threads_per_sm=2048, blocks_per_sm=32, l2_bytes=32 * 2**20, mma_tflops=400.0,
                           fma_tflops=40.0, dram_gbps=2000.0, l2_gbps=6000.0, launch_us=2.0)


@functools.cache
def gpu_skip_reason() -> str | None:
    """``None`` when GPU tests can run here, else why not (shown in pytest's skip summary)."""
    from helpers import gpu

    if not gpu.has_gpu():
        return "no CUDA device visible to torch (torch.cuda.is_available() is False)"
    try:
        import pycuda.driver  # noqa: F401
    except Exception as e:  # noqa: BLE001 - ImportError, or an OSError from a missing libcuda
        return f"pycuda is not importable: {e}"
    return None


@functools.cache
def big_skip_reason() -> str | None:
    """``None`` when the GPU has memory for the 2^31-element problems, else why not."""
    reason = gpu_skip_reason()
    if reason:
        return reason
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    if total < BIG_MEMORY_BYTES:
        return f"needs >= {BIG_MEMORY_BYTES / 1e9:.0f} GB of GPU memory; this GPU has {total / 1e9:.1f} GB"
    return None


@functools.cache
def nvcc_skip_reason() -> str | None:
    """``None`` when ``nvcc`` is on PATH, else why the compile tests skip."""
    from helpers import compile as hc

    return None if hc.nvcc_available() else "nvcc is not on PATH (install the CUDA 13 toolkit)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark everything under tests/gpu as ``gpu``; skip ``gpu``/``big``/``nvcc`` tests this machine cannot run."""
    gpu_dir = ROOT / "tests" / "gpu"
    for item in items:
        if gpu_dir in Path(item.path).parents:
            item.add_marker(pytest.mark.gpu)
        if item.get_closest_marker("nvcc") is not None and nvcc_skip_reason():
            item.add_marker(pytest.mark.skip(reason=nvcc_skip_reason()))
        if item.get_closest_marker("gpu") is None and item.get_closest_marker("big") is None:
            continue
        reason = gpu_skip_reason()
        if reason is None and item.get_closest_marker("big") is not None:
            reason = big_skip_reason()
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


def model_machine():
    """The tuner's `Machine` for the CPU tests: ``benchmarks/results/<MODEL_MACHINE_GPU>/machine.json``
    if committed (`helpers.tune.probe.committed`), else one of `TEST_MACHINE_INPUTS`."""
    from helpers.tune import probe
    from helpers.tune.machine import Machine

    if probe.committed_path(MODEL_MACHINE_GPU).is_file():
        return probe.committed(MODEL_MACHINE_GPU)
    return Machine(**TEST_MACHINE_INPUTS)


@pytest.fixture
def machine():
    """`model_machine`, as a fixture."""
    return model_machine()


@pytest.fixture
def misaligned():
    """``misaligned(t)``: a contiguous copy of tensor ``t`` (on its device) whose data starts one
    element (2 bytes for fp16/bf16) past an aligned allocation, as a view with a storage offset
    would; for the tests of the 16-byte (and 4-byte) alignment refusals."""

    def make(t):
        import torch

        out = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:].view(t.shape)
        out.copy_(t)
        assert out.is_contiguous() and out.data_ptr() % 16 == t.element_size()
        return out

    return make


class RecordingKernel:
    """A stand-in for a built kernel (a pycuda ``Function``) on the CPU: each launch of it, the call
    of ``_launch_kernel`` that `helpers.launch.Launcher` makes, is appended to ``calls`` as
    ``(entry, parameter buffer, grid, block, shared bytes)``; the stream must be ``stream`` (None:
    the default)."""

    def __init__(self, entry: str, calls: list, stream=None):
        self.entry, self.calls, self.stream = entry, calls, stream

    def _launch_kernel(self, grid, block, buf, shared, stream):
        assert stream is self.stream and isinstance(buf, bytes), (stream, type(buf))
        self.calls.append((self.entry, buf, grid, block, shared))


def packed_like_pycuda(args) -> bytes:
    """The parameter buffer pycuda's ``Function.__call__`` packs for ``args`` (``_build_arg_buf``:
    a numpy number at its type's natural alignment, an ``np.void``'s bytes unaligned, back to back
    from offset 0), written again with numpy alone to check `helpers.launch.param_buffer` against."""
    import numpy as np

    out = bytearray()
    for a in args:
        if isinstance(a, np.void):
            out += a.tobytes()
        else:
            assert isinstance(a, np.number), type(a)
            out += bytes(-len(out) % a.dtype.alignment) + a.tobytes()
    return bytes(out)


# The variants of both kernel sets benchmarks.train_step times: days 13-14 and days 16, 18, 19.
TRAIN_VARIANTS = ("igemm_production", "dgrad", "wgrad", "igemm_wgmma", "dgrad_wgmma", "wgrad_wgmma")


def train_layers(n: int = 64, size: int = 56) -> list:
    """The convolutions of `days.day14_backward.train.make_pair(16, 64, 32, 2)` on a batch of ``n``
    images of ``size`` x ``size`` (benchmarks.train_step's), each once: the stem (3x3, 16 -> 64),
    block 1 (1x1 64 -> 32 stride 2, 3x3 32 -> 32, 1x1 32 -> 128, the 1x1 64 -> 128 stride-2
    shortcut) and block 2's first 1x1 (128 -> 32; its others are block 1's): fprop problems."""
    from helpers.problem import Conv2dProblem

    half = size // 2
    shapes = [dict(C=16, H=size, K=64, R=3, padding=1), dict(C=64, H=size, K=32, R=1, stride=2),
              dict(C=32, H=half, K=32, R=3, padding=1), dict(C=32, H=half, K=128, R=1),
              dict(C=64, H=size, K=128, R=1, stride=2), dict(C=128, H=half, K=32, R=1)]
    return [Conv2dProblem(N=n, W=s["H"], S=s["R"], dtype="fp16", layout="NHWC", **s) for s in shapes]


def driver_like_offsets(args: tuple) -> tuple[int, ...]:
    """Parameter offsets like the H200's driver reports them for a launch's arguments (`Buffer`,
    `TensorMap`, `MapBytes` and numpy scalars): each scalar and pointer at its natural
    alignment, each tensor map 64-byte aligned in a parameter space that starts 16 bytes into a
    line (offsets of 48 modulo 64, past the first 64 bytes: 112 for a first map)."""
    import numpy as np

    from helpers.tma import MAP_BYTES, MapBytes, TensorMap
    from helpers.variants import Buffer

    out, end = [], 0
    for a in args:
        if isinstance(a, (TensorMap, MapBytes)):
            at = max(end, 64) + (48 - max(end, 64)) % 64
            size = MAP_BYTES
        else:
            a = np.uintp(0) if isinstance(a, Buffer) else a  # a pointer
            at, size = end + (-end % a.dtype.alignment), a.itemsize
        out.append(at)
        end = at + size
    return tuple(out)


def _skip_reason(report) -> str:
    """A skipped test's reason (pytest keeps it as ``(path, line, "Skipped: reason")``), cut at 100
    characters so that one kind of skip is one line."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    text = text.removeprefix("Skipped: ")
    return text if len(text) <= 100 else text[:99] + "…"


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """The skips in a few lines, counted by reason, most first: on a machine without a GPU most of
    the suite (tests/gpu and the GPU half of other files) skips by design."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    counts = Counter(_skip_reason(r) for r in skipped)
    expected = " (most are expected on a machine without a GPU)" if gpu_skip_reason() else ""
    terminalreporter.write_sep("-", f"{len(skipped)} skipped, by reason{expected}")
    for reason, n in counts.most_common(5):
        terminalreporter.write_line(f"{n:6d}  {reason}")
    if len(counts) > 5:
        terminalreporter.write_line(f"{sum(counts.values()) - sum(n for _, n in counts.most_common(5)):6d}  "
                                    f"{len(counts) - 5} other reasons (pytest -rs lists every skip)")


@pytest.fixture
def simulated_gpu(monkeypatch):
    """`helpers.check.check` with `prepare` replaced by days 20 and 21's float32 simulations (on CPU
    tensors): the harness's own verdict on the arithmetic of day 20's pipeline (`simulate`) and of
    day 21's fused kernels (`simulate_fused`, for a variant built from the fused kernel file)."""
    import importlib

    import numpy as np
    import torch

    from days import day20_winograd as w20
    from days import day21_winograd_fused as w21

    hchk = importlib.import_module("helpers.check")  # the module (the package re-exports its `check`)

    def fake_prepare(plan, x, w, out=None):
        out = torch.empty(plan.problem.y_shape) if out is None else out
        m = int(plan.variant.defines["WINO_M"])

        def run():
            if plan.variant.cu_file == w21.FUSED_CU_FILE:
                y = w21.simulate_fused(plan.problem, x.numpy(), w.numpy(), m, np.float32, cfg=plan.config)
            else:
                y, _ = w20.simulate(plan.problem, x.numpy(), w.numpy(), m, np.float32, cfg=plan.config)
            out.copy_(torch.from_numpy(y))

        return run, out

    monkeypatch.setattr(hchk, "prepare", fake_prepare)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    return hchk.check


def assert_launches_match_signatures(sigs: dict, variants, problems) -> None:
    """Every launch of each variant on each problem passes as many arguments as its entry's
    parameters (``sigs``: entry -> the parameter declarations, as written in the ``.cu`` file), a
    `helpers.variants.Buffer` for each pointer and an ``np.int32`` for each ``int``."""
    import numpy as np

    from helpers.variants import Buffer

    for p in problems:
        for v in variants:
            for k in v.launches(p):
                params = sigs[k.entry]
                assert len(params) == len(k.args), (k.entry, params, k.args)
                for par, arg in zip(params, k.args):
                    assert ("*" in par) == isinstance(arg, Buffer), (k.entry, par, arg)
                    assert "*" in par or (par.startswith("int ") and type(arg) is np.int32), (k.entry, par, arg)


def assert_check_ok(r, p, kind: str) -> None:
    """A `helpers.check.check` result passed: ok, no NaN/Inf, a second launch bitwise equal, and
    integer inputs bit-exact (the GPU tests of days 13, 16 and 22)."""
    assert r.ok, f"{r.variant} on {p.dtype} {p.name} ({kind}): {r.reason}"
    assert r.nonfinite == 0 and r.repeat_bitwise
    if kind == "int":
        assert r.exact is True, f"{r.variant} on {p.dtype} {p.name}: integer inputs but not bit-exact"
