"""Studies for the dashboard, plot and export tests: real search loops (search.running.loop, with its confirmations)
on replayed SYNTHETIC tables, with a scripted proposer in Claude's seat so that the winners are known.

Every table written here says "synthetic": true; the numbers are invented, never a measurement.
"""

from __future__ import annotations

import json
from pathlib import Path

from fa4tune.config import BackwardConfig, ForwardConfig, ProblemClass
from fa4tune.defaults import upstream_backward
from fa4tune.harness.measurement import Measurement, ProblemResult
from fa4tune.suites import load_suite
from fa4tune.targets import get_target
from search.evaluating.replay import ReplayEvaluator
from search.evaluating.table import load_table, save_table
from search.proposing.samplers import make_sampler
from search.proposing.scripted import ScriptedProposer
from search.proposing.turns import FixedRatio
from search.running.loop import LoopSettings, StopFlag, StudyLoop
from search.storing.storage import open_storage
from search.storing.study import StudySpec, open_study
from search_helpers import SUITE, Recorder
from synthetic_table import write_synthetic_table

RATIONALE = "Bigger tiles with 256 threads should stop the causal register spills (test rationale 7f3a)."
# Winners the scripted proposer offers; the synthetic numbers make each beat upstream's default and the runner-up.
FWD_MHA = ForwardConfig(tile_m=128, tile_n=128, num_threads=256, num_stages=1, Q_in_regs=False)
FWD_MHA_RUNNER_UP = ForwardConfig(tile_m=128, tile_n=96, num_threads=256, num_stages=1, Q_in_regs=False)
FWD_GQA = ForwardConfig(tile_m=64, tile_n=128, num_threads=128, num_stages=1, Q_in_regs=True)
FWD_GQA_RUNNER_UP = ForwardConfig(tile_m=64, tile_n=64, num_threads=128, num_stages=2, Q_in_regs=False)
BWD = BackwardConfig(m_block_size=64, n_block_size=64, num_threads=256, AtomLayoutMSdP=4, AtomLayoutNdKV=4, AtomLayoutMdQ=4)
BWD_CLASS = "d128-noncausal-bf16"


def forward_table(tmp_path: Path) -> Path:
    """The synthetic forward table of the quick suite, each config with invented static facts."""
    path = tmp_path / "synthetic_fwd.json"
    write_synthetic_table(path, load_suite(SUITE))
    data = json.loads(path.read_text())
    for m in data["measurements"]:
        c = m["config"]
        registers = min(255, 96 + c["tile_m"] * c["tile_n"] // c["num_threads"])
        m["static"] = {"registers": registers, "stack_bytes": 0, "spill_store_bytes": 8 * max(0, registers - 250),
                       "spill_load_bytes": 8 * max(0, registers - 250), "dynamic_smem_bytes": 49152, "static_smem_bytes": 1024,
                       "occupancy": 0.0833, "occupancy_limiter": "smem", "synthetic": True}
    path.write_text(json.dumps(data))
    return path


def backward_table(tmp_path: Path) -> Path:
    """A synthetic backward table for BWD_CLASS: upstream's default, BWD and one more config."""
    pc = ProblemClass.parse(BWD_CLASS)
    problems = [p for p in load_suite(SUITE) if p.problem_class == pc and p.backward]
    rows = [(upstream_backward(pc), 150.0), (BWD, 190.0), (BackwardConfig(num_stages_Q=2), 160.0)]
    measurements = [
        Measurement("bwd", pc.name, config.to_dict(),
                    tuple(ProblemResult(p.label, "bwd", "ok", tflops=tflops, max_errors={"dq": 1e-3, "dq_tolerance": 4e-3})
                          for p in problems),
                    "sm120", "synthetic", "synthetic", evaluator="synthetic")
        for config, tflops in rows
    ]
    path = tmp_path / "synthetic_bwd.json"
    save_table(str(path), measurements, synthetic=True, device="synthetic (not a measurement)", mode="synthetic",
               target="sm120", problems=[p.to_dict() for p in problems])
    return path


def run_study(url: str, direction: str, class_name: str, table: Path, script: list, confirmations: int = 2,
              sampler_trials: int = 0, evaluator=None, seed: int = 0) -> None:
    """One study through search's own loop: upstream's default, the script, `sampler_trials` random ones, confirmations."""
    pc = ProblemClass.parse(class_name)
    problems = tuple(p for p in load_suite(SUITE) if p.problem_class == pc and (direction == "fwd" or p.backward))
    spec = StudySpec(direction, pc, problems, get_target("sm120"))
    study = open_study(open_storage(url), spec, make_sampler("random", seed))
    # a space of several kernel classes asks every proposal to name its class (to_dict leaves the default out)
    named = "kernel" in spec.space.domain
    proposer = ScriptedProposer([{**c.to_dict(), **({"kernel": c.kernel} if named else {})} for c in script], RATIONALE)
    weights = {"scripted": 1.0, "random": 1.0 if sampler_trials else 1e-6}
    settings = LoopSettings(n_trials=1 + len(script) + sampler_trials, k=len(script), confirmations=confirmations, results_path=None)
    evaluator = evaluator or ReplayEvaluator(load_table(str(table)))
    StudyLoop(study, spec, evaluator, "random", [proposer], FixedRatio(weights), settings, Recorder(), StopFlag()).run()


class FailingConfirmations:
    """A replay evaluator whose every answer after the first `good` ones fails the gate (incorrect)."""

    def __init__(self, table: Path, good: int):
        self.replay = ReplayEvaluator(load_table(str(table)))
        self.good = good
        self.calls = 0

    def evaluate(self, kind, config, problem_class, problems, monitor=None):
        self.calls += 1
        m = self.replay.evaluate(kind, config, problem_class, problems)
        if self.calls <= self.good:
            return m
        results = tuple(ProblemResult(r.problem, kind, "incorrect", reason="out error 0.5 > tolerance 0.04 (test)") for r in m.results)
        return Measurement(m.kind, m.problem_class, m.config, results, m.target, m.device, m.mode, m.evaluator)
