"""The answer of a static rule: ok, or the failing rule with a message that has the numbers. Below both the
kernel-class protocol (fa4tune.kernel_class: a class's `can_implement` returns one) and the rules that read it
(fa4tune.feasibility, which names these too), so that neither imports the other to say "ok"."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """The answer of a feasibility check: ok, or the failing rule with a message that has the numbers."""

    ok: bool
    rule: str = ""
    message: str = ""

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return "ok" if self.ok else f"{self.rule}: {self.message}"


OK = Verdict(True)
