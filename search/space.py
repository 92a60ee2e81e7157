"""The Optuna view of fa4tune.space: a direction's knobs as Optuna distributions, and back.

An integer knob whose values are evenly spaced (tile sizes, thread counts, stage counts) is an ordered
`IntDistribution(low, high, step)`, so that TPE and GP see that 64 < 128 < 192 < 256; the other knobs (booleans,
the kernel class, values that are not evenly spaced such as the backward's 32/64/128 blocks and 1/2/4/8 atom
layouts, for which Optuna has no distribution that samples only those values) stay categorical.

A direction ("fwd" or "bwd") fixes the config class, its knob domain, its feasibility rules and
upstream's default. The space signature names all of that, so a study can refuse to continue
under a different space. The forward's domain is read from the registered kernel classes
(fa4tune.kernel_class): `kernel` ranges over the names of those the search draws (`searched`), and each such
class's own knobs join the domain; a knob applies only to configs of its class (Optuna samples it for every trial,
the config drops it). The backward's domain does the same with the backward classes once the search draws more than
upstream's (backward_space). A problem class's space offers only the kernel classes that declare its regime
(`regimes`: split-KV is not offered to prefills); a study stored before that cut keeps the space it was made with
(`Space.stored`: Optuna refuses a categorical knob whose choices change within a study).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from fa4tune import defaults
from fa4tune.config import FP8, REGIMES, UPSTREAM_BACKWARD_KERNEL, BackwardConfig, ConfigError, ForwardConfig, ProblemClass
from fa4tune.feasibility import Verdict, backward_smem_bytes, check_backward, check_forward_entry, forward_smem_bytes
from fa4tune.kernel_class import backward_kernels, forward_kernels, register_loader
from fa4tune.space import BACKWARD_DOMAIN, DECODE_FORWARD_DOMAIN, forward_domain
from fa4tune.targets import Target
from search.storing.history import config_key


def _load_experiment():
    """experiment.py's kernel classes join the space: loaded by the harness's loader when the search first asks."""
    from fa4tune.harness.candidates import load_default_experiment

    return load_default_experiment()


register_loader(_load_experiment)  # the registry receives experiment.py; it never loads it itself

DIRECTIONS = ("fwd", "bwd")
_FEASIBLE: dict[tuple, object] = {}  # (space signature, problem class) -> feasible configs; the cut spaces too


@dataclass(frozen=True)
class Space:
    """The knobs of one direction: domain, config class, static rules and upstream's default."""

    direction: str
    domain: dict[str, tuple]
    config_class: type
    check: Callable[[Any, ProblemClass, Target], Verdict]
    upstream: Callable[[ProblemClass], Any]
    smem_bytes: Callable[[Any, ProblemClass], tuple[int, str]]
    kernel_knobs: dict[str, tuple[str, ...]] = field(default_factory=dict)  # kernel class name -> its own knobs
    # Each study searches only the knob values some feasible config of its problem class has (`for_class`): the
    # backward's rules accept ~0.05 % of its product (36 of 73,728 configs for d128 causal), and samplers drawing
    # from the whole product proposed infeasible configs until a run stalled.
    per_class: bool = False
    # Knob domains a problem class's regime replaces (the forward's decode classes: small tiles, few warps); such a
    # class's space is cut per class as well.
    regime_domain: dict[str, dict[str, tuple]] = field(default_factory=dict)
    # Knob domains an opt-in "fp8" class replaces (`kernel`: the classes that quantize, which no other class's
    # domain holds, so the other classes' spaces and signatures are those of the studies stored before); cut per class.
    fp8_domain: dict[str, tuple] = field(default_factory=dict)
    # kernel class name -> the regimes whose problem classes' spaces offer it (fa4tune.kernel_class `regimes`); a
    # class absent here is offered everywhere. Not in the signature: the cut domain is.
    kernel_regimes: dict[str, frozenset] = field(default_factory=dict)

    def distributions(self) -> dict[str, BaseDistribution]:
        """One distribution per knob (single-valued knobs included, so params map 1:1): see `distribution`."""
        return {name: distribution(values) for name, values in self.domain.items()}

    def active(self, values: dict[str, Any]) -> dict[str, tuple]:
        """The domain's knobs that apply to a config with these values: all but other kernel classes' own knobs."""
        own = set(self.kernel_knobs.get(values.get("kernel"), ()))
        others = {name for knobs in self.kernel_knobs.values() for name in knobs} - own
        return {name: domain for name, domain in self.domain.items() if name not in others}

    def config(self, params: dict[str, Any]):
        """The config of a trial's params (knobs absent from params keep the config's default; knobs of
        another kernel class are left out)."""
        active = self.active(params)
        return self.config_class.from_dict({name: value for name, value in params.items() if name in active or name not in self.domain})

    def values(self, config) -> dict[str, Any]:
        """A config's knobs as this space names them: to_dict(), and `kernel` wherever the domain has it (a
        BackwardConfig's to_dict leaves out upstream's "sm120", so that stored studies keep their records)."""
        values = config.to_dict()
        return {**values, "kernel": config.kernel} if "kernel" in self.domain else values

    def params(self, config) -> dict[str, Any]:
        """Trial params of a config: exactly the domain's knobs (another kernel class's at its first value)."""
        values = self.values(config)
        return {name: values[name] if name in values else domain[0] for name, domain in self.domain.items()}

    def in_domain(self, config) -> str:
        """'' if every knob value that applies to the config lies in the domain, else which one does not."""
        values = self.values(config)
        for name, domain in self.active(values).items():
            value = values[name]
            if not any(value == d and type(value) is type(d) for d in domain):
                return f"{name}={value!r} is not in the search domain ({', '.join(map(repr, domain))})"
        return ""

    def violation(self, config, problem_class: ProblemClass, target: Target, verdict: Verdict) -> float:
        """How far a rejected config is from feasible, for the samplers' constraint (> 0 means infeasible).

        Shared memory overflow is graded (excess / capacity), so that the samplers learn where the
        boundary lies; every other rule counts 1.
        """
        if verdict.ok:
            return 0.0
        if verdict.rule == "smem_capacity":
            excess = self.smem_bytes(config, problem_class)[0] - target.smem_per_block
            return max(excess / target.smem_per_block, 1e-3)
        return 1.0

    def feasible(self, problem_class: ProblemClass, target: Target) -> list:
        """Every config of the domain that the static rules accept for the class (enumerated once, then cached)."""
        key = (self.signature(target), problem_class.name)
        if key not in _FEASIBLE:
            names, active = list(self.domain), {}  # kernel class -> the knobs its configs take (as `config` reads them)
            unique = {}  # another class's knobs repeat a config: each once, in the product's order
            for values in itertools.product(*(self.domain[n] for n in names)):
                params = dict(zip(names, values))
                kernel = params.get("kernel")
                if kernel not in active:
                    active[kernel] = set(self.active(params))
                config = self.config_class.from_dict({n: v for n, v in params.items() if n in active[kernel]})
                unique.setdefault(config, config)
            _FEASIBLE[key] = [c for c in unique if self.check(c, problem_class, target)]
        return _FEASIBLE[key]

    def for_class(self, problem_class: ProblemClass, target: Target) -> "Space":
        """A per_class space cut to the knob values of the class's feasible configs (each knob keeps its order);
        unchanged when the space is not per_class or nothing is feasible. First the kernel classes that do not serve
        the class's regime leave the domain (`offered`); a regime with a domain of its own (regime_domain) swaps it in
        next, and is cut per class."""
        if self.kernel_regimes:
            key = ("offered", self.signature(target), problem_class.regime)
            if key not in _FEASIBLE:
                _FEASIBLE[key] = self.offered(problem_class.regime)
            return _FEASIBLE[key].for_class(problem_class, target)
        if problem_class.dtype == FP8 and self.fp8_domain:  # the whole domain: no other class's knobs
            return replace(self, domain=dict(self.fp8_domain), regime_domain={}, fp8_domain={},
                           per_class=True).for_class(problem_class, target)
        override = self.regime_domain.get(problem_class.regime)
        if override:
            return replace(self, domain={**self.domain, **override}, regime_domain={}, per_class=True).for_class(problem_class, target)
        if not self.per_class:
            return self
        key = ("for_class", self.signature(target), problem_class.name)
        if key not in _FEASIBLE:
            feasible = [self.values(c) for c in self.feasible(problem_class, target)]
            domain = {name: tuple(v for v in values if any(v == c.get(name) and type(v) is type(c.get(name)) for c in feasible))
                      for name, values in self.domain.items()}
            if self.direction == "bwd" and domain.get("kernel") == (UPSTREAM_BACKWARD_KERNEL,):
                del domain["kernel"]  # only upstream's class runs this class: the space of the studies stored before
            _FEASIBLE[key] = replace(self, domain=domain, per_class=False) if feasible else replace(self, per_class=False)
        return _FEASIBLE[key]

    def offered(self, regime: str) -> "Space":
        """This space without the kernel classes that do not serve `regime` (kernel_regimes) and the knobs only they
        own; itself where kernel_regimes is empty. The result cuts no further (its kernel_regimes is empty)."""
        if not self.kernel_regimes:
            return self
        kernels = self.domain.get("kernel", ())
        dropped = {name for name in kernels if regime not in self.kernel_regimes.get(name, (regime,))}
        if not dropped or dropped == set(kernels):  # a domain with no class left would have no config at all
            return replace(self, kernel_regimes={})
        kept_knobs = {name: knobs for name, knobs in self.kernel_knobs.items() if name not in dropped}
        own_only = {k for name in dropped for k in self.kernel_knobs.get(name, ())} - {k for knobs in kept_knobs.values() for k in knobs}
        domain = {name: values for name, values in self.domain.items() if name not in own_only}
        domain["kernel"] = tuple(name for name in kernels if name not in dropped)
        return replace(self, domain=domain, kernel_knobs=kept_knobs, kernel_regimes={})

    def stored(self, signature: str, problem_class: ProblemClass, target: Target) -> "Space | None":
        """The space of a study of the class stored with `signature`: this one cut to the class (for_class), or, for a
        study stored before kernel classes declared their regimes, the same without that cut (its trials' categorical
        choices must stay the study's); None when neither matches. Call it on a direction's whole space."""
        for space in (self.for_class(problem_class, target), replace(self, kernel_regimes={}).for_class(problem_class, target)):
            if space.signature(target) == signature:
                return space
        return None

    def random_feasible(self, problem_class: ProblemClass, target: Target, rng: random.Random, exclude: set):
        """A uniformly drawn feasible config whose to_dict() items are not in `exclude`; None when the space is exhausted."""
        left = [c for c in self.feasible(problem_class, target) if config_key(c.to_dict()) not in exclude]
        return rng.choice(left) if left else None

    def signature(self, target: Target) -> str:
        """A short hash of everything that decides which configs exist and which are feasible."""
        return hashlib.sha256(json.dumps(self.describe(target), sort_keys=True).encode()).hexdigest()[:16]

    def describe(self, target: Target) -> dict:
        """The space as JSON-ready data (stored on the study next to its signature)."""
        described = {
            "direction": self.direction,
            "domain": {name: list(values) for name, values in self.domain.items()},
            "ordered": sorted(name for name, d in self.distributions().items() if isinstance(d, IntDistribution)),
            "target": target.name,
            "smem_per_block": target.smem_per_block,
        }
        if any(self.kernel_knobs.values()):  # which class a knob belongs to decides the configs (absent: as before)
            described["kernel_knobs"] = {name: list(knobs) for name, knobs in self.kernel_knobs.items()}
        return described


