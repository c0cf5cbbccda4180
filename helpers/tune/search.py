"""One problem's search (steps 1-5 of `helpers.tune`'s docstring), `tune` over a suite, and
`tuned`, the variant that runs the cached choices.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from .. import gpu
from ..check import check
from ..compile import build_many, is_built
from ..launch import prepare
from ..problem import Conv2dProblem
from ..reference import compare, expected, judge
from ..timing import time_gpu
from ..variants import Plan, Variant, get
from .cache import CACHED, TuneCache, _warn
from .probe import machine_for
from .space import KEEP, Candidate, Space, prune, space_of

QUICK_REPS = 3  # first repetitions of each survivor
CLOSE_REPS = 10  # more repetitions for those within LOSER of the best
LOSER = 1.15  # a median this many times the best so far ends a candidate's timing
FINAL_TARGET_MS = 50.0  # the winner's final timing: repetitions for about this much GPU time


@dataclass
class Trial:
    """One candidate's measurements in a search: medians (ms) of its timing rounds; none once an
    output failed the check against the float64 reference (``status`` "disagreed: <reason>",
    also for a winner that fails `helpers.check.check`) or it faulted (``status`` "error: ...")."""

    candidate: Candidate
    plan: Plan  # the candidate's variant's plan for the problem: built once, timed every round
    ms: list[float] = field(default_factory=list)
    status: str = "timed"

    @property
    def best_ms(self) -> float:
        return min(self.ms) if self.ms else math.inf

    def fail(self, status: str) -> None:
        """Drop the candidate: no time, ``status`` says why."""
        self.ms, self.status = [], status

    def run(self, inputs: tuple, ref: Reference, reps: int | None, target_ms: float = 0.0) -> float | None:
        """One timing round (``reps`` repetitions, or about ``target_ms`` of them) whose output,
        poisoned with NaN first (`_time_ms`), is checked against ``ref``: its median (ms), also
        kept in ``ms``, or None when the output fails or the candidate faults (a build that
        failed, a launch error), which drops it (`fail`): the search goes on without it."""
        if self.status != "timed":
            return None
        try:
            ms, out = _time_ms(self.plan, inputs, reps, target_ms)
        except Exception as e:  # noqa: BLE001 - one candidate's fault drops it, not the search
            self.fail(f"error: {type(e).__name__}: {' '.join(str(e).split())[:200]}")
            return None
        reason = ref.reason(self.plan.variant, out)
        if reason is not None:
            self.fail(f"disagreed: {reason}")
            return None
        self.ms.append(ms)
        return ms


def _time_ms(plan: Plan, inputs: tuple, reps: int | None, target_ms: float = 0.0):
    prepared, out = prepare(plan, *inputs)  # built once per plan: a candidate is timed up to three times
    out.fill_(float("nan"))  # an element the candidate never writes stays NaN (the block may hold an old output)
    kw = {"reps": reps} if reps else {"target_ms": target_ms}
    return time_gpu(prepared, warmup=1, **kw).ms_p50, out


def _inputs(p: Conv2dProblem) -> tuple:
    """The inputs every candidate of a search runs on (seeded normal values, on the GPU)."""
    return p.make_inputs(device="cuda", kind="normal", seed=1)


@dataclass
class Reference:
    """What every candidate's output of one search is checked against: the problem, its inputs
    and, when the output is small enough, its float64 reference and scale made once
    (`helpers.reference.expected`; else `helpers.reference.compare` works band by band per output)."""

    problem: Conv2dProblem
    inputs: tuple
    expected: tuple | None = None

    @classmethod
    def of(cls, p: Conv2dProblem, inputs: tuple) -> Reference:
        return cls(p, inputs, expected(p, *inputs))

    def reason(self, variant: Variant, out: torch.Tensor) -> str | None:
        """None if ``out`` passes `helpers.reference.judge` (NaN/Inf, the element bound, the relative L2
        limit) for ``variant``'s accumulator, else the verdict's reason."""
        r = compare(self.problem, *self.inputs, out, accum=variant.accum, expected=self.expected)
        v = judge(variant=variant.name, problem=self.problem, kind="normal", accum=variant.accum,
                  nonfinite=r["nonfinite"], max_abs_err=r["max_abs_err"],
                  worst_err_over_bound=r["worst_err_over_bound"], rel_l2=r["rel_l2"], exact=None,
                  repeat_bitwise=True)
        return None if v.ok else v.reason


@dataclass
class Search:
    """One problem's search before any timing: the candidates the GPU supports, the survivors of
    `prune`, the model's rank of each candidate (1 = fastest predicted) and the seconds spent."""

    problem: Conv2dProblem
    candidates: list[Candidate]
    survivors: list[Candidate]
    rank: dict
    enumerate_s: float
    plans: dict = field(default_factory=dict, repr=False)  # {config: the candidate variant's Plan}

    def plan(self, c: Candidate) -> Plan:
        """``c``'s plan for the problem, made once per search (a variation's on first use)."""
        if c.config not in self.plans:
            self.plans[c.config] = c.variant.plan(self.problem)
        return self.plans[c.config]

    def trial(self, c: Candidate) -> Trial:
        return Trial(c, self.plan(c))

    def jobs(self, exhaustive: bool = False) -> list[tuple[str, dict]]:
        """The (kernel file, defines) builds the search needs: the survivors', or every candidate's."""
        cs = self.candidates if exhaustive else self.survivors
        return [(k.source(c.variant), k.build_defines(c.variant)) for c in cs for k in self.plan(c).launches]


