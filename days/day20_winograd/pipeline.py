"""Day 20: Winograd's minimal filtering F(m x m, r x r), built exactly from interpolation points,
applied in float64 and float32 on the CPU, the rounding bound that includes the transforms'
constants, and the variants ``winograd_f2`` and ``winograd_f4`` (``kernels/conv2d/20_winograd.cu``):
fp32 on CUDA cores, NCHW and NHWC, as a pipeline of four launches over a workspace.

The pipeline (the second half of this module; the kernel file's header draws it):

* ``filter`` (w -> U = G g Gᵀ), ``input`` (x -> V = Bᵀ d B), ``gemm`` (M = U·V for each of the n²
  transform positions, grid z) and ``output`` (M -> y = Aᵀ M A), `pipeline_launches`; the
  workspace layout follows the entry's layout (`Geometry`), so every transform reads and writes
  along the contiguous axis and the GEMM is always row-major times row-major;
* the transforms' constants reach the kernel as ``-D`` defines generated here (`kernel_defines`),
  each the float32 nearest the exact fraction (`float32_nearest`);
* refusals before any launch (`winograd_reason`): groups, stride, dilation, a filter other than
  3 x 3, the kernels' int32 sizes, a workspace over `WORKSPACE_LIMIT` (with its size), the GEMM's grid;
* models of what each launch writes (`transform_writes`, `gemm_writes_model`, `output_writes`,
  `workspace_writes`) and the whole run on the CPU with the kernels' index arithmetic (`simulate`);
* the harness's bound for it (`winograd_model`, a `helpers.reference.ErrorModel`): `error_bound`
  over the whole output (`winograd_scale`), exact on integers only through dyadic transforms
  (`integers_exact`).

F(m, r) computes m outputs of a 1-D correlation with an r-tap filter, y[i] = Σ_k d[i + k]·g[k]
(i < m, over n = m + r − 1 inputs), with n multiplications instead of m·r:

    y = Aᵀ [(G g) ⊙ (Bᵀ d)]                      (Aᵀ: m x n, G: n x r, Bᵀ: n x n)

and in 2-D, nested, on an n x n input tile and an r x r filter: Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A,
n² multiplications for m² outputs instead of m²·r² (F(2, 3): 16 for 36, 2.25x fewer; F(4, 3):
36 for 144, 4x; F(6, 3): 64 for 324, 5.06x).

The construction (Toom-Cook, after Lavin and Gray): the product of two polynomials is known by its
values at n points, n − 1 finite points a_j and the point at infinity (the leading coefficient).
The correlation is a polynomial product read backwards, so the transforms are:
  Aᵀ[i][j] = a_j^i for a finite point, Aᵀ[i][n − 1] = [i == m − 1] for infinity (`a_transform`);
  G[j][k] = a_j^k / Π_{l ≠ j} (a_j − a_l) for a finite point, G[n − 1][k] = [k == r − 1] (`g_transform`);
  Bᵀ the unique matrix that makes the identity hold for every d and g, solved exactly (`b_transform`:
  the bilinear identity is linear in Bᵀ's entries; Fractions, no rounding).
`winograd` returns the three, exact; `check_identity` proves the 1-D identity on symbols' basis.

Rounding. Every stage is a matrix product that rounds; the error of the float computation is
bounded, to first order in the unit roundoff u, by the same products taken on absolute values
(`error_bound`), in the style of Higham's γ_k bounds for inner products:
  |Ŷ − Y| <= γ_k · |Aᵀ| [ (|G| |g| |Gᵀ|) ⊙ (|Bᵀ| |d| |B|) ] |A|   (summed over the input channels),
k = the longest chain of roundings an output goes through (`rounding_depth`), for values in the
format's normal range (no underflow or overflow). The transforms'
constants enter through |Aᵀ|, |G|, |Bᵀ|: their entries grow with m (points ±2, ±1/2, ...), which is
why F(6, 3) in float32 loses digits that F(2, 3) keeps.

Sources: A. Lavin and S. Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR 2016
(the nested 2-D form and the Toom-Cook construction); B. Barabasz, A. Anderson, K. M. Soodhalter
and D. Gregg, "Error Analysis and Improving the Accuracy of Winograd Convolution for Deep Neural
Networks", ACM TOMS 46(4), 2020 (the error grows with the transforms' norms; the choice of
points); N. J. Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., SIAM 2002,
section 3.1 (γ_k = k u / (1 − k u)).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

import numpy as np
import sympy
import torch
import torch.nn.functional as F

from helpers.problem import Conv2dProblem
from helpers.reference import UNDERFLOW, UNIT_ROUNDOFF, ErrorModel
from helpers.variants import INT32_MAX, Buffer, KernelLaunch, LaunchConfig, Variant, register

from ..kit import cdiv, gemm_writes, tile_visits

R = 3  # the filter size this day's kernels take (3 x 3)
# The finite interpolation points, in the order F(m, r) takes the first n − 1 of them: small
# magnitudes first, each with its negative and its reciprocal, the choice that keeps the
# transforms' entries smallest (Barabasz et al., section 5).
POINTS = (Fraction(0), Fraction(1), Fraction(-1), Fraction(2), Fraction(-2), Fraction(1, 2), Fraction(-1, 2),
          Fraction(3), Fraction(-3), Fraction(1, 3), Fraction(-1, 3))
FLOAT32_U = 2.0**-24  # unit roundoff of float32 (round to nearest)


def points_for(m: int, r: int = R) -> tuple[Fraction, ...]:
    """The n − 1 finite points of F(m, r), n = m + r − 1 (the last point is infinity).

    Raises:
        ValueError: m < 1, r < 1, or more points than `POINTS` holds.
    """
    if m < 1 or r < 1:
        raise ValueError(f"F({m}, {r}): m and r must be at least 1")
    n = m + r - 1
    if n - 1 > len(POINTS):
        raise ValueError(f"F({m}, {r}) needs {n - 1} finite points; POINTS has {len(POINTS)}")
    return POINTS[: n - 1]


def a_transform(m: int, pts: tuple[Fraction, ...]) -> list[list[Fraction]]:
    """Aᵀ (m x n): the output polynomial's coefficients from its values at the points and at infinity."""
    n = len(pts) + 1
    return [[pts[j] ** i if j < n - 1 else Fraction(int(i == m - 1)) for j in range(n)] for i in range(m)]


def g_transform(r: int, pts: tuple[Fraction, ...]) -> list[list[Fraction]]:
    """G (n x r): the filter polynomial evaluated at each point, scaled by the Lagrange denominator
    1 / Π_{l ≠ j} (a_j − a_l); at infinity, its leading coefficient.

    Raises:
        ValueError: a repeated point (no interpolation through it).
    """
    if len(set(pts)) != len(pts):
        raise ValueError(f"repeated interpolation points {sorted(pts)}: each point must be distinct")
    rows = []
    for j, a in enumerate(pts):
        f = Fraction(1)
        for l, b in enumerate(pts):
            if l != j:
                f *= a - b
        rows.append([a**k / f for k in range(r)])
    rows.append([Fraction(int(k == r - 1)) for k in range(r)])
    return rows


