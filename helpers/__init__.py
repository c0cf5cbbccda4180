"""conv2d-days harness core: compile, launch, check and time hand-written conv2d kernels.

The core knows no day: the variants live in the ``days`` package, which `variants.get` imports
on first use. Importing ``helpers`` never imports pycuda (it cannot load without the NVIDIA
driver); the GPU is touched only by `gpu.init`, `launch.run`/`prepare`, `check.check` and
`bench.bench`.

    from helpers import Conv2dProblem, run, check, bench, suite
"""

from .bench import bench, geomean_x_cudnn
from .check import check, check_epilogue
from .epilogue import Epilogue
from .gpu import NoGPUError, device_info, has_gpu, versions
from .launch import prepare, run
from .problem import Conv2dProblem
from .reference import reference
from .suites import suite
from .variants import UnsupportedProblem, all_variants, get

__all__ = [
    "Conv2dProblem", "Epilogue", "NoGPUError", "UnsupportedProblem", "all_variants", "bench", "check",
    "check_epilogue", "device_info", "geomean_x_cudnn", "get", "has_gpu", "prepare", "reference", "run",
    "suite", "versions",
]