def enumerate_search(space: Space, p: Conv2dProblem, keep: int = KEEP) -> Search:
    """Steps 1 and 2: the space's candidates for ``p`` that this GPU supports, ranked by the model
    on this GPU's measured machine (`helpers.tune.probe.machine_for`: cached, or measured on first
    use), and the survivors.

    Raises:
        ValueError: no candidate supports ``p`` on this GPU.
    """
    t0 = time.perf_counter()
    info = gpu.device_info()
    plans = {c.config: (c, c.variant.plan(p)) for c in space.candidates(p, machine_for(info))}
    plans = {cfg: (c, plan) for cfg, (c, plan) in plans.items()
             if plan.refusal(smem_limit=info.smem_per_block_optin, cc=info.cc) is None}
    if not plans:
        raise ValueError(f"no configuration of {space.variant} supports {p.name} on this GPU")
    cands = [c for c, _ in plans.values()]
    rank = {c.config: i + 1 for i, c in enumerate(sorted(cands, key=lambda c: c.model_us))}
    return Search(p, cands, prune(cands, keep), rank, time.perf_counter() - t0,
                  {cfg: plan for cfg, (_, plan) in plans.items()})


def _best(trials: dict, what: str) -> Trial:
    """The fastest trial that is still timed (the first of equals: the prior comes first).

    Raises:
        RuntimeError: none is (every one failed the check or faulted; the message says how)."""
    live = [t for t in trials.values() if t.ms]
    if not live:
        why = "; ".join(f"{cfg}: {t.status}" for cfg, t in trials.items())
        raise RuntimeError(f"no configuration of {what} passed the check: {why}"[:600])
    return min(live, key=lambda t: t.best_ms)


def check_winner(plan: Plan) -> str | None:
    """The harness's full verdict on a winner before it is cached: `helpers.check.check` of its
    plan (normal and, where exact, integer inputs: the integer run sees a dropped term that a long
    bf16 reduction's rounding bound cannot). None if it passes, else the reason."""
    r = check(plan)
    return None if r.ok else r.reason


def _final(trials: dict, inputs: tuple, ref: Reference, what: str) -> tuple[Trial, float]:
    """The fastest trial re-timed properly (`FINAL_TARGET_MS`) and passed by `check_winner`, with
    its final median; one that fails either is dropped and the next fastest tried."""
    while True:
        t = _best(trials, what)
        ms = t.run(inputs, ref, None, FINAL_TARGET_MS)
        if ms is None:
            continue
        reason = check_winner(t.plan)
        if reason is None:
            return t, ms
        t.fail(f"disagreed: {reason}")


