"""Tensor maps for Hopper's bulk tensor copies (TMA), and the kernel arguments that carry them.

A kernel that loads with ``cp.async.bulk.tensor`` names a *tensor map*: 128 opaque bytes that
describe a tensor in global memory (its address, sizes, strides, element type) and the box one
copy moves into shared memory (its sizes, the swizzle of the rows it writes, what fills the
elements outside the tensor). The host fills it with the CUDA driver's ``cuTensorMapEncodeTiled``
or ``cuTensorMapEncodeIm2col`` and passes it to the kernel by value, as a
``const __grid_constant__ CUtensorMap`` parameter. This module:

* describes maps as plain data that can be checked without a GPU: `TiledMap` (a box of a tensor
  at given coordinates: day 16's filter tiles) and `Im2colMap` (a column of output pixels'
  input patches, walked with the convolution's strides: day 16's activation tiles), each with a
  ``reason()`` that names the first limit of the copy engine it breaks, before anything is asked
  of the driver;
* encodes them (`encode`) by calling the driver through ``ctypes`` on ``libcuda.so.1``, into a
  64-byte aligned host buffer as the driver requires, returning the 128 bytes as a `MapBytes`;
* lays out a kernel's argument list (`kernel_args`): pycuda packs arguments back to back from
  offset 0, each numpy scalar at its natural alignment, but the driver expects a ``CUtensorMap``
  parameter where the GPU's parameter memory is 64-byte aligned (offsets of 48 modulo 64 on the
  H200), so the buffer needs padding bytes before a map, at the offsets the driver reports
  (`helpers.compile.param_offsets`); without them the kernel reads its map, and every later
  argument, from the wrong bytes.
* `TensorMap` names a map argument of a `helpers.variants.KernelLaunch`: the tensor by name and
  the map's description, encoded with the tensor's address when the launch is bound;
  `UNUSED_MAP` fills a map parameter the kernel leaves unread.

Sources: the CUDA driver API reference, "Tensor Map Object Management" (cuTensorMapEncodeTiled,
cuTensorMapEncodeIm2col: every limit `reason` checks is from there) and the PTX ISA, "Tensors"
(tiled and im2col modes, the bounding box, traversal strides, out-of-bound fill).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import numpy as np

MAP_BYTES = 128  # sizeof(CUtensorMap)
MAP_ALIGN = 64  # alignof(CUtensorMap): of the host buffer the driver fills and of the kernel parameter
DATA_TYPES = {"fp16": 6, "bf16": 9}  # CU_TENSOR_MAP_DATA_TYPE_FLOAT16, _BFLOAT16
ELEMENT_BYTES = {"fp16": 2, "bf16": 2}
SWIZZLES = {0: 0, 32: 1, 64: 2, 128: 3}  # swizzle span in bytes -> CU_TENSOR_MAP_SWIZZLE_NONE/32B/64B/128B
L2_PROMOTION_128B = 2  # CU_TENSOR_MAP_L2_PROMOTION_L2_128B
GLOBAL_ALIGN = 16  # the tensor's address and every stride but the innermost: multiples of 16 bytes
MAX_BOX = 256  # each box dimension (tiled), channels per pixel and pixels per column (im2col)
# im2col: the bounding box's corners, per rank (3, 4, 5 dims), as signed ranges; the instruction's
# filter offsets are unsigned and of the same width (16, 8, 5 bits).
CORNER_RANGE = {3: (-(2**15), 2**15 - 1), 4: (-(2**7), 2**7 - 1), 5: (-(2**4), 2**4 - 1)}
OFFSET_LIMIT = {3: 2**16, 4: 2**8, 5: 2**5}
MAPS_KEPT = 4096  # encoded maps `encode` keeps, by (description, address), the most recently used


def _common_reason(dtype: str, dims: tuple, strides: tuple, address: int | None, swizzle: int) -> str | None:
    if dtype not in DATA_TYPES:
        return f"dtype {dtype!r}: tensor maps here take {', '.join(DATA_TYPES)}"
    if not 1 <= len(dims) <= 5 or len(strides) != len(dims) - 1:
        return f"{len(dims)} dims with {len(strides)} strides: 1 to 5 dims, a stride for each but the first"
    if any(not 1 <= d <= 2**32 for d in dims):
        return f"dims {dims}: each is 1 .. 2^32"
    bad = [s for s in strides if s % GLOBAL_ALIGN or not 0 < s < 2**40]
    if bad:
        return f"strides {strides} bytes: each must be a positive multiple of {GLOBAL_ALIGN} below 2^40"
    if address is not None and address % GLOBAL_ALIGN:
        return f"address 0x{address:x} is not {GLOBAL_ALIGN}-byte aligned"
    if swizzle not in SWIZZLES:
        return f"swizzle {swizzle}: one of {sorted(SWIZZLES)} bytes"
    return None


def _as_tuples(desc, names: tuple[str, ...]) -> None:
    """Store each of ``desc``'s fields ``names`` as a tuple (a list given is converted), so that a
    map description is hashable: `encode` keeps maps by it."""
    for nm in names:
        object.__setattr__(desc, nm, tuple(getattr(desc, nm)))


def _inner_reason(inner_elems: int, dtype: str, swizzle: int) -> str | None:
    inner = inner_elems * ELEMENT_BYTES[dtype]
    if inner % 16:
        return f"the innermost box dimension is {inner} bytes: a multiple of 16"
    if swizzle and inner > swizzle:
        return f"the innermost box dimension is {inner} bytes, more than the {swizzle}-byte swizzle span"
    return None


@dataclass(frozen=True)
class TiledMap:
    """A tiled tensor map: boxes of ``box`` elements of a tensor of ``dims`` elements.

    Attributes:
        dtype: ``"fp16"`` or ``"bf16"``.
        dims: sizes, innermost (contiguous) first, e.g. a KRSC filter is ``(C, S, R, K)``.
        strides: bytes between consecutive indices of dims 1.. (dim 0 is contiguous).
        box: elements per copy along each dim (each 1 .. 256; the innermost box bytes a multiple
            of 16 and at most the swizzle span).
        swizzle: 0, 32, 64 or 128: the shared-memory rows are XOR-swizzled in 16-byte chunks
            over that many bytes (128: chunk j of row r at chunk j ^ (r % 8)); rows of a box are
            its innermost dimension.
        nan_fill: elements outside the tensor read as NaN rather than zero.
    """

    dtype: str
    dims: tuple
    strides: tuple
    box: tuple
    swizzle: int = 128
    nan_fill: bool = False

    def __post_init__(self):
        _as_tuples(self, ("dims", "strides", "box"))

    @property
    def box_bytes(self) -> int:
        """Bytes one copy writes to shared memory (and counts on its mbarrier)."""
        return int(np.prod(self.box)) * ELEMENT_BYTES[self.dtype]

    def reason(self, address: int | None = None) -> str | None:
        """None if the driver will encode this map (at ``address``, when given), else why not."""
        r = _common_reason(self.dtype, self.dims, self.strides, address, self.swizzle)
        if r:
            return r
        if len(self.box) != len(self.dims) or any(not 1 <= b <= MAX_BOX for b in self.box):
            return f"box {self.box}: one size per dim, each 1 .. {MAX_BOX}"
        return _inner_reason(self.box[0], self.dtype, self.swizzle)


@dataclass(frozen=True)
class Im2colMap:
    """An im2col tensor map over an NHWC tensor, dims ``(C, W, H, N)`` innermost first.

    One copy writes ``pixels`` rows of ``channels`` channels: consecutive output pixels (q, then
    p, then n) of one filter tap, each row the input pixel that tap reads for that output pixel.
    The walk covers, per image, the bounding box from ``lower`` to ``upper`` (corners (w, h):
    ``lower`` relative to input pixel (0, 0), ``upper`` to (W - 1, H - 1), both inclusive) in
    steps of ``element_strides`` (1, stride_w, stride_h, 1). For a convolution with padding
    (pw, ph) and P x Q outputs the box is ``lower = (-pw, -ph)`` and ``upper = ((Q-1) sw - pw -
    (W-1), (P-1) sh - ph - (H-1))``: exactly P x Q pixels, whatever the filter, because the tap's
    offset (s dw, r dh) is given by each copy instruction and shifts the whole walk. Pixels
    outside the image read as zeros: the padding.

    Attributes:
        dtype, dims, strides, swizzle, nan_fill: as `TiledMap` (dims 4: C, W, H, N).
        lower, upper: the bounding box's corners (w, h), each within `CORNER_RANGE` of the rank.
        channels: channels per pixel (row), 1 .. 256, a multiple of 16 bytes, at most the swizzle span.
        pixels: pixels per copy (rows), 1 .. 256.
        element_strides: per dim, the walk's step (1 .. 8), innermost first.
    """

    dtype: str
    dims: tuple
    strides: tuple
    lower: tuple
    upper: tuple
    channels: int
    pixels: int
    element_strides: tuple = (1, 1, 1, 1)
    swizzle: int = 128
    nan_fill: bool = False

    def __post_init__(self):
        _as_tuples(self, ("dims", "strides", "lower", "upper", "element_strides"))

    @property
    def box_bytes(self) -> int:
        """Bytes one copy writes to shared memory (and counts on its mbarrier)."""
        return self.channels * self.pixels * ELEMENT_BYTES[self.dtype]

    def reason(self, address: int | None = None) -> str | None:
        """None if the driver will encode this map (at ``address``, when given), else why not."""
        r = _common_reason(self.dtype, self.dims, self.strides, address, self.swizzle)
        if r:
            return r
        rank = len(self.dims)
        if rank not in CORNER_RANGE:
            return f"im2col maps have 3 to 5 dims; got {rank}"
        spatial = rank - 2
        if len(self.lower) != spatial or len(self.upper) != spatial:
            return f"corners {self.lower}, {self.upper}: {spatial} values each"
        lo, hi = CORNER_RANGE[rank]
        for name, corner in (("lower", self.lower), ("upper", self.upper)):
            if any(not lo <= v <= hi for v in corner):
                return f"the bounding box's {name} corner {corner} is outside {lo} .. {hi} (a {rank}-d im2col map)"
        if len(self.element_strides) != rank or any(not 1 <= s <= 8 for s in self.element_strides):
            return f"element strides {self.element_strides}: one per dim, each 1 .. 8"
        if not 1 <= self.pixels <= MAX_BOX:
            return f"pixels per column {self.pixels}: 1 .. {MAX_BOX}"
        if not 1 <= self.channels <= MAX_BOX:
            return f"channels per pixel {self.channels}: 1 .. {MAX_BOX}"
        return _inner_reason(self.channels, self.dtype, self.swizzle)


@dataclass(frozen=True)
class MapBytes:
    """An encoded tensor map, as a kernel argument: 128 bytes, placed at a 64-byte aligned
    parameter offset by `kernel_args`."""

    data: bytes

    def __post_init__(self):
        if len(self.data) != MAP_BYTES:
            raise ValueError(f"a tensor map is {MAP_BYTES} bytes; got {len(self.data)}")


UNUSED_MAP = MapBytes(bytes(MAP_BYTES))
"""128 zero bytes for a map parameter the kernel will not read on this problem (day 16's map of y
when K % 8 != 0, where y's rows are no 16-byte stride and the threads store it themselves); a
copy issued on it would fault."""


@dataclass(frozen=True)
class TensorMap:
    """A tensor-map argument of a `helpers.variants.KernelLaunch`: the map ``desc`` of the tensor
    named ``name`` (as a `helpers.variants.Buffer` names it), encoded with that tensor's address
    plus ``offset`` bytes (e.g. one part of the workspace) when the launch is bound
    (`helpers.launch.bind`)."""

    name: str
    desc: TiledMap | Im2colMap
    offset: int = 0


def kernel_args(args: tuple, offsets: tuple) -> tuple:
    """``args`` (numpy scalars and `MapBytes`) as pycuda takes them, placed at ``offsets``, the
    byte offsets the driver expects each parameter at (`helpers.compile.param_offsets`): before
    an argument that would otherwise land short of its offset, an ``np.void`` of zero bytes fills
    the gap; each map becomes an ``np.void`` of its 128 bytes.

    pycuda packs numpy scalars at their natural alignment and ``np.void`` with none, from offset
    0. A ``__grid_constant__ CUtensorMap`` parameter is 64-byte aligned in the GPU's parameter
    memory, which the driver reports as offsets of 48 modulo 64 on the H200 (its parameter bank
    starts 16 bytes past a 64-byte line). Placed where plain packing puts it, the map and every
    later argument are read from the wrong bytes: on the H200 such a launch ran without an error
    (a small probe kernel read the wrong map bytes; a copy from a garbled map faults).

    Raises:
        ValueError: as many offsets as arguments, increasing without overlap, are needed.
        TypeError: an argument that is neither a numpy scalar nor a `MapBytes`.
    """
    if len(args) != len(offsets):
        raise ValueError(f"the kernel takes {len(offsets)} parameters; the launch passes {len(args)}")
    out, end = [], 0
    for i, (a, off) in enumerate(zip(args, offsets)):
        if isinstance(a, MapBytes):
            size, value = MAP_BYTES, np.void(a.data)
        elif isinstance(a, np.generic) and not isinstance(a, np.void):
            size, value = a.itemsize, a
        else:
            raise TypeError(f"parameter {i}: kernel arguments are numpy scalars or MapBytes; got {type(a).__name__}")
        if off < end:
            raise ValueError(f"parameter {i} at byte {off} overlaps the one before it (which ends at {end})")
        if off > end:
            out.append(np.void(bytes(off - end)))
        out.append(value)
        end = off + size
    return tuple(out)


# ---- the driver call ---------------------------------------------------------------------------

_driver = None


def _libcuda():
    global _driver
    if _driver is None:
        try:
            _driver = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise RuntimeError(f"tensor maps are encoded by the CUDA driver; libcuda.so.1 did not load ({e})") from e
        u32, u64p, u32p, i32p = ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32), \
            ctypes.POINTER(ctypes.c_int32)
        _driver.cuTensorMapEncodeTiled.argtypes = [ctypes.c_void_p, ctypes.c_int, u32, ctypes.c_void_p, u64p, u64p,
                                                   u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                                   ctypes.c_int]
        _driver.cuTensorMapEncodeIm2col.argtypes = [ctypes.c_void_p, ctypes.c_int, u32, ctypes.c_void_p, u64p, u64p,
                                                    i32p, i32p, u32, u32, u32p, ctypes.c_int, ctypes.c_int,
                                                    ctypes.c_int, ctypes.c_int]
        _driver.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return _driver


def _array(ctype, values):
    return (ctype * len(values))(*values)


@functools.lru_cache(maxsize=MAPS_KEPT)
def encode(desc: TiledMap | Im2colMap, address: int) -> MapBytes:
    """Encode ``desc`` for the tensor at device address ``address`` with the CUDA driver.

    The driver writes the map into a host buffer that must be 64-byte aligned: one of 192 bytes
    is allocated and the first aligned 128 of it used.

    Kept by (``desc``, ``address``), the `MAPS_KEPT` most recently used (the descriptions are
    frozen and the bytes immutable): a training step maps the same tensors at the same addresses
    step after step (torch's caching allocator), and asks the driver once. A new address is
    checked (``desc.reason``) and encoded; a refusal is not kept.

    Raises:
        ValueError: ``desc.reason(address)`` is not None (the message is the reason).
        RuntimeError: the driver is missing, or refused the map (its error name and code).
    """
    reason = desc.reason(address)
    if reason:
        raise ValueError(f"tensor map: {reason}")
    lib = _libcuda()
    raw = ctypes.create_string_buffer(MAP_BYTES + MAP_ALIGN)
    base = ctypes.addressof(raw)
    aligned = base + (-base % MAP_ALIGN)
    dims = _array(ctypes.c_uint64, desc.dims)
    strides = _array(ctypes.c_uint64, desc.strides)
    common = (DATA_TYPES[desc.dtype], len(desc.dims), ctypes.c_void_p(address), dims, strides)
    tail = (0, SWIZZLES[desc.swizzle], L2_PROMOTION_128B, int(desc.nan_fill))  # interleave none
    if isinstance(desc, TiledMap):
        ones = _array(ctypes.c_uint32, [1] * len(desc.dims))
        rc = lib.cuTensorMapEncodeTiled(aligned, *common, _array(ctypes.c_uint32, desc.box), ones, *tail)
    else:
        rc = lib.cuTensorMapEncodeIm2col(aligned, *common, _array(ctypes.c_int32, desc.lower),
                                         _array(ctypes.c_int32, desc.upper), desc.channels, desc.pixels,
                                         _array(ctypes.c_uint32, desc.element_strides), *tail)
    if rc != 0:
        msg = ctypes.c_char_p()
        lib.cuGetErrorString(rc, ctypes.byref(msg))
        raise RuntimeError(f"the driver refused the tensor map {desc}: error {rc} ({(msg.value or b'?').decode()})")
    return MapBytes(ctypes.string_at(aligned, MAP_BYTES))


# ---- a model of the im2col walk ------------------------------------------------------------------


def im2col_rows(desc: Im2colMap, start: tuple[int, int, int], offsets: tuple[int, int]) -> list:
    """Which input pixel each row of one im2col copy holds, as the copy engine walks (a Python
    model of the PTX ISA's im2col mode, checked against the H200's copy engine by day 16's tests).

    Per image, the walk visits w = lower_w, lower_w + stride_w, ... up to (W - 1) + upper_w and,
    for each, h likewise (w fastest, then h, then the image n); the copy starts at the walk
    position ``start`` = (w, h, n) and takes ``desc.pixels`` consecutive positions, running on
    into the next images. Row i holds input pixel (n, h + off_h, w + off_w) for ``offsets`` =
    (off_w, off_h), or None (zeros) where that lies outside the image or n >= N.

    Returns:
        ``desc.pixels`` entries, each ``(n, h, w)`` or None.

    Raises:
        ValueError: ``start`` is not a position of the walk.
    """
    _, W, H, N = desc.dims
    (lw, lh), (uw, uh) = desc.lower, desc.upper
    _, sw, sh, _ = desc.element_strides
    ws = list(range(lw, W - 1 + uw + 1, sw))
    hs = list(range(lh, H - 1 + uh + 1, sh))
    w0, h0, n0 = start
    if w0 not in ws or h0 not in hs:
        raise ValueError(f"start {start} is not a position of the walk (w in {ws[:3]}..., h in {hs[:3]}...)")
    i = (n0 * len(hs) + hs.index(h0)) * len(ws) + ws.index(w0)
    rows = []
    for j in range(i, i + desc.pixels):
        n, rest = divmod(j, len(hs) * len(ws))
        h, w = hs[rest // len(ws)] + offsets[1], ws[rest % len(ws)] + offsets[0]
        rows.append((n, h, w) if n < N and 0 <= h < H and 0 <= w < W else None)
    return rows
