"""The Optuna view of fa4tune.space: a direction's knobs as categorical distributions, and back.

A direction ("fwd" or "bwd") fixes the config class, its knob domain, its feasibility rules and
upstream's default. The space signature names all of that, so a study can refuse to continue
under a different space.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from dataclasses import dataclass
from typing import Any, Callable

from optuna.distributions import CategoricalDistribution

from fa4tune import defaults
from fa4tune.config import BackwardConfig, ConfigError, ForwardConfig, ProblemClass
from fa4tune.feasibility import Verdict, backward_smem_bytes, check_backward, check_forward, forward_smem_bytes
from fa4tune.space import BACKWARD_DOMAIN, FORWARD_DOMAIN
from fa4tune.targets import Target
from search.history import config_key

DIRECTIONS = ("fwd", "bwd")
_FEASIBLE: dict[tuple, list] = {}  # (space signature, problem class) -> feasible configs


@dataclass(frozen=True)
class Space:
    """The knobs of one direction: domain, config class, static rules and upstream's default."""

    direction: str
    domain: dict[str, tuple]
    config_class: type
    check: Callable[[Any, ProblemClass, Target], Verdict]
    upstream: Callable[[ProblemClass], Any]
    smem_bytes: Callable[[Any, ProblemClass], tuple[int, str]]

    def distributions(self) -> dict[str, CategoricalDistribution]:
        """One categorical distribution per knob (single-valued knobs included, so params map 1:1)."""
        return {name: CategoricalDistribution(list(values)) for name, values in self.domain.items()}

    def config(self, params: dict[str, Any]):
        """The config of a trial's params (knobs absent from params keep the config's default)."""
        return self.config_class.from_dict(params)

    def params(self, config) -> dict[str, Any]:
        """Trial params of a config: exactly the domain's knobs."""
        values = config.to_dict()
        return {name: values[name] for name in self.domain}

    def in_domain(self, config) -> str:
        """'' if every knob value lies in the domain, else which one does not."""
        values = config.to_dict()
        for name, domain in self.domain.items():
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
            names = list(self.domain)
            configs = (self.config(dict(zip(names, values))) for values in itertools.product(*(self.domain[n] for n in names)))
            _FEASIBLE[key] = [c for c in configs if self.check(c, problem_class, target)]
        return _FEASIBLE[key]

    def random_feasible(self, problem_class: ProblemClass, target: Target, rng: random.Random, exclude: set):
        """A uniformly drawn feasible config whose to_dict() items are not in `exclude`; None when the space is exhausted."""
        left = [c for c in self.feasible(problem_class, target) if config_key(c.to_dict()) not in exclude]
        return rng.choice(left) if left else None

    def signature(self, target: Target) -> str:
        """A short hash of everything that decides which configs exist and which are feasible."""
        return hashlib.sha256(json.dumps(self.describe(target), sort_keys=True).encode()).hexdigest()[:16]

    def describe(self, target: Target) -> dict:
        """The space as JSON-ready data (stored on the study next to its signature)."""
        return {
            "direction": self.direction,
            "domain": {name: list(values) for name, values in self.domain.items()},
            "target": target.name,
            "smem_per_block": target.smem_per_block,
        }


SPACES: dict[str, Space] = {
    "fwd": Space("fwd", FORWARD_DOMAIN, ForwardConfig, check_forward, defaults.upstream_forward, forward_smem_bytes),
    "bwd": Space("bwd", BACKWARD_DOMAIN, BackwardConfig, check_backward, defaults.upstream_backward, backward_smem_bytes),
}


def get_space(direction: str) -> Space:
    """The space of 'fwd' or 'bwd'; a one-line error otherwise."""
    if direction not in SPACES:
        raise ConfigError("direction", f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
    return SPACES[direction]