def measure(space: Space, search: Search, cache: TuneCache | None = None) -> dict:
    """Steps 4 and 5 on a search whose builds are done: time the survivors (early stop on losers;
    every output checked against the float64 reference: a candidate that fails it or faults is
    dropped, `Trial.run`), try the winner's variations, re-time the winner and pass it through
    `check_winner` (else the next fastest); store it in ``cache``. Returns the row `tune_problem`
    describes, without ``compile_s`` and with ``tune_s`` the seconds of enumeration and timing;
    ``status`` is "ok", or says that the rule's own pick (the prior) failed the check (then
    ``rule_ms`` is NaN): the registered variant computes this problem wrongly.

    Raises:
        RuntimeError: no survivor passed the check."""
    t0 = time.perf_counter()
    p = search.problem
    base = get(space.variant)
    inputs = _inputs(p)
    ref = Reference.of(p, inputs)
    what = f"{space.variant} on {p.name}"
    prior = next((c for c in search.survivors if c.prior), search.survivors[0])
    order = [prior, *(c for c in search.survivors if c is not prior)]  # the prior first: it wins ties
    trials = {c.config: search.trial(c) for c in order}
    for t in trials.values():
        t.run(inputs, ref, QUICK_REPS)
    best = _best(trials, what).best_ms
    close = [t for t in trials.values() if t.ms and t.best_ms <= LOSER * best]
    for t in close:  # early stop: the clear losers get no more repetitions
        t.run(inputs, ref, CLOSE_REPS)
    build_of = {cfg: cfg for cfg in trials}
    leader = _best(trials, what)
    for cfg in space.variations(leader.candidate.config, p):  # runtime-only changes of the leader: no build
        if cfg not in trials:
            trials[cfg] = search.trial(Candidate(cfg, space.variant_for(cfg, p), leader.candidate.model_us))
            trials[cfg].run(inputs, ref, CLOSE_REPS)
            build_of[cfg] = leader.candidate.config
    winner, final_ms = _final(trials, inputs, ref, what)
    rule = trials[prior.config]
    if winner is rule:
        rule_ms = final_ms
    else:
        rule_ms = rule.run(inputs, ref, None, FINAL_TARGET_MS) if rule.ms else None
    status = "ok" if rule_ms is not None else f"rule failed the check: {prior.config}: {rule.status}"[:300]
    row = {
        "problem": p.name,
        "variant": space.variant,
        "config": winner.candidate.config,
        "ms": final_ms,
        "search_ms": winner.best_ms,
        "rule_config": prior.config,
        "rule_ms": math.nan if rule_ms is None else rule_ms,
        "model_rank": search.rank[build_of[winner.candidate.config]],
        "candidates": len(search.candidates),
        "survivors": len(search.survivors),
        "timed": len(close),
        "disagreed": sum(t.status.startswith("disagreed") for t in trials.values()),
        "faulted": sum(t.status.startswith("error") for t in trials.values()),
        "cache": "miss",
        "tune_s": search.enumerate_s + time.perf_counter() - t0,
        "status": status,
    }
    if cache is not None:
        entry = {k: row[k] for k in CACHED} | {"tune_s": row["tune_s"], "date": time.strftime("%Y-%m-%d")}
        cache.store(base, p, entry, checked=True)
    return row


def sweep(space: Space, search: Search, reps: int = QUICK_REPS) -> dict:
    """The exhaustive answer, to judge the tuner by: every candidate and each of its variations
    timed (``reps`` repetitions; outputs checked as in `measure`), then the fastest re-timed and
    checked as the tuner's winner is. Returns ``best_config``, ``best_ms``, ``exhaustive_s``,
    ``sweep`` ({config: (model_us, ms)}, NaN for a disagreeing or faulting one; a variation
    carries its candidate's prediction) and ``sweep_variations`` (the configurations timed only
    as a candidate's variation: not the model's picks).

    Raises:
        RuntimeError: no configuration passed the check."""
    t0 = time.perf_counter()
    p = search.problem
    inputs = _inputs(p)
    ref = Reference.of(p, inputs)
    trials, varied = {}, set()
    for c in search.candidates:
        for cfg in [c.config, *space.variations(c.config, p)]:
            if cfg != c.config:
                varied.add(cfg)
            trials[cfg] = search.trial(c if cfg == c.config else Candidate(cfg, space.variant_for(cfg, p), c.model_us))
            trials[cfg].run(inputs, ref, reps)
    times = {cfg: (t.candidate.model_us, t.best_ms if t.ms else math.nan) for cfg, t in trials.items()}
    best, best_ms = _final(trials, inputs, ref, f"{space.variant} on {p.name}")
    return {"best_config": best.candidate.config, "best_ms": best_ms, "exhaustive_s": time.perf_counter() - t0,
            "sweep": times, "sweep_variations": frozenset(varied - {c.config for c in search.candidates})}


def _hit_row(space: Space, p: Conv2dProblem, cache: TuneCache | None, timed: bool = True) -> dict | None:
    """A warm cache's row for ``p``, or None. A timed search takes only timed answers: a model
    pick (`pick`, ``"timed": False`` in its entry) is searched again and replaced."""
    t0 = time.perf_counter()
    hit = cache.lookup(get(space.variant), p) if cache is not None else None
    if hit is None or (timed and hit.get("timed", True) is False):
        return None
    return {"problem": p.name, "variant": space.variant, **{k: hit[k] for k in CACHED}, "cache": "hit",
            "compile_s": 0.0, "tune_s": time.perf_counter() - t0, "status": "ok"}


