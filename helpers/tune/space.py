"""Search spaces: what a tunable variant's day module registers (`register_space`): the
candidates for a problem (each a configuration name, the variant that runs it and the cost
model's predicted time), the variations of a winner that need no new build, and how to rebuild a
candidate from its name; `prune` keeps what is worth timing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..problem import Conv2dProblem
from ..variants import Variant, get
from .machine import Machine

KEEP = 8  # candidates timed per problem after pruning (plus the prior)


@dataclass(frozen=True)
class Candidate:
    """One configuration of a search: ``config`` names it (`Space.variant_for` rebuilds the
    variant from it), ``variant`` runs it, ``model_us`` is the model's predicted time (µs),
    ``prior`` marks the fitted rule's own pick, ``family`` groups candidates the model ranks
    among themselves better than across (day 13: one block-tile shape BM x BN x BK)."""

    config: str
    variant: Variant
    model_us: float
    prior: bool = False
    family: str = ""


@dataclass(frozen=True)
class Space:
    """A tunable variant's search space (see the module docstring).

    ``candidates(problem, machine)``: every configuration worth building for the problem, each a
    `Candidate`, exactly one with ``prior=True`` (the rule's pick) where the rule supports it;
    ``variations(config, problem)``: configurations that differ from ``config`` only in runtime
    arguments (tried on the winner; may be empty); ``variant_for(config, problem)``: the variant
    of a configuration name; ``sources``: kernel files its variants build from besides the
    variant's own ``cu_file`` (e.g. another day's main loop), whose edits must miss the tuner's
    cache too (`helpers.tune.TuneCache.key`); ``merge``: None, or ``(cu_file, defines) -> line or None``,
    the source line that instantiates a build's entry point in another build of the same file, so
    that a search's builds share nvcc runs (`helpers.compile.merge_jobs`).
    """

    variant: str
    candidates: Callable[[Conv2dProblem, Machine], list[Candidate]]
    variations: Callable[[str, Conv2dProblem], list[str]]
    variant_for: Callable[[str, Conv2dProblem], Variant]
    summary: str = ""
    sources: tuple[str, ...] = ()
    merge: Callable[[str, dict], str | None] | None = None


SPACES: dict[str, Space] = {}


def register_space(space: Space) -> Space:
    """Make ``space.variant`` tunable (day modules call this when imported)."""
    if space.variant in SPACES:
        raise ValueError(f"a search space for {space.variant!r} is registered twice")
    SPACES[space.variant] = space
    return space


def space_of(variant: str | Variant) -> Space:
    """The search space of a registered variant.

    Raises:
        KeyError: the variant has none (the message lists the tunable ones).
    """
    name = variant.name if isinstance(variant, Variant) else variant
    get(name)  # imports the days package, whose modules register the spaces
    if name not in SPACES:
        raise KeyError(f"{name} has no search space; tunable: {', '.join(sorted(SPACES)) or 'none'}")
    return SPACES[name]


def prune(candidates: list[Candidate], keep: int = KEEP) -> list[Candidate]:
    """The ``keep`` candidates the model ranks best (lowest ``model_us``; ties keep their order),
    then the model's best of every ``family`` not yet among them, then the prior; in model order.
    The model's first choice is always the first survivor.

    Why families: measured against day 13's exhaustive sweep on ResNet-50 (day 15), the model
    orders the tiles of one block shape well but misjudges one shape against another (it favours
    8-warp and 256-wide tiles), so each shape's favourite is worth a short timing.

    Raises:
        ValueError: ``keep`` < 1."""
    if keep < 1:
        raise ValueError(f"keep = {keep}: at least 1 candidate must be timed")
    ranked = sorted(candidates, key=lambda c: c.model_us)
    out = ranked[:keep]
    families = {c.family for c in out}
    for c in ranked[len(out) :]:
        if c.family not in families or c.prior:
            out.append(c)
            families.add(c.family)
    return sorted(out, key=lambda c: c.model_us)