def distribution(values: tuple) -> BaseDistribution:
    """IntDistribution(low, high, step) for two or more evenly spaced integers (an ordered knob), else categorical."""
    ordered = sorted(values) if all(isinstance(v, int) and not isinstance(v, bool) for v in values) else []
    steps = {b - a for a, b in zip(ordered, ordered[1:])}
    if len(ordered) > 1 and len(steps) == 1:
        return IntDistribution(ordered[0], ordered[-1], step=steps.pop())
    return CategoricalDistribution(list(values))


_FORWARD_SPACES: dict[int, tuple[dict, Space]] = {}  # id(kernel registry) -> (registry, its space)
_BACKWARD_SPACES: dict[int, tuple[dict, Space]] = {}


def backward_space(kernels: dict[str, type] | None = None) -> Space:
    """The backward space of the registered backward classes (fa4tune.kernel_class.backward_kernels() when None):
    BACKWARD_DOMAIN, and, once the search draws more than upstream's class, `kernel` and each class's own knobs
    (with upstream's alone, the space and its signature are those of every backward study stored before)."""
    kernels = backward_kernels() if kernels is None else kernels
    known = _BACKWARD_SPACES.get(id(kernels))
    if known is None or known[0] is not kernels:
        searched = searched_kernels(kernels)
        domain, own = dict(BACKWARD_DOMAIN), {}
        if set(searched) != {UPSTREAM_BACKWARD_KERNEL}:
            domain["kernel"] = tuple(searched)
            for name, cls in searched.items():
                own[name] = tuple(cls.knobs)
                for knob, values in cls.knobs.items():
                    domain[knob] = tuple(dict.fromkeys(domain.get(knob, ()) + tuple(values)))
        space = Space("bwd", domain, BackwardConfig, check_backward, defaults.upstream_backward, backward_smem_bytes,
                      own, per_class=True, kernel_regimes=kernel_regimes(searched) if "kernel" in domain else {})
        known = _BACKWARD_SPACES[id(kernels)] = (kernels, space)
    return known[1]