def pick(space: Space, p: Conv2dProblem, cache: TuneCache | None = None) -> dict:
    """The model's first choice for ``p``, with no build and no timing of a candidate
    (``--no-time``): the candidate of least predicted time among those this GPU supports
    (`enumerate_search`, on the measured machine: the probe runs once if this environment has no
    record, `helpers.tune.probe.machine_for`). Stored in ``cache`` as not timed (``ms`` and ``rule_ms`` NaN, ``"timed":
    False``) and not checked: `tuned` checks it against the float64 reference the first time it
    runs (else the rule's runs), and a timed search replaces it. Returns the row `tune_problem`
    describes, with ``config``, ``rule_config``, ``model_rank`` 1, ``candidates``, ``tune_s``
    and ``status`` "ok" (no times); a warm cache answers as in `tune_problem`.

    Raises:
        ValueError: no candidate of the space supports ``p`` on this GPU.
    """
    hit = _hit_row(space, p, cache, timed=False)
    if hit is not None:
        return hit
    t0 = time.perf_counter()
    s = enumerate_search(space, p, keep=1)
    first = s.survivors[0]
    prior = next((c for c in s.candidates if c.prior), first)
    entry = {"config": first.config, "ms": math.nan, "rule_config": prior.config, "rule_ms": math.nan,
             "model_rank": 1, "timed": False}
    if cache is not None:
        cache.store(get(space.variant), p, {**entry, "date": time.strftime("%Y-%m-%d")})
    return {"problem": p.name, "variant": space.variant, **{k: entry[k] for k in CACHED},
            "candidates": len(s.candidates), "cache": "miss", "compile_s": 0.0,
            "tune_s": time.perf_counter() - t0, "status": "ok"}


def tune_problem(space: Space, p: Conv2dProblem, cache: TuneCache | None = None, keep: int = KEEP,
                 exhaustive: bool = False) -> dict:
    """Tune ``space``'s variant on ``p`` (steps 1-5 of the module docstring) and return its row:

    ``problem``, ``variant``, ``config`` (the winner), ``ms`` (its final median), ``search_ms``
    (its best short median in the search), ``rule_config``, ``rule_ms`` (the prior's final
    median, timed as the winner's), ``model_rank`` (the place of the winner's
    build in the model's order, 1 = first), ``candidates`` / ``survivors`` / ``timed``
    (configurations enumerated, kept by the model, given more than the first repetitions),
    ``disagreed`` (outputs that failed the float64 check), ``compile_s``, ``tune_s`` (wall seconds
    of the whole search, builds included), ``cache`` ("hit" or "miss"), ``status`` (`measure`'s;
    "ok" on a hit). With ``exhaustive``, after the
    search (or the cache's answer) every candidate is built and `sweep` adds ``best_config``,
    ``best_ms``, ``exhaustive_s`` (builds included) and ``sweep`` (not a CSV column).

    A warm cache answers at once (``cache`` "hit", no timing; ``tune_s`` is the lookup's time).

    Raises:
        ValueError: no candidate of the space supports ``p`` on this GPU.
    """
    hit = _hit_row(space, p, cache)
    if hit is not None and not exhaustive:
        return hit
    search = enumerate_search(space, p, keep)
    arch = get(space.variant).target(gpu.device_info().cc)
    row = hit
    if row is None:
        compile_s = build_many(search.jobs(), arch, entry_line=space.merge)
        row = measure(space, search, cache)
        row = {**row, "compile_s": compile_s, "tune_s": row["tune_s"] + compile_s}
    if exhaustive:
        build_s = build_many(search.jobs(exhaustive=True), arch, entry_line=space.merge)
        found = sweep(space, search)
        row = {**row, **found, "exhaustive_s": found["exhaustive_s"] + build_s}
    return row


