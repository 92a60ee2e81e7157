"""What the harness's checks cost per evaluation: measure_step's wall seconds for an honest kernel with the harness's
default settings, split as the step records them: the gate (with the run-time guards), the timing, and of the timing
the check (issue 66: every input set rewritten between rounds, every timed output checked). Run it at two commits on
one machine to see what a change to the harness adds (docs/measurements/2026-12-07-harness-hardening-cpu-cost.md).

    uv run python bench/harness_cost.py [--repeats N]    # CUDA: experiment.py's entries; CPU: einsum attention
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.guards_gpu import PROBLEMS, einsum_attention  # noqa: E402
from fa4tune.config import Problem  # noqa: E402
from fa4tune.harness import candidates, steps  # noqa: E402
from fa4tune.harness.settings import EXPERIMENT_PATH, Settings  # noqa: E402

CPU_PROBLEMS = [Problem(1, 256, 256, 4, 2, 64, 64, True, name="cpu gqa causal 256")]


def step_seconds(candidate, problem, direction, device, settings, repeats: int) -> dict:
    """Median over `repeats` steps of each part's seconds, and the median timed call (ms)."""
    parts, medians = {"gate": [], "timing": [], "check": []}, []
    for _ in range(repeats):
        seconds = {}
        result = steps.measure_step(problem, direction, [candidate], device=device, settings=settings, seconds=seconds)[candidate.name]
        if result.status != "ok":
            raise SystemExit(f"error: honest_kernel: {problem.name} {direction} is {result.status}: {result.reason}")
        for name in parts:
            parts[name].append(seconds.get(name, 0.0))
        medians.append(result.ms_median)
    return {**{name: statistics.median(values) for name, values in parts.items()}, "ms": statistics.median(medians)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    settings = Settings(gate_seed=1234)
    if torch.cuda.is_available():
        device, problems = "cuda", PROBLEMS
        experiment = candidates.load_experiment(EXPERIMENT_PATH)

        def candidate_for(problem):
            pc = problem.problem_class
            return candidates.experiment_candidate(experiment, experiment.forward_config(pc), experiment.backward_config(pc))
        print(f"device: {torch.cuda.get_device_name()}")
    else:
        torch.set_num_threads(1)
        device, problems = "cpu", CPU_PROBLEMS

        def candidate_for(problem):
            return candidates.Candidate("einsum", einsum_attention, {}, guarded=True)
        print("device: cpu (einsum attention, one thread)")
    print(f"{'problem':<22} {'dir':<4} {'gate s':>8} {'timing s':>9} {'check s':>8} {'check %':>8} {'median ms':>10}")
    for problem in problems:
        for direction in ("fwd", "bwd") if problem.backward else ("fwd",):
            row = step_seconds(candidate_for(problem), problem, direction, device, settings, args.repeats)
            share = 100 * row["check"] / (row["gate"] + row["timing"])
            print(f"{problem.name:<22} {direction:<4} {row['gate']:8.3f} {row['timing']:9.3f} {row['check']:8.3f} {share:8.1f} {row['ms']:10.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
