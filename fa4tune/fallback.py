"""Which dispatch entry runs a problem class that has none of its own: the fallback rule.

A dispatch table has entries for the classes a study tuned; users run others (fp16 as well as bf16, GQA 5, 7 or 8,
a chunked prefill of a GQA ratio no study saw). Such a class runs the entry of its nearest tuned class, under one
rule, here, that `fa4tune.api` (the call path), `search run` / `search apply` (which entry a study must beat) and
the static check (what it compiles) all use:

1. Its own entry.
2. Else the entry of a neighbour: a class with the same head dims (q/k and v), the same mask (causal or not, a sliding
   window or not, a softcap or not: each compiles another kernel) and the same regime, a chunked class counting prefill classes as neighbours too (its rows are a causal prefill's).
   Neighbours are tried nearest first, by these keys, in order:
   a. the same regime before a chunked class's prefill neighbour (a chunked problem's short query over a long key
      runs best on the tiles measured on chunked problems: the chunked entries are not the prefill ones);
   a'. for a paged class (a paged KV cache, issue 71), the classes of other page sizes and the contiguous one count
      too, after those of its own page size, the nearest page size first (a contiguous cache as the largest pages):
      a KV tile's gather changes with the page size, the tiles a decode wants less so;
   b. the distance between GQA ratios, |g - g'| (the packed query rows a tile holds change with the ratio);
   c. the same dtype before the other (fp16 <-> bf16 run the same kernels, tiles and registers);
   d. the larger GQA ratio on a tie of (b).
   A neighbour's config is taken only where it is feasible for this class (`feasible`: the static rules and the
   kernel class's can_implement for the class's shortest problem, as for any entry); an infeasible one is passed over.
3. Else upstream's default, where it is feasible for the class.
4. Else ours for head dims whose upstream tiles do not fit SM120's shared memory (fa4tune.defaults.wide_forward /
   wide_backward: head dims past 128), where that is feasible.
5. Else no config runs the class: the resolution says which rule refused each candidate, with the bytes
   (`refusal`); the call path raises it as one error (a forward at once, a backward when a gradient is asked for).
An "fp8" class (opt-in FP8, fa4tune.config) is a world apart: its neighbours are fp8 classes only, no bf16 / fp16
class has an fp8 one, and in place of steps 3 and 4 it runs the FP8 forward's default (fa4tune.defaults.fp8_forward);
it has no backward. A paged class's neighbours' entries run it only where their kernel class runs pages (the static
rules' kernel_paged); in place of steps 3 and 4 it runs ours for paged KV (fa4tune.defaults.paged_forward); no
backward. A contiguous class never takes a paged class's entry.

Like every entry, what a fallback runs passes the correctness gate of whatever run measures it (prepare.py gates
each problem with the config dispatch gives it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, Iterable, Mapping, Sequence, TypeVar

from fa4tune.config import FP8, ConfigError, ProblemClass

C = TypeVar("C")
DEFAULT_NAMES = {"upstream": "upstream's default", "wide": "ours for wide heads", "fp8": "the FP8 default",
                 "paged": "ours for paged KV"}  # steps 3 and 4, in messages


@dataclass(frozen=True)
class Resolution(Generic[C]):
    """What dispatch runs for a class: `config` (None: upstream's default, or nothing when rule is "none"), the entry
    it came from (`source`, a class name; None for a default), and why (`rule`: own / fallback / upstream / wide /
    none; for none, `refusal` says why each candidate was refused)."""

    problem_class: ProblemClass
    config: C | None
    source: str | None
    rule: str
    refusal: str = ""

    @property
    def is_fallback(self) -> bool:
        return self.rule == "fallback"

    def describe(self) -> str:
        """One line, e.g. "d128-causal-gqa6-bf16 runs d128-causal-gqa8-bf16's entry (nearest GQA ratio 8)"."""
        if self.rule == "own":
            return f"{self.problem_class.name} runs its own entry"
        if self.rule == "upstream":
            return f"{self.problem_class.name} runs upstream's default (no feasible entry of its own or of a neighbour)"
        if self.rule == "fp8":
            return f"{self.problem_class.name} runs the FP8 default (no fp8 entry of its own or of a neighbour)"
        if self.rule == "paged":
            return f"{self.problem_class.name} runs ours for paged KV (no entry of its own or of a neighbour runs pages)"
        if self.rule == "wide":
            return f"{self.problem_class.name} runs ours for wide heads ({self.refusal})"
        if self.rule == "none":
            return f"no config runs {self.problem_class.name}: {self.refusal}"
        return f"{self.problem_class.name} runs {self.source}'s entry ({why(self.problem_class, ProblemClass.parse(self.source))})"


def why(pc: ProblemClass, neighbour: ProblemClass) -> str:
    """What differs between a class and the neighbour whose entry it runs, in words."""
    parts = []
    if neighbour.qhead_per_kvhead != pc.qhead_per_kvhead:
        parts.append(f"nearest GQA ratio {neighbour.qhead_per_kvhead}")
    if neighbour.regime != pc.regime:
        parts.append(f"{neighbour.regime} class")
    if neighbour.dtype != pc.dtype:
        parts.append(f"{neighbour.dtype} for {pc.dtype}")
    if neighbour.page_size != pc.page_size:
        parts.append(f"page size {neighbour.page_size or 'contiguous'} for {pc.page_size}")
    return ", ".join(parts)


def neighbours(pc: ProblemClass, names: Iterable[str]) -> list[ProblemClass]:
    """The classes among `names` (table keys) whose entries may run `pc`, nearest first (rule 2); `pc` itself and
    names that are not class names are left out."""
    regimes = ("chunked", "prefill") if pc.regime == "chunked" else (pc.regime,)
    found = []
    for name in names:
        try:
            other = ProblemClass.parse(name)
        except ConfigError:
            continue
        if (other != pc and other.regime in regimes and (other.head_dim, other.head_dim_v, other.causal, other.window,
                other.softcap) == (pc.head_dim, pc.head_dim_v, pc.causal, pc.window, pc.softcap)
                and (other.dtype == FP8) == (pc.dtype == FP8) and (pc.page_size or not other.page_size)):
            found.append(other)
    return sorted(found, key=lambda o: (o.regime != pc.regime, _page_distance(o, pc),
                                        abs(o.qhead_per_kvhead - pc.qhead_per_kvhead), o.dtype != pc.dtype,
                                        -o.qhead_per_kvhead))


def _page_distance(other: ProblemClass, pc: ProblemClass) -> int:
    """How far apart two classes' page sizes are, in powers of two (a contiguous cache counts as 512-token pages)."""
    if other.page_size == pc.page_size:
        return 0
    return abs((other.page_size or 512).bit_length() - (pc.page_size or 512).bit_length())


def resolve(pc: ProblemClass, table: Mapping[str, C], feasible: Callable[[C, ProblemClass], object],
            defaults: Sequence[tuple[str, C]] = ()) -> Resolution[C]:
    """The rule above for one class: `table` maps class names to configs, `feasible(config, pc)` is truthy where a
    config can be the class's entry (a Verdict, or a bool). `defaults`: steps 3 and 4, (rule, config) pairs tried in
    order ("upstream" first: its resolution keeps config None); without them, step 3 is taken unchecked."""
    own = table.get(pc.name)
    if own is not None:
        return Resolution(pc, own, pc.name, "own")
    for other in neighbours(pc, table):
        config = table[other.name]
        if config is not None and feasible(config, pc):
            return Resolution(pc, config, other.name, "fallback")
    if not defaults:
        return Resolution(pc, None, None, "upstream")
    refusals = []
    for rule, config in defaults:
        verdict = feasible(config, pc)
        if verdict:
            return Resolution(pc, None if rule == "upstream" else config, None, rule, "; ".join(refusals))
        refusals.append(f"{DEFAULT_NAMES.get(rule, rule)} refused by {verdict if not isinstance(verdict, bool) else 'the static rules'}")
    return Resolution(pc, None, None, "none", "; ".join(refusals))