def b_transform(m: int, r: int, at: list[list[Fraction]], g: list[list[Fraction]]) -> list[list[Fraction]]:
    """Bᵀ (n x n): the unique matrix with Σ_j Aᵀ[i][j]·G[j][k]·Bᵀ[j][l] = [l == i + k] for every
    output i, filter tap k and input l (the 1-D identity, coefficient by coefficient), solved exactly.

    Raises:
        ValueError: no such matrix (points that do not interpolate: a repeated point).
    """
    n = m + r - 1
    out = [[Fraction(0)] * n for _ in range(n)]
    for l in range(n):  # column l of Bᵀ: n unknowns, m·r equations
        rows = [[at[i][j] * g[j][k] for j in range(n)] for i in range(m) for k in range(r)]
        rhs = [Fraction(int(l == i + k)) for i in range(m) for k in range(r)]
        a = sympy.Matrix([[sympy.Rational(v.numerator, v.denominator) for v in row] for row in rows])
        b = sympy.Matrix([sympy.Rational(v.numerator, v.denominator) for v in rhs])
        try:
            sol, params = a.gauss_jordan_solve(b)
        except ValueError as e:
            raise ValueError(f"F({m}, {r}): no Bᵀ for these points (column {l}): {e}") from None
        if params.shape[0]:
            raise ValueError(f"F({m}, {r}): Bᵀ is not unique for these points (column {l})")
        for j in range(n):
            out[j][l] = Fraction(int(sol[j].p), int(sol[j].q))
    return out


