"""The harness's fixed settings: what a step gates and times with, a child's time limits, where a run reads
experiment.py and writes its results.tsv row. One source for each number: prepare.py (the contract a coding agent
reads) takes them from here, and so does the engine, in the parent and in its child processes.
"""

from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the project root: prepare.py, experiment.py, results.tsv
DEFAULT_SUITE = "standard"
RESULTS_TSV = Path(os.environ.get("FA4TUNE_RESULTS_TSV", ROOT / "results.tsv"))  # e.g. $OUT/results.tsv on a lent GPU
EXPERIMENT_PATH = ROOT / "experiment.py"
STEP_TIME_LIMIT_S = 300.0  # one (problem, direction) in a child: compile, gate and timing
STARTUP_TIME_LIMIT_S = 180.0  # a child's imports (torch, the CuTe DSL) before its first step
WARMUP_CALLS = 3  # untimed calls per candidate first (the first one compiles)
TIMED_ROUNDS = 10  # rounds of interleaved timed calls; each round calls every input set once
INPUT_SETS = 3  # random input sets rotated between timed calls
GATE_SCALE = 8.0  # inputs multiplied by this in the large-magnitude gate case
GATE_SEQLEN_OFFSET = 37  # the gate case with sequence lengths that are not tile multiples
GATE_RANDOM_PROBLEMS = 2  # small problems of the same class drawn at run time (seed recorded)
GATE_RANDOM_MAX_SEQLEN = 1024
REFERENCE_CHUNK_BYTES = 2 << 30  # fp32 reference computed in chunks of this many score bytes
REFERENCE_CACHE_FRACTION = 8  # a step server keeps gate references in up to 1/8 of the device's memory
REFERENCE_CACHE_CPU_BYTES = 1 << 30  # (on the CPU: tests)
GUARD_SEED_OFFSET = 7  # the run-time guards' inputs: gate seed + this (other values than every gate case)


@dataclass(frozen=True)
class Settings:
    """How thoroughly a step gates and times (the module constants, or smaller ones in tests)."""

    gate_seed: int
    warmup: int = WARMUP_CALLS
    rounds: int = TIMED_ROUNDS
    input_sets: int = INPUT_SETS
    gate_random_problems: int = GATE_RANDOM_PROBLEMS
    reference_chunk_bytes: int = REFERENCE_CHUNK_BYTES

    def to_dict(self) -> dict:
        return asdict(self)


def new_gate_seed() -> int:
    """The seed of this run's random gate cases: $FA4TUNE_GATE_SEED, else drawn now (and recorded)."""
    fixed = os.environ.get("FA4TUNE_GATE_SEED")
    return int(fixed) if fixed else random.SystemRandom().randrange(2**31)
