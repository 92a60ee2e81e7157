"""The harness's engine, behind prepare.py (the contract): pinned as one directory in fa4tune/harness.sha256.

settings (the fixed numbers), candidates (what a step runs), steps (gate, then timing; the child side), step_server
and isolation (the child processes), evaluation (one config over problems: the search's entry), runs (a run's
context, plan and lines), baselines, self_check, gate, timing, flops, measurement, metrics, results_tsv, gpu, and
the guardrails: guards (static rules, the pin; no torch) and runtime_guards (the trap, the output checks).
"""
