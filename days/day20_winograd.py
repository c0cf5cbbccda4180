"""Day 20's transforms: Winograd's minimal filtering F(m x m, r x r), built exactly from interpolation
points, applied in float64 and float32 on the CPU, and the rounding bound that includes the
transforms' constants. (The GPU kernels come in their own steps; this module is what they are
checked against.)

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

from dataclasses import dataclass
from fractions import Fraction
from functools import cache

import numpy as np
import sympy

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