@dataclass(frozen=True)
class Winograd:
    """The exact transforms of F(m, r): ``at`` (m x n), ``g`` (n x r), ``bt`` (n x n), Fractions."""

    m: int
    r: int
    at: tuple[tuple[Fraction, ...], ...]
    g: tuple[tuple[Fraction, ...], ...]
    bt: tuple[tuple[Fraction, ...], ...]

    @property
    def n(self) -> int:
        """The input tile's side, m + r − 1 (also the transform positions per side)."""
        return self.m + self.r - 1

    def arrays(self, dtype=np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(Aᵀ, G, Bᵀ) as numpy arrays of ``dtype`` (each entry rounded once)."""
        return tuple(np.array([[float(v) for v in row] for row in t], dtype=dtype) for t in (self.at, self.g, self.bt))

    def multiplications_saved(self) -> float:
        """Multiplications of the direct 2-D tile over Winograd's: m² r² / n²."""
        return self.m**2 * self.r**2 / self.n**2


@cache
def winograd(m: int, r: int = R) -> Winograd:
    """F(m x m, r x r)'s transforms from `points_for`, exact (see the module docstring).

    Raises:
        ValueError: see `points_for` and `b_transform`.
    """
    pts = points_for(m, r)
    at, g = a_transform(m, pts), g_transform(r, pts)
    bt = b_transform(m, r, at, g)
    return Winograd(m, r, tuple(map(tuple, at)), tuple(map(tuple, g)), tuple(map(tuple, bt)))


def check_identity(w: Winograd) -> bool:
    """The 1-D identity in exact arithmetic on every basis pair (d = e_l, g = e_k): Aᵀ[(G e_k) ⊙
    (Bᵀ e_l)] has a 1 at output i exactly when l == i + k."""
    for k in range(w.r):
        for l in range(w.n):
            for i in range(w.m):
                got = sum(w.at[i][j] * w.g[j][k] * w.bt[j][l] for j in range(w.n))
                if got != (1 if l == i + k else 0):
                    return False
    return True


def correlate_tile(d: np.ndarray, g: np.ndarray, w: Winograd, dtype=np.float64) -> np.ndarray:
    """One output tile by Winograd: d (C, n, n) input tiles of C channels, g (C, r, r) one filter;
    Y (m, m) = Aᵀ [Σ_c (G g_c Gᵀ) ⊙ (Bᵀ d_c B)] A, every product computed in ``dtype`` (the
    transforms rounded to it once): the computation a kernel does, channel sum inside the
    transform domain (one GEMM per transform position).

    Raises:
        TypeError: a ``dtype`` that is not a floating type (an integer type would truncate the
            transforms' fractions).
    """
    if not np.issubdtype(np.dtype(dtype), np.floating):
        raise TypeError(f"correlate_tile computes in a floating type; got {np.dtype(dtype)}")
    at, gm, bt = w.arrays(dtype)
    d, g = d.astype(dtype), g.astype(dtype)
    u = np.einsum("ij,cjk,lk->cil", gm, g, gm).astype(dtype)  # G g Gᵀ, per channel
    v = np.einsum("ij,cjk,lk->cil", bt, d, bt).astype(dtype)  # Bᵀ d B
    mm = (u * v).astype(dtype).sum(axis=0, dtype=dtype)  # the products, summed over the channels
    return (at @ mm @ at.T).astype(dtype)


def direct_tile(d: np.ndarray, g: np.ndarray, m: int) -> np.ndarray:
    """The same tile directly in float64: Y[p][q] = Σ_c Σ_{r,s} d[c][p + r][q + s]·g[c][r][s]."""
    r = g.shape[-1]
    d, g = d.astype(np.float64), g.astype(np.float64)
    return np.array([[np.sum(d[:, p:p + r, q:q + r] * g) for q in range(m)] for p in range(m)])


def rounding_depth(w: Winograd, channels: int) -> int:
    """The longest chain of roundings from an input to an output of `correlate_tile`, counted as
    the γ_k of Higham's inner-product bound counts them (a sum of t terms: t − 1 additions, plus
    one per multiplication), as that code evaluates it: Bᵀ d B as one sum of n² triple products
    (n² + 1), G g Gᵀ likewise (r² + 1), their product (1): these multiply, so they add; the channel
    sum (C − 1); Aᵀ M A as two products of n terms (2n); and each of the six transform factors
    rounded once to the format (6)."""
    n, r = w.n, w.r
    return (n * n + 1) + (r * r + 1) + 1 + (channels - 1) + 2 * n + 6


def error_bound(d: np.ndarray, g: np.ndarray, w: Winograd, u: float = FLOAT32_U) -> np.ndarray:
    """The first-order bound on |Ŷ − Y| of `correlate_tile` in a format of unit roundoff ``u``,
    per output (m x m): γ_k·|Aᵀ| [Σ_c (|G| |g_c| |Gᵀ|) ⊙ (|Bᵀ| |d_c| |B|)] |A| with k =
    `rounding_depth` and γ_k = k u / (1 − k u) (Higham, section 3.1; the transform-domain form as
    in Barabasz et al.). It assumes no underflow or overflow: every intermediate in the format's
    normal range (a tile of values near 1e-22 in float32 falls outside it).

    Raises:
        ValueError: k·u >= 1 (γ_k undefined: too many channels for the format, e.g. bf16's u with
            a few hundred).
    """
    k = rounding_depth(w, d.shape[0])
    if k * u >= 1:
        raise ValueError(f"k u = {k} x {u:g} >= 1: the first-order bound does not apply (too many roundings)")
    at, gm, bt = (np.abs(t) for t in w.arrays(np.float64))
    ad, ag = np.abs(d.astype(np.float64)), np.abs(g.astype(np.float64))
    mag = np.einsum("ij,cjk,lk->cil", gm, ag, gm) * np.einsum("ij,cjk,lk->cil", bt, ad, bt)
    return k * u / (1 - k * u) * (at @ mag.sum(axis=0) @ at.T)


def exact_on_integers(w: Winograd) -> bool:
    """Whether every transform entry is a dyadic rational (an integer over a power of two): then
    float32 represents the transforms exactly, and small integer inputs stay exact through them
    (F(2, 3): entries 0, ±1, ±1/2). A denominator with another prime factor (F(4, 3): 1/6, 1/12,
    1/24) is rounded, and integer inputs are no longer exact."""
    def dyadic(v: Fraction) -> bool:
        q = v.denominator
        return q & (q - 1) == 0
    return all(dyadic(v) for t in (w.at, w.g, w.bt) for row in t for v in row)


# =====================================================================================================
# The GPU pipeline (kernels/conv2d/20_winograd.cu): constants, geometry, launches, refusals, models
# =====================================================================================================

CU_FILE = "20_winograd.cu"
REGISTERED_MS = (2, 4)  # winograd_f2, winograd_f4; F(6, 3) builds too (`make_winograd(6)`), as an error study
TRANSFORM_THREADS = 256  # the three transforms' blocks
TRANSFORM_BLOCKS_PER_SM = 8  # their grid-stride loops' grid: 8 blocks of 256 threads per SM, at most
SMS = 132  # the grid assumes an H100's / H200's SM count; any count is correct, only the pace changes
GEMM_THREADS = 256
GEMM_BK = 8  # the GEMM's reduction step: C is padded to a multiple of it (Cp)
ROW_VEC = 4  # floats per float4: the GEMM's Ng (Tp or Kp) is padded to a multiple of it
GEMM_TILES = ((128, 128), (128, 64), (64, 128), (64, 64))  # the instantiated BM x BN of wino_gemm
MIN_GEMM_BLOCKS = 2 * SMS  # the tile rule's target: two waves of one 128 x 128 block per SM
WORKSPACE_ALIGN = 256  # each of U, V, M starts this many bytes aligned
WORKSPACE_LIMIT = 8 * 2**30  # the most workspace a run may ask for (bytes): past it, refused with the size
MAX_GRID_Y = 65535
FLOAT_BYTES = 4


def float32_nearest(v: Fraction) -> np.float32:
    """The float32 nearest the exact ``v`` (ties to the even significand): what a transform constant
    is in the kernel. (``np.float32(float(v))`` rounds twice, through float64, and can miss it.)"""
    f = np.float32(float(v))
    cands = (f, np.nextafter(f, np.float32(-np.inf)), np.nextafter(f, np.float32(np.inf)))
    return min(cands, key=lambda c: (abs(Fraction(float(c)) - v), int(np.float32(c).view(np.uint32)) & 1))


def c_literal(v: Fraction) -> str:
    """``v`` as a C float literal that parses to `float32_nearest` (the shortest decimal that does)."""
    return np.format_float_positional(float32_nearest(v), unique=True, trim="0") + "f"


def constants_f32(w: Winograd) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Aᵀ, G, Bᵀ) as the kernels hold them: each entry the float32 nearest the exact fraction."""
    return tuple(np.array([[float32_nearest(v) for v in row] for row in t], dtype=np.float32)
                 for t in (w.at, w.g, w.bt))


def kernel_defines(m: int) -> dict[str, object]:
    """The ``-D`` defines of ``20_winograd.cu`` for F(m x m, 3 x 3), generated from `winograd`:
    ``WINO_M`` and the matrices ``WINO_AT`` (m x n), ``WINO_G`` (n x 3), ``WINO_BT`` (n x n), row
    by row, each entry ``WINO_E(<c_literal>)`` (no commas: nvcc splits a -D value at commas)."""
    w = winograd(m)
    out: dict[str, object] = {"WINO_M": m}
    for name, t in (("WINO_AT", w.at), ("WINO_G", w.g), ("WINO_BT", w.bt)):
        out[name] = "".join(f"WINO_E({c_literal(v)})" for row in t for v in row)
    return out


def parse_defines(defines: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Aᵀ, G, Bᵀ) read back from `kernel_defines` as the kernel's C++ reads them (float32)."""
    m = int(defines["WINO_M"])
    n = m + R - 1
    shapes = {"WINO_AT": (m, n), "WINO_G": (n, R), "WINO_BT": (n, n)}
    out = []
    for name, shape in shapes.items():
        vals = [np.float32(v.removesuffix("f")) for v in re.findall(r"WINO_E\(([^)]*)\)", defines[name])]
        out.append(np.array(vals, dtype=np.float32).reshape(shape))
    return tuple(out)


def round_up(a: int, b: int) -> int:
    return cdiv(a, b) * b


def aligned(nbytes: int) -> int:
    return round_up(nbytes, WORKSPACE_ALIGN)


