"""Fused epilogues as values: D = act(alpha · op(a, b) + beta · Cin + bias).

The operands of a fused epilogue (CUTLASS's ``LinearCombination`` / ``LinearCombinationRelu``):
``cin`` has the output's shape, layout and dtype (a residual, or the output itself for an
in-place update); ``bias`` has K elements (one per output channel). A variant that fuses them
lists them in `helpers.variants.Variant.operands`; `helpers.launch.prepare` takes them by name
(``prepare(v, p, x, w, cin=..., bias=..., epilogue=Epilogue(...))``) and checks them with
`helpers.launch.check_operands` before any launch; `helpers.reference.reference_epilogue` is
the float64 result and `helpers.check.check_epilogue` judges a fused launch against it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .problem import Conv2dProblem


@dataclass(frozen=True)
class Epilogue:
    """D = act(alpha · conv(x, w) + beta · Cin + bias), act = ReLU if ``relu`` else identity.

    The defaults (alpha = 1, beta = 0, no ReLU) give the plain operation; `is_plain` says so.
    """

    alpha: float = 1.0
    beta: float = 0.0
    relu: bool = False

    def __post_init__(self) -> None:
        for nm in ("alpha", "beta"):
            v = getattr(self, nm)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise TypeError(f"Epilogue {nm} must be a real number; got {v!r}")
        if not isinstance(self.relu, (bool, np.bool_)):
            raise TypeError(f"Epilogue relu must be True or False; got {self.relu!r}")

    @property
    def is_plain(self) -> bool:
        return self.alpha == 1.0 and self.beta == 0.0 and not self.relu


PLAIN = Epilogue()
OPERANDS = ("cin", "bias")  # the epilogue operands, in the order kernels take them


def operand_shape(problem: Conv2dProblem, name: str) -> tuple[int, ...]:
    """``cin``: the output's shape (`Conv2dProblem.output_shape`); ``bias``: one value per output
    channel, (K,) for fprop and (C,) for dgrad (wgrad's output, a filter gradient, takes none).

    Raises:
        ValueError: a name that is not an epilogue operand.
    """
    if name == "cin":
        return problem.output_shape
    if name == "bias":
        if problem.op == "wgrad":
            raise ValueError("a wgrad output (the filter gradient dw) takes no bias")
        return (problem.K,) if problem.op == "fprop" else (problem.C,)
    raise ValueError(f"{name!r} is not an epilogue operand; known: {', '.join(OPERANDS)}")


def check_scalars(epilogue: Epilogue) -> None:
    """Alpha and beta go to the kernel as float32: raise unless both are finite there and a
    nonzero one does not round to 0 (the kernel would skip Cin).

    Raises:
        ValueError: alpha or beta that float32 cannot carry.
    """
    if epilogue.is_plain:  # 1 and 0 (most calls: no float32 round trip)
        return
    for nm, v in (("alpha", epilogue.alpha), ("beta", epilogue.beta)):
        with np.errstate(over="ignore"):  # an overflow is what this checks
            f = float(np.float32(v))
        if not np.isfinite(f) or (v != 0 and f == 0):
            raise ValueError(f"epilogue {nm} = {v!r} is {f} in float32: pass a finite value the kernel can represent")


def scalars(epilogue: Epilogue) -> dict:
    """The epilogue as kernel scalars by name: alpha, beta (np.float32), relu (np.int32).

    Raises:
        ValueError: see `check_scalars`.
    """
    check_scalars(epilogue)
    return {"alpha": np.float32(epilogue.alpha), "beta": np.float32(epilogue.beta), "relu": np.int32(epilogue.relu)}
