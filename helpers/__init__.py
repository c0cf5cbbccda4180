"""conv2d-days harness core: compile, launch, check and time hand-written conv2d kernels.

The core knows no day: the variants live in the ``days`` package, which `variants.get` imports
on first use. Importing ``helpers`` never imports pycuda (it cannot load without the NVIDIA
driver); the GPU is touched only by `gpu.init`, `variants.run`/`prepare`, `check.check` and
`bench.bench`.

    from helpers import Conv2dProblem, run, check, bench, suite
"""

from .bench import bench, geomean_x_cudnn
from .check import check, reference
from .epilogue import Epilogue, check_epilogue
from .gpu import NoGPUError, device_info, has_gpu, versions
from .problem import Conv2dProblem
from .suites import suite
from .variants import UnsupportedProblem, all_variants, get, prepare, run

__all__ = [
    "Conv2dProblem", "Epilogue", "NoGPUError", "UnsupportedProblem", "all_variants", "bench", "check",
    "check_epilogue", "device_info", "geomean_x_cudnn", "get", "has_gpu", "prepare", "reference", "run",
    "suite", "versions",
]