def tune(variant: str | Variant, problems: list[Conv2dProblem], cache: TuneCache | None = None, keep: int = KEEP,
         exhaustive: bool = False, budget_s: float | None = None, progress: bool = True,
         timed: bool = True) -> pd.DataFrame:
    """Tune ``variant`` on every problem (each in the variant's own dtype, layout and operation,
    `Variant.adapt`): one row per problem as `tune_problem` gives it, plus ``status``. With
    ``timed`` False, the model's pick per problem (`pick`): nothing is built or timed.

    Raises:
        ValueError: ``exhaustive`` without ``timed`` (the sweep is timing).

    The searches are enumerated first and every build they need is compiled in one parallel
    `helpers.compile.build_many`; each problem's ``compile_s`` is its share of that wall time (the
    builds it was first to need), so ``tune_s`` sums to the run's wall time. A problem the variant
    refuses gets a row with status ``"unsupported: <reason>"``; one that faults, a row with its
    ``status``; the run goes on; once ``budget_s`` seconds have passed the
    remaining problems are not timed (``status`` "over budget"). With ``exhaustive``, after all of
    that, every candidate of every problem is built and swept (`sweep`; the cache's answers too).
    """
    space = space_of(variant)
    base = get(space.variant)
    if not timed:
        if exhaustive:
            raise ValueError("the exhaustive sweep times every candidate: it cannot run untimed")
        rows = []
        for p in (base.adapt(p, op=True) for p in problems):
            if (row := _unsupported_row(space, base, p)) is not None:
                rows.append(row)
                continue
            try:
                rows.append(pick(space, p, cache))
            except Exception as e:  # noqa: BLE001 - one problem's fault is its row; the run goes on
                rows.append(_fault_row(space, p, e))
        return pd.DataFrame(rows)
    arch = base.target(gpu.device_info().cc)
    t0 = time.perf_counter()
    rows: dict[int, dict] = {}
    searches: dict[int, Search] = {}
    problems = [base.adapt(p, op=True) for p in problems]  # an fprop suite's shapes as this variant's op
    for i, p in enumerate(problems):
        if (row := _unsupported_row(space, base, p)) is not None:
            rows[i] = row
            continue
        try:
            hit = _hit_row(space, p, cache)
            if hit is not None:
                rows[i] = hit
            if hit is None or exhaustive:
                searches[i] = enumerate_search(space, p, keep)
        except Exception as e:  # noqa: BLE001 - one problem's fault is its row; the run goes on
            rows[i] = _fault_row(space, p, e)
    jobs, first = _new_jobs({i: s for i, s in searches.items() if i not in rows}, arch)
    compile_s = build_many(jobs, arch, entry_line=space.merge) if jobs else 0.0
    for i, s in tqdm(searches.items(), disable=not progress, desc=f"tune {space.variant}"):
        if i in rows:
            continue
        share = compile_s * first.get(i, 0) / max(len(jobs), 1)
        if budget_s is not None and time.perf_counter() - t0 > budget_s:
            rows[i] = {"problem": s.problem.name, "variant": space.variant, "status": "over budget"}
            continue
        try:
            row = measure(space, s, cache)
            rows[i] = {**row, "compile_s": share, "tune_s": row["tune_s"] + share}
        except Exception as e:  # noqa: BLE001
            rows[i] = _fault_row(space, s.problem, e)
    if exhaustive:  # after the tuner has answered every problem: its times are its own
        todo = {i: s for i, s in searches.items() if rows[i]["status"] == "ok"}
        jobs, first = _new_jobs(todo, arch, exhaustive=True)
        build_s = build_many(jobs, arch, entry_line=space.merge) if jobs else 0.0
        for i, s in tqdm(todo.items(), disable=not progress, desc=f"sweep {space.variant}"):
            try:
                found = sweep(space, s)
                share = build_s * first.get(i, 0) / max(len(jobs), 1)
                rows[i].update(found, exhaustive_s=found["exhaustive_s"] + share)
            except Exception as e:  # noqa: BLE001
                rows[i]["status"] = f"sweep {_fault_row(space, s.problem, e)['status']}"
    return pd.DataFrame([rows[i] for i in sorted(rows)])


def _new_jobs(searches: dict, arch: str, exhaustive: bool = False) -> tuple[list, dict]:
    """The distinct builds of ``searches`` ({index: Search}) not yet built, and per index how many
    of them it was the first to need (its share of the parallel build's wall time)."""
    seen, jobs, first = set(), [], {}
    for i, s in searches.items():
        for cu_file, defines in s.jobs(exhaustive):
            key = (cu_file, tuple(sorted(defines.items())))
            if key not in seen and not is_built(cu_file, defines, arch):
                seen.add(key)
                jobs.append((cu_file, defines))
                first[i] = first.get(i, 0) + 1
    return jobs, first


def _unsupported_row(space: Space, base: Variant, p: Conv2dProblem) -> dict | None:
    """A row with status ``"unsupported: <reason>"`` for a problem the variant's shape rules
    refuse (day 20's 1 x 1 and strided layers of an fprop suite), else None: not a fault."""
    reason = base.plan(p).reason
    return None if reason is None else {"problem": p.name, "variant": space.variant, "status": f"unsupported: {reason}"}


