"""A proposer that follows a fixed list of configs: tests and the bench use it in Claude's seat."""

from __future__ import annotations

from search.proposing.proposer import Context, Proposal, Proposer, ProposerUnavailable, Rejection
from search.storing.history import config_key, measured


class ScriptedProposer(Proposer):
    """Proposes the next k configs of its script that are not measured yet."""

    def __init__(self, script: list[dict], rationale: str = "scripted", name: str = "scripted"):
        self.script = list(script)
        self.rationale = rationale
        self.name = name
        self.turns = 0
        self.rejections: list[Rejection] = []

    def propose(self, context: Context) -> list[Proposal]:
        self.turns += 1
        done = measured(context.history)
        fresh = [c for c in self.script if config_key(_full(c, context)) not in done]
        if not fresh:
            raise ProposerUnavailable("script exhausted", permanent=True)
        return [Proposal(dict(c), self.rationale) for c in fresh[: context.k]]

    def feedback(self, rejections: list[Rejection]) -> None:
        self.rejections.extend(rejections)


def _full(config: dict, context: Context) -> dict:
    return context.space.config(config).to_dict()
