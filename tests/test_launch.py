"""The launch path's packing and what it keeps, on the CPU.

* `helpers.launch.param_buffer` packs every launch of the training network's layers (day 14's
  `make_pair(16, 64, 32, 2)`, on days 13-14's and Hopper's kernels) byte for byte as pycuda's
  ``_build_arg_buf`` does (`conftest.packed_like_pycuda`, written with numpy alone), after
  `helpers.tma.kernel_args` for the launches that pass tensor maps; `Launcher` packs each set of
  addresses once and keeps at most `BUFFERS_KEPT`.
* `helpers.tma.encode` asks the driver once per (map, address), checks a new address first, and
  keeps no refusal.

tests/gpu/test_wgmma_gpu.py checks the same packing against pycuda's own ``_build_arg_buf``.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import TRAIN_VARIANTS, RecordingKernel, driver_like_offsets, packed_like_pycuda, train_layers

from helpers import tma
from helpers.launch import BUFFERS_KEPT, Launcher, param_buffer
from helpers.tma import MapBytes, TensorMap, kernel_args
from helpers.variants import Buffer, KernelLaunch, LaunchConfig, get

HOPPER_SMEM = 227 * 1024


TRAIN_PLANS = [
    pytest.param(plan, id=f"{name}-{p.name}")
    for name in TRAIN_VARIANTS
    for p in train_layers()
    for plan in [get(name).plan(get(name).adapt(p, op=True))]
    if plan.refusal(smem_limit=HOPPER_SMEM, cc=(9, 0)) is None
]


def fake_map(desc, address: int) -> MapBytes:
    """A stand-in for `helpers.tma.encode`: 128 bytes that name the map and the address."""
    return MapBytes(f"{hash(desc) & 0xFFFFFFFF:08x}{address:016x}".encode().ljust(128, b"."))


def test_the_training_layers_have_plans_of_every_variant():
    """Each variant of both kernel sets runs at least one of the training network's layers on an
    H100 (so the packing test below covers all six)."""
    assert {param.values[0].variant.name for param in TRAIN_PLANS} == set(TRAIN_VARIANTS)


@pytest.mark.parametrize("plan", TRAIN_PLANS)
def test_param_buffer_packs_every_launch_as_pycuda(plan, monkeypatch):
    """For fake addresses, every launch's buffer is the bytes pycuda's ``_build_arg_buf`` packs for
    the arguments `bind` used to pass (np.uintp pointers, encoded maps, the scalars), laid out by
    `kernel_args` first where the launch passes a map."""
    monkeypatch.setattr("helpers.launch.encode_map", fake_map)
    for k in plan.launches:
        maps = any(isinstance(a, TensorMap) for a in k.args)
        launcher = Launcher(k, RecordingKernel(k.entry, []), driver_like_offsets(k.args) if maps else None)
        addresses = tuple(0x7F0000000000 + 0x100000 * i + 256 * (i % 3) for i in range(len(launcher.refs)))
        at = iter(addresses)
        args = tuple(fake_map(a.desc, next(at)) if isinstance(a, TensorMap) else
                     np.uintp(next(at)) if isinstance(a, Buffer) else a for a in k.args)
        assert launcher.arguments(addresses) == args
        want = packed_like_pycuda(kernel_args(args, launcher.offsets) if maps else args)
        assert param_buffer(args, launcher.offsets) == want, k.entry
        if maps:
            assert len(want) == launcher.offsets[-1] + args[-1].itemsize  # the last parameter where the driver reads it


def test_param_buffer_aligns_like_pycuda_and_refuses_other_types():
    args = (np.int32(7), np.uintp(0x1234), np.float32(1.5), np.int64(-2), np.int32(3), np.void(b"abc"), np.int16(1))
    buf = param_buffer(args)
    assert buf == packed_like_pycuda(args) and len(buf) == 4 + 4 + 8 + 4 + 4 + 8 + 4 + 3 + 1 + 2
    assert buf[4:8] == bytes(4) and buf[20:24] == bytes(4)  # the padding before each 8-byte scalar
    with pytest.raises(TypeError, match="parameter 1: kernel arguments are numpy scalars; got int"):
        param_buffer((np.int32(1), 5))
    with pytest.raises(TypeError, match="numpy scalars or MapBytes"):  # kernel_args' own refusal
        param_buffer((5,), (0,))


def test_a_launcher_packs_each_set_of_addresses_once_and_keeps_a_bounded_number(monkeypatch):
    """`Launcher.bound` packs (and encodes the maps of) a set of addresses on its first use only;
    it keeps at most `BUFFERS_KEPT` buffers; every closure launches its own buffer."""
    packed, calls = [], []
    real = param_buffer
    monkeypatch.setattr("helpers.launch.param_buffer", lambda *a: packed.append(a) or real(*a))
    monkeypatch.setattr("helpers.launch.encode_map", fake_map)
    desc = tma.TiledMap("fp16", (64, 64), (128,), (64, 64))
    k = KernelLaunch("main", "e", LaunchConfig((3, 1, 1), (128, 1, 1), 1024),
                     (TensorMap("x", desc), Buffer("y"), np.int32(5)))
    launcher = Launcher(k, RecordingKernel("e", calls), (112, 240, 248))
    first = launcher.bound((0x10000, 0x20000))
    again = launcher.bound((0x10000, 0x20000))
    assert len(packed) == 1
    first()
    again()
    launcher.bound((0x10000, 0x30000))()
    assert len(packed) == 2 and calls[0] == calls[1] != calls[2]
    assert calls[0][2:] == ((3, 1, 1), (128, 1, 1), 1024)
    assert calls[2][1][240:248] == np.uintp(0x30000).tobytes()
    for i in range(2 * BUFFERS_KEPT):
        launcher.bound((0x10000, 0x40000 + 16 * i))
        assert len(launcher.buffers) <= BUFFERS_KEPT


class _FakeDriver:
    """A stand-in for ``libcuda.so.1``'s map encoders: writes the address into the map's first 8
    bytes and counts the calls."""

    def __init__(self):
        self.calls = 0

    def cuTensorMapEncodeTiled(self, out, dtype, rank, address, *rest):  # noqa: N802 - the driver's name
        self.calls += 1
        ctypes.memmove(out, ctypes.byref(ctypes.c_uint64(address.value)), 8)
        return 0

    cuTensorMapEncodeIm2col = cuTensorMapEncodeTiled


def test_encode_asks_the_driver_once_per_map_and_address(monkeypatch):
    """The same map at the same address is encoded once; a new address is checked first (a
    misaligned one is refused, and not kept) and encoded; a description given lists is hashable."""
    driver = _FakeDriver()
    monkeypatch.setattr(tma, "_libcuda", lambda: driver)
    tma.encode.cache_clear()
    desc = tma.TiledMap("fp16", [64, 64], [128], [64, 64])  # lists: stored as tuples
    assert desc.dims == (64, 64) and hash(desc) == hash(tma.TiledMap("fp16", (64, 64), (128,), (64, 64)))
    a = tma.encode(desc, 0x10000)
    assert tma.encode(desc, 0x10000) is a and driver.calls == 1
    assert a.data[:8] == (0x10000).to_bytes(8, "little")
    b = tma.encode(desc, 0x20000)
    assert driver.calls == 2 and b.data[:8] == (0x20000).to_bytes(8, "little")
    for _ in range(2):
        with pytest.raises(ValueError, match="not 16-byte aligned"):
            tma.encode(desc, 0x20008)
    assert driver.calls == 2
    im2col = tma.Im2colMap("fp16", [64, 8, 8, 2], [128, 1024, 8192], [-1, -1], [-1, -1], 64, 64, [1, 1, 1, 1])
    tma.encode(im2col, 0x10000)
    tma.encode(im2col, 0x10000)
    assert driver.calls == 3
    tma.encode.cache_clear()


def test_the_maps_the_days_build_are_hashable():
    """`encode` keeps maps by their description: every map argument of the training layers' plans
    hashes, and equal descriptions (the same layer planned twice) hash alike."""
    for param in TRAIN_PLANS:
        plan = param.values[0]
        for k, again in zip(plan.launches, plan.variant.plan(plan.problem).launches):
            for a, b in zip(k.args, again.args):
                if isinstance(a, TensorMap):
                    assert a.desc == b.desc and hash(a.desc) == hash(b.desc)


def test_default_stream_check_is_made_on_every_call(monkeypatch):
    """`_check_stream` asks torch for the current stream each time (a user may enter a stream
    between two calls of a kept plan)."""
    from helpers import launch as hl

    streams = iter([0, 0, 7])
    monkeypatch.setattr("torch.cuda.current_stream", lambda device=None: SimpleNamespace(cuda_stream=next(streams)))
    hl._check_stream("cuda:0")
    hl._check_stream("cuda:0")
    with pytest.raises(RuntimeError, match="leave torch.cuda.stream"):
        hl._check_stream("cuda:0")


def test_a_stream_of_helpers_gpu_stream_is_launched_on(monkeypatch):
    """On a stream `helpers.gpu.stream` made (as when a CUDA graph is captured on it), `_check_stream`
    answers its pycuda stream and every launch of a bound plan goes on it; the default stream
    answers None; any other stream raises before a launch."""
    from helpers import gpu
    from helpers import launch as hl

    ours = object()  # stands for the pycuda Stream of handle 0x70
    monkeypatch.setattr(gpu, "_streams", {0x70: ours})
    current = SimpleNamespace(cuda_stream=0x70)
    monkeypatch.setattr("torch.cuda.current_stream", lambda device=None: current)
    assert hl._check_stream("cuda:0") is ours
    calls = []
    k = KernelLaunch("main", "e", LaunchConfig((2, 1, 1), (64, 1, 1), 0), (Buffer("y"), np.int32(5)))
    hl.bind([Launcher(k, RecordingKernel("e", calls, stream=ours))], {"y": None}, ours)["main"]()
    assert len(calls) == 1
    current.cuda_stream = 0
    assert hl._check_stream("cuda:0") is None
    current.cuda_stream = 0x71
    with pytest.raises(RuntimeError, match="helpers.gpu.stream"):
        hl._check_stream("cuda:0")


def test_a_launch_past_48_kb_in_all_opts_in():
    """Static and dynamic shared memory count together against the 48 KB a block gets without opting in
    (a kernel of 46 KB static launched with 20 KB of dynamic needs the attribute, as one of 60 KB dynamic does)."""
    from helpers.compile import needs_opt_in

    assert needs_opt_in(0, 60 * 1024) and needs_opt_in(46 * 1024, 20 * 1024)
    assert not needs_opt_in(46 * 1024, 0) and not needs_opt_in(16 * 1024, 32 * 1024) and not needs_opt_in(0, 48 * 1024)