@dataclass(frozen=True)
class Geometry:
    """The tiles and the workspace of F(m x m, 3 x 3) on a problem (see the kernel file's header).

    Tiles t = (n·tP + th)·tQ + tw over tP = ceil(P / m) x tQ = ceil(Q / m) per image, T = N·tP·tQ.
    Padded sizes: Cp = C up to a multiple of 8 (the GEMM's BK), Tp = T and Kp = K up to multiples
    of 4 (float4 rows). The workspace holds, in this order, each part `WORKSPACE_ALIGN`-aligned:
      NCHW: U[n²][K][Cp], V[n²][Cp][Tp], M[n²][K][Tp]; the GEMM (Mg, Ng, Kg) = (K, Tp, Cp), A = U, B = V;
      NHWC: U[n²][Cp][Kp], V[n²][T][Cp], M[n²][T][Kp]; the GEMM (Mg, Ng, Kg) = (T, Kp, Cp), A = V, B = U.
    """

    m: int
    N: int
    C: int
    H: int
    W: int
    K: int
    P: int
    Q: int
    pad_h: int
    pad_w: int
    layout: str

    @classmethod
    def of(cls, p: Conv2dProblem, m: int) -> Geometry:
        return cls(m, p.N, p.C, p.H, p.W, p.K, p.P, p.Q, *p.padding, p.layout)

    @property
    def n(self) -> int:
        return self.m + R - 1

    @property
    def positions(self) -> int:
        """n², the transform positions: the GEMM's batch."""
        return self.n**2

    @property
    def tP(self) -> int:  # noqa: N802 - the tile rows of the kernel's notation
        return cdiv(self.P, self.m)

    @property
    def tQ(self) -> int:  # noqa: N802
        return cdiv(self.Q, self.m)

    @property
    def T(self) -> int:  # noqa: N802
        return self.N * self.tP * self.tQ

    @property
    def Cp(self) -> int:  # noqa: N802
        return round_up(self.C, GEMM_BK)

    @property
    def Tp(self) -> int:  # noqa: N802
        return round_up(self.T, ROW_VEC)

    @property
    def Kp(self) -> int:  # noqa: N802
        return round_up(self.K, ROW_VEC)

    @property
    def nchw(self) -> bool:
        return self.layout == "NCHW"

    def shape(self, part: str) -> tuple[int, int, int]:
        """The shape of workspace part ``part`` ("U", "V" or "M"): [n²][rows][columns]."""
        rows_cols = {"NCHW": {"U": (self.K, self.Cp), "V": (self.Cp, self.Tp), "M": (self.K, self.Tp)},
                     "NHWC": {"U": (self.Cp, self.Kp), "V": (self.T, self.Cp), "M": (self.T, self.Kp)}}
        return (self.positions, *rows_cols[self.layout][part])

    def elements(self, part: str) -> int:
        return math.prod(self.shape(part))

    def offset(self, part: str) -> int:
        """Byte offset of ``part`` in the workspace: U at 0, V and M each after the previous, aligned."""
        off = 0
        for q in ("U", "V", "M"):
            if q == part:
                return off
            off += aligned(self.elements(q) * FLOAT_BYTES)
        raise ValueError(f"no workspace part {part!r}; the parts are U, V, M")

    @property
    def workspace_bytes(self) -> int:
        return self.offset("M") + self.elements("M") * FLOAT_BYTES

    @property
    def gemm(self) -> tuple[int, int, int]:
        """(Mg, Ng, Kg) of each of the n² GEMMs."""
        return (self.K, self.Tp, self.Cp) if self.nchw else (self.T, self.Kp, self.Cp)

    @property
    def gemm_operands(self) -> tuple[str, str]:
        """The workspace parts that are A and B: (U, V) for NCHW, (V, U) for NHWC."""
        return ("U", "V") if self.nchw else ("V", "U")


@dataclass(frozen=True)
class WinoConfig:
    """The plan's choice: the GEMM's block tile BM x BN (one of `GEMM_TILES`)."""

    bm: int
    bn: int

    def __post_init__(self):
        if (self.bm, self.bn) not in GEMM_TILES:
            raise ValueError(f"no wino_gemm entry for a {self.bm} x {self.bn} tile; instantiated: {GEMM_TILES}")

    @property
    def name(self) -> str:
        return f"{self.bm}x{self.bn}"


def gemm_tiles(g: Geometry, cfg: WinoConfig) -> tuple[int, int]:
    """(m-tiles, n-tiles) of one GEMM: ceil(Mg / BM), ceil(Ng / BN)."""
    mg, ng, _ = g.gemm
    return cdiv(mg, cfg.bm), cdiv(ng, cfg.bn)


def gemm_blocks(g: Geometry, cfg: WinoConfig) -> int:
    mt, nt = gemm_tiles(g, cfg)
    return mt * nt * g.positions


def default_tile(p: Conv2dProblem, m: int) -> WinoConfig:
    """The GEMM tile ``winograd_f<m>`` runs: 128 along the tiles (T) and along the filters (K)
    unless K <= 64 (then 64: a 128-filter tile would be half empty); the tiles' side halved to 64
    where that leaves fewer than `MIN_GEMM_BLOCKS` blocks (all n² GEMMs together), and the
    filters' too if still short. (Not measured yet: a first rule, for the GPU run to tune.)"""
    g = Geometry.of(p, m)
    kside = 64 if p.K <= 64 else 128
    for tside in (128, 64):
        for ks in ((kside,) if kside == 64 else (128, 64)):
            cfg = WinoConfig(ks, tside) if g.nchw else WinoConfig(tside, ks)
            if gemm_blocks(g, cfg) >= MIN_GEMM_BLOCKS:
                return cfg
    return WinoConfig(64, 64)


def transform_launch(elements: int) -> LaunchConfig:
    """A transform's grid-stride launch over ``elements``: 256-thread blocks, at most
    `TRANSFORM_BLOCKS_PER_SM` x `SMS` of them."""
    blocks = max(1, min(cdiv(elements, TRANSFORM_THREADS), TRANSFORM_BLOCKS_PER_SM * SMS))
    return LaunchConfig(grid=(blocks, 1, 1), block=(TRANSFORM_THREADS, 1, 1))


def gemm_launch(g: Geometry, cfg: WinoConfig) -> LaunchConfig:
    """``wino_gemm_<BM>x<BN>``: grid (filter tiles, tile tiles, n²), 256 threads: the filters' side
    (GEMM-M for NCHW, GEMM-N for NHWC) on x."""
    mt, nt = gemm_tiles(g, cfg)
    grid = (mt, nt, g.positions) if g.nchw else (nt, mt, g.positions)
    return LaunchConfig(grid=grid, block=(GEMM_THREADS, 1, 1))


def transform_elements(g: Geometry, step: str) -> int:
    """Elements of a transform's grid-stride loop: filter K·Cp (NCHW) or Cp·Kp (NHWC); input Cp·Tp
    or T·Cp; output K·T (either layout)."""
    if step == "filter":
        return g.K * g.Cp if g.nchw else g.Cp * g.Kp
    if step == "input":
        return g.Cp * g.Tp if g.nchw else g.T * g.Cp
    if step == "output":
        return g.K * g.T
    raise ValueError(f"no transform {step!r}; the transforms are filter, input, output")