def _fault_row(space: Space, p: Conv2dProblem, e: Exception) -> dict:
    if isinstance(e, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()
    return {
        "problem": p.name,
        "variant": space.variant,
        "status": f"error: {type(e).__name__}: {' '.join(str(e).split())[:300]}",
    }


def tuned(variant: str | Variant, cache: TuneCache | None = None) -> Variant:
    """A variant (``<name>_tuned``, not registered): the registered variant with a ``config_fn``
    that answers, per problem, with the configuration ``cache`` holds for it, and with the
    variant's own rule where it holds none.

    A cached choice is trusted once it has passed `helpers.check.check` on the problem, run by
    the variant's ``review_fn`` when `helpers.launch.prepare` first runs the (problem, choice)
    with a GPU present, after the tensor checks (planning it, `supports` included, launches
    nothing). A choice that fails the check, that the space cannot build (an unknown
    configuration name) or that the variant refuses is replaced by the rule's, with one
    `TuneCacheWarning` naming the cache file; a check that raises (e.g. out of memory) is not
    remembered: that call runs the rule's and the next call checks again. A choice this process's
    tuner stored is not checked again (`TuneCache.checked`: `measure` passed it through
    `check_winner` before storing it)."""
    space = space_of(variant)
    base = get(space.variant)
    cache = cache or TuneCache()
    verdicts: dict = {}  # (problem, configuration name) -> the configuration that runs it, once decided

    def hit(p: Conv2dProblem):
        """(the cached choice's name, its plan) or (None, None); a choice that cannot run ``p`` is
        decided here (the rule's, one warning)."""
        entry = cache.lookup(base, p)
        if not entry:
            return None, None
        name = entry["config"]
        if (p, name) in verdicts:
            return name, None
        plan, reason = _cached_plan(space, p, name)
        if reason is not None:
            verdicts[p, name] = _refuse(base, p, name, reason, cache.path, base.config_fn(p))
        elif cache.checked(base, p, name):  # this process's own tuner checked it before caching it
            verdicts[p, name] = plan.config
        return name, plan

    def config_fn(p: Conv2dProblem):
        name, plan = hit(p)
        if name is None:
            return base.config_fn(p)
        return verdicts[p, name] if (p, name) in verdicts else plan.config  # not checked yet: review_fn does

    def review_fn(p: Conv2dProblem, config):
        name, plan = hit(p)
        if name is None or (p, name) in verdicts or not gpu.has_gpu() or config != plan.config:
            return verdicts.get((p, name), config)
        if gpu.capturing():  # a check synchronises: the rule's runs, a later call checks
            return base.config_fn(p)
        try:
            r = check(plan)
        except Exception as e:  # noqa: BLE001 - not the choice's verdict: the rule runs, the next call retries
            _warn(f"tune cache {cache.path}: checking the choice {name!r} of {base.name} for {p.name} "
                  f"raised {type(e).__name__}: {e}; the rule's runs for this call")
            return base.config_fn(p)
        verdicts[p, name] = plan.config if r.ok else _refuse(base, p, name, f"failed the check ({r.reason})",
                                                             cache.path, base.config_fn(p))
        return verdicts[p, name]

    return dataclasses.replace(base, name=f"{base.name}_tuned", summary=f"{base.summary} (tuned per problem: "
                               f"{cache.path})", config_fn=config_fn, review_fn=review_fn)


def _cached_plan(space: Space, p: Conv2dProblem, config: str) -> tuple[Plan | None, str | None]:
    """(the plan of a cached ``config`` for ``p``, None), or (None, why it cannot run ``p``: the
    space cannot build the name, or the variant refuses the problem's shape)."""
    try:
        plan = space.variant_for(config, p).plan(p)
        reason = plan.refusal(smem_limit=2**31)
    except Exception as e:  # noqa: BLE001 - a cache entry must never break a run: the rule runs instead
        return None, f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    return (plan, None) if reason is None else (None, reason)


def _refuse(base: Variant, p: Conv2dProblem, config: str, reason: str, path: Path, rule):
    """``rule`` (the rule's configuration), after one warning that names the cache file and why
    ``config`` is not used."""
    _warn(f"tune cache {path}: the choice {config!r} of {base.name} for {p.name} is not used ({reason}); "
          "the rule's runs instead")
    return rule
