"""Day 14: the backward pass — ``dgrad`` and ``wgrad`` on tensor cores.

* `model` — the mappings simulated in Python: dgrad's filter phases (`dgrad_phases`,
  `dgrad_by_phases`, `dgrad_mac_counts`) and wgrad's split-K (`split_k_slices`, `wgrad_split_k`);
* `dgrad` — the ``dgrad`` variant (``14_dgrad.cu``): day 13's kernel run once per filter phase
  over dy, reading w in place (the optimized iterator; the others after a kernel that writes the
  phase filters), and one zero-fill launch for the dx pixels no tap reaches (where a stride
  leaves some);
* `train` — the kernels in a model: `conv2d` (a `torch.autograd.Function`: fprop on day 13's
  kernel, dx and dw on day 14's) and a ResNet bottleneck block trained against torch's;
* `wgrad` — the ``wgrad`` (parallel split-K) and ``wgrad_serial`` (serial split-K) variants
  (``14_wgrad.cu``): an implicit GEMM over N·P·Q whose fragments come from ``ldmatrix.trans``;
* `space` — day 15's search spaces: ``wgrad`` (its tiles x split factors) and ``dgrad`` (its tiles
  x swizzles).

Sources: NVIDIA CUTLASS, ``docs/implicit_gemm_convolution.md`` (dgrad and wgrad as implicit
GEMMs; the strided dgrad iterators) and ``docs/efficient_gemm.md`` (parallelized reductions:
split-K, serial and parallel); the PTX ISA (``ldmatrix`` with ``.trans``, ``ld.acquire`` /
``st.release``); T. Granlund and P. Montgomery, "Division by invariant integers using
multiplication" (PLDI 1994), for ``FastDiv``.
"""

from . import dgrad, model, space, train, wgrad  # space: registers day 15's search space for wgrad
from .dgrad import (
    DGRAD,
    PhaseLaunch,
    choose_config,
    dgrad_iterator,
    dgrad_plan,
    make_dgrad,
    phase_conv,
    phase_gemm_problem,
)
from .model import (
    AxisPhase,
    axis_phases,
    dgrad_by_phases,
    dgrad_mac_counts,
    dgrad_phases,
    split_k_slices,
    wgrad_split_k,
)
from .wgrad import (
    WGRAD,
    WGRAD_SERIAL,
    WgradConfig,
    WgradTile,
    choose_splits,
    choose_wgrad,
    fast_div,
    fast_div_apply,
    make_wgrad,
)

__all__ = [
    "DGRAD", "WGRAD", "WGRAD_SERIAL", "AxisPhase", "PhaseLaunch", "WgradConfig", "WgradTile", "axis_phases",
    "choose_config", "choose_splits", "choose_wgrad", "dgrad", "dgrad_by_phases", "dgrad_iterator",
    "dgrad_mac_counts", "dgrad_phases", "dgrad_plan", "fast_div", "fast_div_apply", "make_dgrad", "make_wgrad", "model",
    "phase_conv", "phase_gemm_problem", "space", "split_k_slices", "train", "wgrad", "wgrad_split_k",
]