def pipeline_launches(p: Conv2dProblem, m: int, cfg: WinoConfig) -> list[KernelLaunch]:
    """The four launches of a run, in order: ``filter`` (w -> U), ``input`` (x -> V), ``gemm``
    (U, V -> M, grid z over the n² positions), ``output`` (M -> y); see the kernel file's header
    for their arguments."""
    g = Geometry.of(p, m)
    lay = p.layout.lower()
    ws = {part: Buffer("workspace", g.offset(part)) for part in ("U", "V", "M")}
    i32 = np.int32
    filt = (i32(g.K), i32(g.C), i32(g.Cp)) + (() if g.nchw else (i32(g.Kp),))
    inp = (i32(g.N), i32(g.C), i32(g.H), i32(g.W), i32(g.pad_h), i32(g.pad_w), i32(g.tP), i32(g.tQ), i32(g.Cp))
    inp += (i32(g.Tp),) if g.nchw else ()
    mg, ng, kg = g.gemm
    a, b = g.gemm_operands
    out = (i32(g.N), i32(g.K), i32(g.P), i32(g.Q), i32(g.tP), i32(g.tQ), i32(g.Tp if g.nchw else g.Kp))
    return [
        KernelLaunch("filter", f"wino_filter_{lay}", transform_launch(transform_elements(g, "filter")),
                     (Buffer("w"), ws["U"], *filt)),
        KernelLaunch("input", f"wino_input_{lay}", transform_launch(transform_elements(g, "input")),
                     (Buffer("x"), ws["V"], *inp)),
        KernelLaunch("gemm", f"wino_gemm_{cfg.name}", gemm_launch(g, cfg),
                     (ws[a], ws[b], ws["M"], i32(mg), i32(ng), i32(kg), i32(int(g.nchw)))),
        KernelLaunch("output", f"wino_output_{lay}", transform_launch(transform_elements(g, "output")),
                     (ws["M"], Buffer("y"), *out)),
    ]


def shape_reason(p: Conv2dProblem) -> str | None:
    """What Winograd F(m x m, 3 x 3) computes: groups 1, stride 1, dilation 1, a 3 x 3 filter."""
    if p.groups != 1:
        return f"needs groups = 1; got {p.groups} (`general` or `depthwise` run grouped layers)"
    if p.stride != (1, 1):
        return f"needs stride 1 (a Winograd tile is m x m consecutive outputs); got {p.stride}"
    if p.dilation != (1, 1):
        return f"needs dilation 1; got {p.dilation}"
    if (p.R, p.S) != (R, R):
        return f"F(m x m, 3 x 3) needs a 3 x 3 filter; got {p.R} x {p.S}"
    return None


def sizes_int32_reason(g: Geometry) -> str | None:
    """The kernels' ``int`` sizes: T = N·tP·tQ (formed in int), Tp, Cp, Kp, and each transform's
    per-position index, decoded as int after one 64-bit division."""
    for name, v in (("T = N ceil(P/m) ceil(Q/m) (tiles)", g.T), ("Tp (T rounded up to 4)", g.Tp),
                    ("Cp (C rounded up to 8)", g.Cp), ("Kp (K rounded up to 4)", g.Kp),
                    ("tP * m + 2 (the last tile's input rows)", g.tP * g.m + R - 1 + g.pad_h),
                    ("tQ * m + 2 (the last tile's input columns)", g.tQ * g.m + R - 1 + g.pad_w)):
        if v > INT32_MAX:
            return f"{name} = {v} does not fit the kernels' int32 (at most {INT32_MAX})"
    return None


def gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def workspace_reason(g: Geometry, limit: int = WORKSPACE_LIMIT) -> str | None:
    """None if the workspace fits ``limit`` bytes, else how much it needs, part by part."""
    need = g.workspace_bytes
    if need <= limit:
        return None
    parts = ", ".join(f"{q} {gib(g.elements(q) * FLOAT_BYTES)}" for q in ("U", "V", "M"))
    return (f"needs {need} bytes ({gib(need)}) of workspace ({parts}: n² = {g.positions} transform positions of "
            f"T = {g.T} tiles x Cp = {g.Cp} channels and K = {g.K} filters); the limit is {gib(limit)}")


def grid_reason(g: Geometry, cfg: WinoConfig) -> str | None:
    """The GEMM's grid y (the tiles' side) is at most 65,535 blocks."""
    ny = gemm_launch(g, cfg).grid[1]
    if ny <= MAX_GRID_Y:
        return None
    return (f"the GEMM needs {ny} blocks along the T = {g.T} tiles (grid y); the limit is {MAX_GRID_Y} "
            f"(at most {MAX_GRID_Y * (cfg.bn if g.nchw else cfg.bm)} tiles with a {cfg.name} block tile)")


def winograd_reason(p: Conv2dProblem, m: int, cfg: WinoConfig) -> str | None:
    """None if ``winograd_f<m>`` runs ``p`` with ``cfg``, else why not: `shape_reason`, the kernels'
    int32 sizes (`sizes_int32_reason`), the workspace over `WORKSPACE_LIMIT` (`workspace_reason`), the
    GEMM's grid (`grid_reason`). All before any launch."""
    reason = shape_reason(p)
    if reason:
        return reason
    g = Geometry.of(p, m)
    return sizes_int32_reason(g) or workspace_reason(g) or grid_reason(g, cfg)


# ---- models of what each launch writes ----------------------------------------------------------


def grid_stride_indices(total: int, cfg: LaunchConfig) -> np.ndarray:
    """The elements a 1-D grid-stride loop visits, with repeats: thread t of G·B takes t, t + G·B,
    ... below ``total`` (``GRID_STRIDE_LOOP``)."""
    threads = cfg.blocks * cfg.threads_per_block
    t = np.arange(min(threads, total), dtype=np.int64)
    steps = np.arange(cdiv(total, threads), dtype=np.int64)
    items = (t[:, None] + steps[None, :] * threads).ravel()
    return items[items < total]


def transform_writes(p: Conv2dProblem, m: int, step: str, cfg: LaunchConfig | None = None) -> np.ndarray:
    """Writes per element of the workspace part a transform fills (U for ``filter``, V for
    ``input``; flat, `Geometry.shape`) by its grid-stride loop on ``cfg`` (default its launch):
    element i of the loop writes index pos·plane + i for each of the n² positions."""
    g = Geometry.of(p, m)
    part = {"filter": "U", "input": "V"}[step]
    plane = transform_elements(g, step)
    cfg = cfg or transform_launch(plane)
    per_elem = np.bincount(grid_stride_indices(plane, cfg), minlength=plane)
    return np.tile(per_elem, g.positions)[: g.elements(part)]


def gemm_writes_model(p: Conv2dProblem, m: int, cfg: WinoConfig, launch: LaunchConfig | None = None) -> np.ndarray:
    """Writes per element of M (flat, [n²][Mg][Ng]) by ``wino_gemm`` on ``launch`` (default
    `gemm_launch`): block (x, y, z) computes tile (x, y) (NCHW: m-tile x) or (y, x) (NHWC) of GEMM
    z < n² and stores its rows below Mg and columns below Ng (`days.kit.gemm_writes`)."""
    g = Geometry.of(p, m)
    launch = launch or gemm_launch(g, cfg)
    mg, ng, _ = g.gemm
    mt, nt = gemm_tiles(g, cfg)
    gx, gy, gz = launch.grid
    visits = tile_visits((gx, gy, 1), mt, nt) if g.nchw else tile_visits((gy, gx, 1), mt, nt)
    one = gemm_writes(mg, ng, cfg.bm, cfg.bn, visits)
    return np.concatenate([one if z < gz else np.zeros_like(one) for z in range(g.positions)])


