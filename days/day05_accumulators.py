"""Day 05: day 04 (b)'s kernel with three accumulators (``kernels/conv2d/05_accumulators.cu``):
``acc_float`` (fp32, the same code as ``shared_halo_strided``), ``acc_double`` (products and sum
in fp64, rounded to fp32 once) and ``acc_kahan`` (a compensated fp32 sum). Same launch as
`days.day04_shared_halo.halo_strided_launch` and the same claim and 32-bit limits
(`days.day04_shared_halo.halo_strided_supports`); ``ACCUM_MODE`` picks the accumulator.
"""

from __future__ import annotations

from helpers.variants import Variant, register

from .day03_shared import TILE, one_thread_per_output_covers
from .day04_shared_halo import halo_strided_launch, halo_strided_supports
from .kit import NCHW_SIZES, single_kernel

ACCUMULATORS = (
    ("acc_float", "ACCUM_FLOAT", "fp32", "fp32 sum (the same code as shared_halo_strided)"),
    ("acc_double", "ACCUM_DOUBLE", "fp64", "products and sum in fp64, rounded to fp32 once"),
    ("acc_kahan", "ACCUM_KAHAN", "fp32", "compensated (Kahan) fp32 sum"),
)

for _name, _mode, _accum, _what in ACCUMULATORS:
    register(
        Variant(
            name=_name,
            day=5,
            cu_file="05_accumulators.cu",
            summary=f"shared_halo_strided with a {_what}",
            supports_fn=halo_strided_supports,
            launches_fn=single_kernel("conv2d_accumulators", halo_strided_launch, f"x w y {NCHW_SIZES}"),
            covers_fn=one_thread_per_output_covers,
            defines={"TILE": TILE, "ACCUM_MODE": _mode},
            # Kahan's error (about 2u per term plus O(n u^2)) is within the fp32 bound gamma_n.
            accum=_accum,
        )
    )
