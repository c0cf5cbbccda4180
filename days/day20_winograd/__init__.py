"""Day 20: Winograd's minimal filtering F(m x m, 3 x 3) on CUDA cores, fp32, NCHW and NHWC.

* `pipeline` — the transforms built exactly from interpolation points, their float32 constants
  and rounding bound (`winograd_model`), and the variants ``winograd_f2`` and ``winograd_f4``
  (``kernels/conv2d/20_winograd.cu``): four launches over a workspace (filter and input
  transforms, n² batched GEMMs, output transform), with their write models and `simulate`;
* `space` — the tuner's spaces (day 15) of ``winograd_f2`` and ``winograd_f4``: their GEMM tile.

Every public name of `pipeline` is re-exported here (``days.day20_winograd.simulate``, ...).
Day 21 (`days.day21_winograd_fused`) fuses the pipeline into one kernel, ``winograd_f2_fused`` and
``winograd_f4_fused`` (``kernels/conv2d/21_winograd_fused.cu``), on these transforms: both kernel
files share their code, ``kernels/conv2d/winograd_transforms.cuh``.
"""

from . import pipeline, space  # noqa: F401 - the modules, by name (space registers the tuner's spaces)
from .pipeline import *  # noqa: F403 - the package's names are its module's public names