def output_writes(p: Conv2dProblem, m: int, cfg: LaunchConfig | None = None) -> np.ndarray:
    """Writes per element of y (flat, the problem's layout) by ``wino_output_<layout>`` on ``cfg``
    (default its launch): loop element i is (k, t) = (i / T, i % T) (NCHW) or (t, k) = (i / K,
    i % K) (NHWC); it writes the pixels (th·m + a, tw·m + b), a, b < m, inside P x Q of image n."""
    g = Geometry.of(p, m)
    total = transform_elements(g, "output")
    cfg = cfg or transform_launch(total)
    i = grid_stride_indices(total, cfg)
    k, t = (i // g.T, i % g.T) if g.nchw else (i % g.K, i // g.K)
    n, rem = t // (g.tP * g.tQ), t % (g.tP * g.tQ)
    th, tw = rem // g.tQ, rem % g.tQ
    counts = np.zeros(p.y_numel, dtype=np.int64)
    for a in range(m):
        for b in range(m):
            pp, qq = th * m + a, tw * m + b
            ok = (pp < g.P) & (qq < g.Q)
            if g.nchw:
                flat = ((n * g.K + k) * g.P + pp) * g.Q + qq
            else:
                flat = ((n * g.P + pp) * g.Q + qq) * g.K + k
            np.add.at(counts, flat[ok], 1)
    return counts


def gemm_blocks_model(a: np.ndarray, b: np.ndarray, cfg: WinoConfig, launch: LaunchConfig, m_on_x: bool
                      ) -> tuple[np.ndarray, np.ndarray]:
    """One GEMM position as ``wino_gemm``'s blocks compute it, thread by thread (a Python kernel:
    the loaders, the two shared stages, the rank-1 updates, the epilogue's stores), on A (Mg x Kg)
    and B (Kg x Ng) in their dtype. Returns (M, how often each element of M was stored).

    Block (bx, by) takes tile (m0, n0) = (bx·BM, by·BN) if ``m_on_x`` else (by·BM, bx·BN). At step
    s: thread tid < 2·BM loads A[m0 + tid/2][8s + 4(tid%2) .. +3] (zeros past Mg) into
    sa[4(tid%2) + j][tid/2]; thread tid < 2·BN loads B[8s + tid/(BN/4)][n0 + 4(tid%(BN/4)) .. +3]
    (zeros past Ng) into sb[tid/(BN/4)][4(tid%(BN/4)) + j]; then every thread (tm, tn) = (tid/16,
    tid%16) adds sa[kk][4tm + 64g + i]·sb[kk][4tn + 64h + j], kk = 0..7, to its accumulators and,
    after the last step, stores rows below Mg, columns below Ng."""
    (mg, kg), ng = a.shape, b.shape[1]
    bm, bn = cfg.bm, cfg.bn
    out = np.full((mg, ng), np.nan, dtype=a.dtype)
    stores = np.zeros((mg, ng), dtype=np.int64)
    tid = np.arange(GEMM_THREADS)
    tm, tn = tid // 16, tid % 16
    rows = (4 * tm[:, None] + 64 * (np.arange(bm // 16)[None, :] // 4) + np.arange(bm // 16)[None, :] % 4)
    cols = (4 * tn[:, None] + 64 * (np.arange(bn // 16)[None, :] // 4) + np.arange(bn // 16)[None, :] % 4)
    gx, gy, _ = launch.grid
    for bx in range(gx):
        for by in range(gy):
            m0, n0 = (bx * bm, by * bn) if m_on_x else (by * bm, bx * bn)
            acc = np.zeros((bm, bn), dtype=a.dtype)
            for s in range(kg // GEMM_BK):
                sa = np.zeros((GEMM_BK, bm), dtype=a.dtype)
                sb = np.zeros((GEMM_BK, bn), dtype=a.dtype)
                for t in range(2 * bm):
                    am, ka = t // 2, 4 * (t % 2)
                    if m0 + am < mg:
                        sa[ka:ka + 4, am] = a[m0 + am, GEMM_BK * s + ka:GEMM_BK * s + ka + 4]
                for t in range(2 * bn):
                    kb, nb = t // (bn // 4), 4 * (t % (bn // 4))
                    if n0 + nb < ng:
                        sb[kb, nb:nb + 4] = b[GEMM_BK * s + kb, n0 + nb:n0 + nb + 4]
                for kk in range(GEMM_BK):
                    acc += np.outer(sa[kk], sb[kk])
            for t in tid:
                r, c = m0 + rows[t], n0 + cols[t]
                ok = (r[:, None] < mg) & (c[None, :] < ng)
                rr, cc = np.broadcast_to(r[:, None], ok.shape)[ok], np.broadcast_to(c[None, :], ok.shape)[ok]
                out[rr, cc] = acc[rows[t][:, None], cols[t][None, :]][ok]
                np.add.at(stores, (rr, cc), 1)
    return out, stores


def workspace_writes(p: Conv2dProblem, m: int, cfg: WinoConfig, launches: list[KernelLaunch] | None = None
                     ) -> np.ndarray:
    """Writes per float of the whole workspace by one run (``launches``, default the plan's, by
    name: filter -> U, input -> V, gemm -> M, each at its `Geometry.offset`); the alignment gaps
    between the parts stay at 0.

    Raises:
        ValueError: a launch writing past its part (a model that disagrees with `Geometry`)."""
    g = Geometry.of(p, m)
    launches = {k.name: k for k in (launches or pipeline_launches(p, m, cfg))}
    counts = np.zeros(cdiv(g.workspace_bytes, FLOAT_BYTES), dtype=np.int64)
    for name, part, writes in (("filter", "U", lambda c: transform_writes(p, m, "filter", c)),
                               ("input", "V", lambda c: transform_writes(p, m, "input", c)),
                               ("gemm", "M", lambda c: gemm_writes_model(p, m, cfg, c))):
        w = writes(launches[name].config)
        start = g.offset(part) // FLOAT_BYTES
        if w.size != g.elements(part):
            raise ValueError(f"the {name} model writes {w.size} elements; {part} has {g.elements(part)}")
        counts[start:start + w.size] += w
    return counts


# ---- the whole pipeline on the CPU, by the kernels' index arithmetic ---------------------------


def mul_left(t: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``mul_left``: out[..., i, j] = Σ_l t[i][l]·x[..., l, j], l ascending, zero entries skipped,
    each product and sum rounded to x's dtype (the kernel fuses them: one rounding fewer)."""
    rows = []
    for i in range(t.shape[0]):
        acc = np.zeros(x.shape[:-2] + x.shape[-1:], dtype=x.dtype)
        for ll in range(t.shape[1]):
            if t[i, ll] != 0:
                acc = acc + t[i, ll] * x[..., ll, :]
        rows.append(acc)
    return np.stack(rows, axis=-2)


def mul_right_t(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``mul_right_t``: out[..., i, j] = Σ_l x[..., i, l]·t[j][l], l ascending, zero entries skipped."""
    return np.swapaxes(mul_left(t, np.swapaxes(x, -1, -2)), -1, -2)


def simulate(p: Conv2dProblem, x: np.ndarray, w: np.ndarray, m: int, dtype=np.float64,
             cfg: WinoConfig | None = None, drop_position: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The four kernels of a run on the CPU, thread by thread (vectorised), with the kernels' index
    arithmetic, on a NaN-filled workspace: returns (y in the problem's layout, the workspace as
    floats). An element a kernel reads before any kernel wrote it is NaN and spreads to y.

    Args:
        p: the problem (fprop, the layout of x, w and y).
        x, w: numpy arrays in the problem's layout.
        dtype: float64 (the index arithmetic, against torch to 1e-12) or float32 (the kernels'
            rounding, within `error_bound`: products and sums rounded apart).
        cfg: the GEMM tile (default `default_tile`); it only decides which blocks write M.
        drop_position: a planted fault: the GEMM of this transform position stores zeros (the
            position dropped from the sum).
    """
    g = Geometry.of(p, m)
    cfg = cfg or default_tile(p, m)
    at, gm, bt = constants_f32(winograd(m)) if dtype == np.float32 else winograd(m).arrays(np.float64)
    ws = np.full(cdiv(g.workspace_bytes, FLOAT_BYTES), np.nan, dtype=dtype)
    xf, wf = np.ascontiguousarray(x, dtype=dtype).ravel(), np.ascontiguousarray(w, dtype=dtype).ravel()
    n, pos = g.n, g.positions

    def store(part: str, i: np.ndarray, tiles: np.ndarray) -> None:  # tiles [len(i)][n][n] -> part[pos][i]
        plane = g.elements(part) // pos
        base = g.offset(part) // FLOAT_BYTES
        for xi in range(n):
            for nu in range(n):
                ws[base + (xi * n + nu) * plane + i] = tiles[:, xi, nu]

    def gather(src: np.ndarray, idx: np.ndarray, ok: np.ndarray) -> np.ndarray:
        return np.where(ok, src[np.where(ok, idx, 0)], dtype(0))

    # filter: U = G g Gᵀ
    i = np.arange(transform_elements(g, "filter"), dtype=np.int64)
    k, c = (i // g.Cp, i % g.Cp) if g.nchw else (i % g.Kp, i // g.Kp)
    ok = (c < g.C) & (k < g.K)
    gt = np.stack([np.stack([gather(wf, ((k * g.C + c) * R + r) * R + s if g.nchw else ((k * R + r) * R + s) * g.C + c,
                                    ok) for s in range(R)], -1) for r in range(R)], -2)
    store("U", i, mul_right_t(mul_left(gm, gt), gm))

    # input: V = Bᵀ d B
    i = np.arange(transform_elements(g, "input"), dtype=np.int64)
    c, t = (i // g.Tp, i % g.Tp) if g.nchw else (i % g.Cp, i // g.Cp)
    ok = (c < g.C) & (t < g.T)
    nn, rem = t // (g.tP * g.tQ), t % (g.tP * g.tQ)
    h0, w0 = (rem // g.tQ) * m - g.pad_h, (rem % g.tQ) * m - g.pad_w
    d = np.empty((i.size, n, n), dtype=dtype)
    for a in range(n):
        for b in range(n):
            h, ww = h0 + a, w0 + b
            inside = ok & (h >= 0) & (h < g.H) & (ww >= 0) & (ww < g.W)
            idx = ((nn * g.C + c) * g.H + h) * g.W + ww if g.nchw else ((nn * g.H + h) * g.W + ww) * g.C + c
            d[:, a, b] = gather(xf, idx, inside)
    store("V", i, mul_right_t(mul_left(bt, d), bt))

    # gemm: M[z] = A[z] . B[z], the blocks' tiles (rows < Mg, columns < Ng), z < grid z
    mg, ng, kg = g.gemm
    pa, pb = g.gemm_operands
    written = gemm_writes_model(p, m, cfg).reshape(pos, mg, ng) > 0
    for z in range(pos):
        am = ws[g.offset(pa) // FLOAT_BYTES + z * mg * kg:][: mg * kg].reshape(mg, kg)
        bm = ws[g.offset(pb) // FLOAT_BYTES + z * kg * ng:][: kg * ng].reshape(kg, ng)
        cm = ws[g.offset("M") // FLOAT_BYTES + z * mg * ng:][: mg * ng].reshape(mg, ng)
        prod = np.zeros((mg, ng), dtype=dtype) if z == drop_position else (am @ bm).astype(dtype)
        cm[written[z]] = prod[written[z]]

    # output: y = Aᵀ M A, the pixels inside P x Q
    i = np.arange(transform_elements(g, "output"), dtype=np.int64)
    k, t = (i // g.T, i % g.T) if g.nchw else (i % g.K, i // g.K)
    plane = g.elements("M") // pos
    base = g.offset("M") // FLOAT_BYTES
    mt = np.empty((i.size, n, n), dtype=dtype)
    for xi in range(n):
        for nu in range(n):
            mt[:, xi, nu] = ws[base + (xi * n + nu) * plane + (k * g.Tp + t if g.nchw else t * g.Kp + k)]
    yt = mul_right_t(mul_left(at, mt), at)
    y = np.full(p.y_numel, np.nan, dtype=dtype)
    nn, rem = t // (g.tP * g.tQ), t % (g.tP * g.tQ)
    th, tw = rem // g.tQ, rem % g.tQ
    for a in range(m):
        for b in range(m):
            pp, qq = th * m + a, tw * m + b
            ok = (pp < g.P) & (qq < g.Q)
            flat = ((nn * g.K + k) * g.P + pp) * g.Q + qq if g.nchw else ((nn * g.P + pp) * g.Q + qq) * g.K + k
            y[flat[ok]] = yt[ok, a, b]
    return y.reshape(p.y_shape), ws


# ---- the rounding bound of a run, for the harness's check ---------------------------------------


def transform_magnitudes(w: Winograd) -> np.ndarray:
    """T[i][a][l] = Σ_j |Aᵀ[i][j]|·|G[j][a]|·|Bᵀ[j][l]| (m x r x n): how much input l of a tile's
    row and filter tap a weigh in output i's rounding bound, in one dimension; the 2-D bound of
    `error_bound` is Σ_c Σ T[i][a][l]·T[j][b][l']·|g_c[a][b]|·|d_c[l][l']| for output (i, j)."""
    at, gm, bt = (np.abs(t) for t in w.arrays(np.float64))
    return np.einsum("ij,ja,jl->ial", at, gm, bt)


def winograd_scale(p: Conv2dProblem, x4: torch.Tensor, w4: torch.Tensor, n0: int, n1: int, r0: int, r1: int,
                   m: int) -> torch.Tensor:
    """`error_bound`'s magnitude term without γ_k, for every output of images n0..n1, rows r0..r1
    (float64, NCHW, on x4's device): for output (p, q) at offset (i, j) = (p mod m, q mod m) in its
    tile, Σ_c Σ_{a,b,l,l'} T[i][a][l] T[j][b][l'] |w[k][c][a][b]| |x[c][th·m − pad_h + l][tw·m − pad_w + l']|
    (`transform_magnitudes`; zeros outside the image): m² float64 convolutions of |x| with n x n
    filters, stride m. It covers input pixels the direct sum never reads (the tile's other rows)."""
    w = winograd(m)
    n, mag = w.n, torch.from_numpy(transform_magnitudes(w)).to(x4.device)
    (ph, pw), th0, th1 = p.padding, r0 // m, cdiv(r1, m)
    tq = cdiv(p.Q, m)
    h_lo, rows = th0 * m - ph, (th1 - th0 - 1) * m + n
    lo, hi = max(h_lo, 0), min(h_lo + rows, p.H)
    xs = x4[n0:n1, :, lo:max(lo, hi)].to(torch.float64).abs()
    cols = (tq - 1) * m + n
    xs = F.pad(xs, (pw, cols - pw - p.W, lo - h_lo, rows - (lo - h_lo) - xs.shape[2]))
    wa = w4.to(torch.float64).abs()
    out = torch.empty((n1 - n0, p.K, (th1 - th0) * m, tq * m), dtype=torch.float64, device=x4.device)
    for i in range(m):
        for j in range(m):
            e = torch.einsum("al,kcab,bq->kclq", mag[i], wa, mag[j])
            out[:, :, i::m, j::m] = F.conv2d(xs, e, stride=m)
    return out[:, :, r0 - th0 * m:r1 - th0 * m, : p.Q]


def integer_peak(w: Winograd, channels: int, max_x: int, max_w: int) -> tuple[Fraction, int]:
    """(the largest magnitude any intermediate of a tile reaches with integer inputs |x| <= max_x,
    |w| <= max_w over ``channels`` channels, the common denominator D of every intermediate): the
    run is exact in float32 when the transforms are dyadic (`exact_on_integers`) and peak·D <= 2^24.
    Each stage is bounded by the largest row sums of |Aᵀ|, |G|, |Bᵀ|; D is the product of the
    squared denominators of the three transforms."""
    def row_sum(t):
        return max(sum(abs(v) for v in row) for row in t)

    def den(t):
        return math.lcm(*(v.denominator for row in t for v in row))

    sa, sg, sb = row_sum(w.at), row_sum(w.g), row_sum(w.bt)
    u, v = sg**2 * max_w, sb**2 * max_x
    mm = channels * u * v
    peak = max(u, v, mm, sa * mm, sa**2 * mm)
    return peak, (den(w.at) * den(w.g) * den(w.bt)) ** 2


def integers_exact(p: Conv2dProblem, m: int) -> bool:
    """Whether ``p``'s integer inputs (`Conv2dProblem.int_ranges`) give the exact result through
    F(m, 3) in float32: dyadic transforms (F(2, 3) yes, F(4, 3) no) and no intermediate past 2^24
    units of its denominator (`integer_peak`)."""
    w = winograd(m)
    if not exact_on_integers(w):
        return False
    peak, den = integer_peak(w, p.C, *p.int_ranges)
    return peak * den <= 2**24


def winograd_model(m: int) -> ErrorModel:
    """The harness's bound for ``winograd_f<m>`` (`helpers.reference.ErrorModel`): `error_bound`
    over the whole output, γ_k·`winograd_scale`, k = `rounding_depth` with C channels, u of the
    accumulator; a floor of one float32 underflow per rounding that reaches an output (n² positions
    times the k roundings of each); exact on integers where `integers_exact` says."""
    w = winograd(m)

    def coefficient(p: Conv2dProblem, accum: str) -> float:
        k, u = rounding_depth(w, p.C), UNIT_ROUNDOFF[accum]
        return k * u / (1 - k * u) if k * u < 1 else math.inf

    def floor(p: Conv2dProblem, accum: str) -> float:
        return w.n**2 * rounding_depth(w, p.C) * UNDERFLOW[accum] + UNDERFLOW[p.dtype]

    return ErrorModel(name=f"Winograd F({m}x{m}, 3x3)", coefficient=coefficient,
                      scale=lambda p, x4, w4, *band: winograd_scale(p, x4, w4, *band, m=m), floor=floor,
                      exact_on_integers=lambda p: integers_exact(p, m))


# ---- the variants -------------------------------------------------------------------------------


def make_winograd(m: int, name: str | None = None, tile: WinoConfig | None = None) -> Variant:
    """The day-20 variant for F(m x m, 3 x 3) (not registered): ``winograd_f<m>``, the GEMM tile by
    `default_tile`, or ``tile`` forced for every problem.

    Raises:
        ValueError: an m outside 1..9 (`points_for`).
    """
    kernel_defines(m)  # the transforms exist (raises for an m without enough points)
    name = name or f"winograd_f{m}"

    def config_fn(p: Conv2dProblem) -> WinoConfig:
        return tile or default_tile(p, m)

    return Variant(
        name=name,
        day=20,
        cu_file=CU_FILE,
        summary=f"Winograd F({m}x{m}, 3x3), fp32 on CUDA cores: filter and input transforms, {(m + 2) ** 2} batched "
        "SGEMMs, output transform (four launches, a workspace)" + (f" ({tile.name} GEMM tile)" if tile else ""),
        config_fn=config_fn,
        supports_fn=lambda p, cfg: winograd_reason(p, m, cfg),
        launches_fn=lambda p, epilogue, cfg: pipeline_launches(p, m, cfg),
        covers_fn=lambda p, launch, cfg: output_writes(p, m, launch),
        workspace_fn=lambda p, cfg: Geometry.of(p, m).workspace_bytes,
        defines=kernel_defines(m),
        layouts=("NCHW", "NHWC"),
        dtypes=("fp32",),
        accum="fp32",
        error_model=winograd_model(m),
        configs_fn=None if tile else lambda: [make_winograd(m, f"{name}[{bm}x{bn}]", WinoConfig(bm, bn))
                                              for bm, bn in GEMM_TILES],
    )


WINOGRAD = {m: register(make_winograd(m)) for m in REGISTERED_MS}