def forward_space(kernels: dict[str, type] | None = None) -> Space:
    """The forward space of the registered kernel classes (fa4tune.kernel_class.forward_kernels() when None)."""
    kernels = forward_kernels() if kernels is None else kernels
    known = _FORWARD_SPACES.get(id(kernels))
    if known is None or known[0] is not kernels:
        searched = searched_kernels(kernels)
        plain = {name: cls for name, cls in searched.items() if not cls.quantizes}
        fp8 = {name: cls for name, cls in searched.items() if cls.quantizes}
        space = Space("fwd", forward_domain(plain), ForwardConfig, check_forward_entry, defaults.upstream_forward, forward_smem_bytes,
                      {name: tuple(cls.knobs) for name, cls in {**plain, **fp8}.items() if cls.knobs or name in plain},
                      regime_domain={"decode": DECODE_FORWARD_DOMAIN},
                      fp8_domain={**forward_domain(fp8), "kernel": tuple(fp8)} if fp8 else {},
                      kernel_regimes=kernel_regimes(searched))
        known = _FORWARD_SPACES[id(kernels)] = (kernels, space)
    return known[1]


def searched_kernels(kernels: dict[str, type]) -> dict[str, type]:
    """The classes the search draws: those whose `searched` is true (the rest run from dispatch entries only)."""
    return {name: cls for name, cls in kernels.items() if cls.searched}


def kernel_regimes(kernels: dict[str, type]) -> dict[str, frozenset]:
    """name -> the regimes a class serves, for the classes that do not serve every regime (fa4tune.kernel_class)."""
    return {name: frozenset(cls.regimes) for name, cls in kernels.items() if set(cls.regimes) != set(REGIMES)}


def get_space(direction: str) -> Space:
    """The space of 'fwd' (of experiment.py's kernel classes and ours) or 'bwd'; a one-line error otherwise."""
    if direction == "fwd":
        return forward_space()
    if direction == "bwd":
        return backward_space()
    raise ConfigError("direction", f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
