"""The backward census: fa4tune.feasibility's backward rules checked against real sm_120a compiles.

The backward domain (fa4tune.space.BACKWARD_DOMAIN) of a problem class is classified by the rules, without a
compile. Then a census compiles, per class:
- `structural`: every accepted structure (blocks, threads, the three swaps, the three atom layouts: what the tiled
  MMAs and copies are built from), each once, at the first accepted (stages, V_in_regs) in domain order;
- `variant`: more accepted configs drawn at random (other stages and V_in_regs, which change the pipeline depth and
  where V lives, not the tiling);
- `rejected`: per compile rule, configs that this rule alone rejects: a compile error shows the rule is needed;
- `gate`: configs that only a gate rule (fa4tune.feasibility.GATE_RULES) rejects: they compile, and the GPU sweep
  gates them.
Each entry is one JSON line (search/data/bwd_census.jsonl); `contradictions` is what a CI test keeps empty.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from fa4tune.config import BackwardConfig, ProblemClass
from fa4tune.feasibility import GATE_RULES, check_backward
from fa4tune.space import BACKWARD_DOMAIN, _product
from fa4tune.targets import Target

STRUCTURE = ("m_block_size", "n_block_size", "num_threads", "SdP_swapAB", "dKV_swapAB", "dQ_swapAB",
             "AtomLayoutMSdP", "AtomLayoutNdKV", "AtomLayoutMdQ")
# Rules found by compiling (the others are upstream's can_implement, the domains and measured gate failures)
COMPILE_RULES = ("AtomLayoutMSdP_divides_warps", "AtomLayoutNdKV_divides_warps", "AtomLayoutMdQ_divides_warps", "SdP_mma_tile",
                 "SdP_swapAB_P_store", "SdP_swapAB_lse_rows", "dKV_mma_tile", "dKV_swapAB_accumulator", "dQ_mma_tile",
                 "dQ_swapAB_head_dim_96_atoms")


@dataclass
class Classified:
    """One problem class's domain under the rules: counts per rule, and the configs a census compiles."""

    problem_class: ProblemClass
    domain: int = 0
    rejected: Counter = field(default_factory=Counter)
    accepted: list[BackwardConfig] = field(default_factory=list)
    only_rule: dict[str, list[BackwardConfig]] = field(default_factory=dict)  # configs that one rule alone rejects


def classify(pc: ProblemClass, target: Target) -> Classified:
    """Every config of the backward domain against the rules (no compile)."""
    out = Classified(pc)
    for values in _product(BACKWARD_DOMAIN):
        cfg = BackwardConfig(**values)
        out.domain += 1
        verdict = check_backward(cfg, pc, target)
        if verdict:
            out.accepted.append(cfg)
            continue
        out.rejected[verdict.rule] += 1
        if (verdict.rule in COMPILE_RULES or verdict.rule in GATE_RULES) and check_backward(cfg, pc, target, skip=frozenset({verdict.rule})):
            out.only_rule.setdefault(verdict.rule, []).append(cfg)
    return out


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file that a killed writer may have left with a torn last line (skipped)."""
    records = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def structure(cfg: BackwardConfig) -> tuple:
    return tuple(getattr(cfg, name) for name in STRUCTURE)


def census_sample(classified: Classified, variants: int, per_rule: int, seed: int = 0) -> list[tuple[str, BackwardConfig]]:
    """(sample, config) pairs a census compiles for one class: structural, variant, rejected and gate."""
    rng = random.Random(f"{seed}-{classified.problem_class.name}")
    picked, seen = [], set()
    for cfg in classified.accepted:
        if structure(cfg) not in seen:
            seen.add(structure(cfg))
            picked.append(("structural", cfg))
    rest = [cfg for cfg in classified.accepted if cfg not in {c for _, c in picked}]
    picked += [("variant", cfg) for cfg in rng.sample(rest, min(variants, len(rest)))]
    for rule in sorted(classified.only_rule):
        configs = classified.only_rule[rule]
        sample = "gate" if rule in GATE_RULES else "rejected"
        picked += [(sample, cfg) for cfg in rng.sample(configs, min(per_rule, len(configs)))]
    return picked


def entry(sample: str, pc: ProblemClass, cfg: BackwardConfig, verdict, facts) -> dict:
    """One census line: the config, the rules' verdict, and the compile's outcome (fa4tune.static_check.StaticFacts)."""
    return {
        "problem_class": pc.name, "config": cfg.to_dict(), "sample": sample, "verdict": "ok" if verdict else verdict.rule,
        "status": facts.status, "reason": facts.reason[:300], "registers": facts.registers,
        "spill_store_bytes": facts.spill_store_bytes, "dynamic_smem_bytes": facts.dynamic_smem_bytes,
        "compile_seconds": round(facts.compile_seconds, 2),
    }


def contradictions(entries: list[dict], target: Target) -> list[str]:
    """Where the census and today's rules disagree: a config today's rules accept that failed to compile (the
    recorded `verdict` is the rules' answer when the census ran). Empty: the census is true."""
    problems = []
    for e in entries:
        pc, cfg = ProblemClass.parse(e["problem_class"]), BackwardConfig.from_dict(e["config"])
        verdict = check_backward(cfg, pc, target)
        if verdict and e["status"] not in ("ok", "compile_timeout"):
            problems.append(f"{e['problem_class']} {cfg.short()}: accepted by every rule, but the compile said {e['status']}: {e['reason'][:160]}")
    return problems


def conservative(entries: list[dict]) -> Counter:
    """Per compile rule, the sampled configs it rejects that compiled all the same (the rule is stricter than the
    compiler; whether those kernels are correct is not measured)."""
    return Counter(e["verdict"] for e in entries if e["sample"] == "rejected" and e["status"] in ("ok", "infeasible"))


def summary_rows(classified: Classified, entries: list[dict]) -> dict:
    """One class's census figures: the domain, accepted, rejected per rule, and the compiles per sample."""
    mine = [e for e in entries if e["problem_class"] == classified.problem_class.name]
    compiled = Counter((e["sample"], e["status"]) for e in mine)
    return {
        "problem_class": classified.problem_class.name, "domain": classified.domain, "accepted": len(classified.accepted),
        "structures": len({structure(c) for c in classified.accepted}), "rejected": dict(classified.rejected.most_common()),
        "compiled": {f"{sample} {status}": n for (sample, status), n in sorted(compiled.items())},
    }
