"""The backward's gate rules on a GPU: configs that compile but that fa4tune.feasibility.GATE_RULES rejects, run
through the correctness gate beside the same config with the knob off.

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 python3 bench/bwd_gate_rules.py [--per-rule 3]

For each gate rule and problem class: configs that only that rule rejects (fa4tune.census.classify), each gated
(fa4tune.harness.gate.gate_backward: out, LSE, dQ, dK, dV against the fp32 reference) on a tile-multiple and an
odd shape; then the control, the same config with the rule's knob off, which the rules accept. A row per run:
the rule, the config, and each gradient's max error against its tolerance.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fa4tune.census import classify  # noqa: E402
from fa4tune.config import Problem, ProblemClass  # noqa: E402
from fa4tune.feasibility import GATE_RULES, check_backward  # noqa: E402
from fa4tune.targets import get_target  # noqa: E402

KNOB = {"SdP_swapAB_lse_columns": "SdP_swapAB", "dKV_swapAB_transposed": "dKV_swapAB",
        "V_in_regs_wrong_gradients": "V_in_regs"}
CLASSES = ("d128-causal-bf16", "d64-causal-bf16", "d128-noncausal-bf16")


def shapes(pc: ProblemClass) -> list[Problem]:
    heads_kv = 2
    return [Problem(2, sq, sq, heads_kv * pc.qhead_per_kvhead, heads_kv, pc.head_dim, pc.head_dim_v, pc.causal, pc.dtype)
            for sq in (512, 333)]


def gate_row(experiment, pc: ProblemClass, cfg, label: str) -> bool:
    import torch

    from fa4tune.harness.gate import gate_backward, random_inputs

    forward = partial(experiment.attention, fwd_config=experiment.forward_config(pc), bwd_config=cfg, return_lse=True)
    passed = True
    for problem in shapes(pc):
        q, k, v, dout = random_inputs(problem, seed=1234, device=torch.device("cuda"), count=4)
        try:
            result = gate_backward(forward, q, k, v, problem.causal, dout)
            errors = "  ".join(f"{c.name} {c.error:.3g}/{c.tolerance:.3g}" for c in result.checks if c.name.startswith("d"))
            status = "pass" if result.passed else "FAIL"
        except Exception as err:  # a compile error or a fault: the row says so
            errors, status = f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}", "ERROR"
            torch.cuda.synchronize()
        passed = passed and status == "pass"
        print(f"  {label:8s} {status:5s} {problem.label:28s} {errors}", flush=True)
    return passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-rule", type=int, default=3)
    parser.add_argument("--classes", nargs="*", default=list(CLASSES))
    parser.add_argument("--rules", nargs="*", default=sorted(KNOB), help="gate rules to check (those of a knob)")
    args = parser.parse_args()
    import experiment

    target, summary = get_target("sm120"), []
    for name in args.classes:
        pc = ProblemClass.parse(name)
        classified = classify(pc, target)
        for rule in sorted(set(GATE_RULES) & set(args.rules)):
            configs = classified.only_rule.get(rule, [])
            for cfg in random.Random(f"0-{name}-{rule}").sample(configs, min(args.per_rule, len(configs))):
                control = dataclasses.replace(cfg, **{KNOB[rule]: False})
                print(f"{rule} | {name} | {cfg.short()}", flush=True)
                bad = not gate_row(experiment, pc, cfg, KNOB[rule])
                ok = check_backward(control, pc, target) and gate_row(experiment, pc, control, "control")
                summary.append((rule, name, bad, ok))
    print("\nrule | class | knob on fails the gate | control (knob off) passes")
    for rule, name, bad, ok in summary:
        print(f"{rule} | {name} | {bad} | {bool(ok)}")


if __name__ == "__main__":
    main()
