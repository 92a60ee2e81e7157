"""What a proposer is given, what it returns, and how its proposals are validated before enqueueing."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from fa4tune.config import ConfigError, Problem, ProblemClass
from fa4tune.targets import Target
from search.space import Space
from search.storing.history import TrialRecord, config_key, measured


@dataclass(frozen=True)
class Proposal:
    """A config as a proposer wrote it (not yet validated) and its one-paragraph rationale."""

    config: Any
    rationale: str = ""


@dataclass(frozen=True)
class Rejection:
    """A proposal that was not enqueued, and why (goes back to the proposer on its next turn)."""

    proposal: Proposal
    reason: str


@dataclass(frozen=True)
class Context:
    """Everything a proposer may look at when it takes a turn."""

    space: Space
    problem_class: ProblemClass
    problems: list[Problem]
    target: Target
    history: list[TrialRecord]
    k: int  # how many configs to propose


class ProposerUnavailable(Exception):
    """The proposer cannot take this turn (no key, API errors); the sampler takes it."""

    def __init__(self, message: str, permanent: bool = False):
        super().__init__(message)
        self.permanent = permanent


class Proposer(ABC):
    """Suggests configs; the loop validates them and enqueues the valid ones."""

    name: str = "proposer"

    @abstractmethod
    def propose(self, context: Context) -> list[Proposal]:
        """Up to context.k proposals; raises ProposerUnavailable to pass the turn."""

    def feedback(self, rejections: list[Rejection]) -> None:
        """Rejected proposals of this turn (a proposer that learns shows them to its model)."""

    def close(self) -> None:
        """Releases connections."""


@dataclass
class Checked:
    """A turn's proposals split into configs to enqueue and rejections."""

    accepted: list[tuple[Any, Proposal]] = field(default_factory=list)  # (config, proposal)
    rejected: list[Rejection] = field(default_factory=list)


def check_proposals(proposals: list[Proposal], context: Context) -> Checked:
    """Schema, knob domain, static feasibility and novelty of each proposal, in that order."""
    checked = Checked()
    seen = measured(context.history)
    for proposal in proposals:
        reason, config = _check(proposal, context, seen)
        if reason:
            checked.rejected.append(Rejection(proposal, reason))
        elif len(checked.accepted) >= context.k:
            checked.rejected.append(Rejection(proposal, f"more than the {context.k} configs asked for"))
        else:
            checked.accepted.append((config, proposal))
            seen[config_key(config.to_dict())] = None
    return checked


def _check(proposal: Proposal, context: Context, seen: dict) -> tuple[str, Any]:
    space = context.space
    values = proposal.config
    if not isinstance(values, dict):
        return f"config must be an object of knob values, got {type(values).__name__}", None
    if not isinstance(proposal.rationale, str):
        return "rationale must be a string", None
    values = dict(values)
    for name, domain in space.active(values).items():  # another kernel class's own knobs do not apply
        if name not in values:
            if len(domain) != 1:
                return f"missing knob {name!r}", None
            values[name] = domain[0]
    try:
        config = space.config(values)
    except ConfigError as err:
        return str(err), None
    out_of_domain = space.in_domain(config)
    if out_of_domain:
        return out_of_domain, None
    verdict = space.check(config, context.problem_class, context.target)
    if not verdict:
        return f"infeasible: {verdict}", None
    key = config_key(config.to_dict())
    if key in seen:
        earlier = seen[key]
        if earlier is None:
            return "proposed twice in this turn", None
        return f"already measured in trial #{earlier.number} ({_value(earlier)})", None
    return "", config


def _value(r: TrialRecord) -> str:
    return f"{r.value:.1f} TFLOPS" if r.value is not None else r.status
