"""The storage schema: the name of every attribute search/ writes on a study or a trial, each with what it holds.
Every reader and writer names an attribute through this module (tests/test_search_schema.py checks both).

On every study (`study.user_attrs`):
    direction, problem_class, target, space_signature, space, problems, objective, rejected_proposals,
    and with `run --workers`: search_settings, problem_specs, pending_turns
On every trial (`trial.user_attrs`):
    proposer, rationale, config, status, reason, rule, tflops, geomean_tflops, device, mode, target, git_commit,
    evaluated, constraint, worker, measurement (evaluated trials),
    and where they apply: confirmation_of, confirmed, duplicate_of, requeued_from

A trial the evaluator measured carries its whole Measurement (fa4tune.harness.measurement) as one attribute,
`measurement` (Measurement.to_dict(): per-problem results with times and the gate's errors, static facts, the
evaluator), beside the scalars a person reads in optuna-dashboard (status, reason, geomean_tflops, tflops, device,
mode, rule, proposer, rationale, evaluated, constraint). Storages written before that attribute existed hold the
measurement's parts as `results`, `errors`, `static` and `evaluator` instead (LEGACY_TRIAL_ATTRS);
search.storing.history.stored_measurement reads either.
"""

# -- study ---------------------------------------------------------------------------------------
DIRECTION = "direction"  # "fwd" | "bwd"
PROBLEM_CLASS = "problem_class"  # ProblemClass.name
TARGET = "target"  # Target.name whose rules decide feasibility (on trials too)
SPACE_SIGNATURE = "space_signature"  # Space.signature(target): a study refuses another space
SPACE = "space"  # Space.describe(target): the domain, readable
PROBLEMS = "problems"  # labels of the problems whose geomean is the objective
OBJECTIVE = "objective"  # a sentence: what the trial value means
REJECTED_PROPOSALS = "rejected_proposals"  # {proposer: proposals rejected before enqueueing}
SEARCH_SETTINGS = "search_settings"  # the search settings every worker uses (run_config.RunConfig fields; run --workers)
PROBLEM_SPECS = "problem_specs"  # [Problem.to_dict(), ...] of its problems in full (run --workers)
PENDING_TURNS = "pending_turns"  # {worker: {"proposer": name, "k": configs asked, "since": unix time}}: turns in progress

# -- trial ---------------------------------------------------------------------------------------
PROPOSER = "proposer"  # "tpe" | "gp" | "random" | "claude" | "scripted" | "baseline" | "incumbent" | "transfer" | "explore" | "split-twin" | "confirmation"
RATIONALE = "rationale"  # the proposer's one-paragraph reason ("" for samplers)
CONFIG = "config"  # the full config dict (ForwardConfig / BackwardConfig .to_dict())
STATUS = "status"  # "ok", a Measurement status, "infeasible", or "missing" (replay table lacks it)
REASON = "reason"  # why not ok (feasibility message, gate failure, crash text)
RULE = "rule"  # the feasibility rule that rejected the config
TFLOPS = "tflops"  # {problem label: TFLOPS} of the problems that passed
GEOMEAN_TFLOPS = "geomean_tflops"  # the trial value when ok, else None
DEVICE = "device"  # the measuring GPU's name ("... (replayed from TABLE)" for a replay)
MODE = "mode"  # "native" | "emulated" | "replay"
OCCUPANCY = "occupancy"  # emulated trials: "target" (launches padded to the target's CTAs per SM) or "device" (the
#   emulating GPU's own; trials without it ran before 2026-12-02, when there was no padding: fa4tune.emulated_occupancy)
MEASUREMENT = "measurement"  # Measurement.to_dict() of an evaluated trial: results, static facts, evaluator, ...
GIT_COMMIT = "git_commit"  # the fa4-tune commit that ran the trial ("-dirty" with local changes)
EVALUATED = "evaluated"  # True when the config reached the evaluator (counts towards n_trials)
CONSTRAINT = "constraint"  # [violation]: > 0 infeasible or failed, also set with trial.set_constraint
WORKER = "worker"  # the worker that claimed the trial for evaluation ("host:pid", "host:pid/slot", "local/slot")
CONFIRMATION_OF = "confirmation_of"  # number of the trial this one re-measures
CONFIRMED = "confirmed"  # on a confirmation: passed the gate and within tolerance of the original
DUPLICATE_OF = "duplicate_of"  # a proposal of an already measured config: its value is copied, not measured
REQUEUED_FROM = "requeued_from"  # a trial left RUNNING by a killed run, enqueued again with its params

# -- trial, read only: what storages written before MEASUREMENT hold in its place -------------------
RESULTS = "results"  # [ProblemResult.to_dict(), ...]: now MEASUREMENT["results"]
ERRORS = "errors"  # {problem label: max errors vs the reference}: now each result's max_errors
STATIC = "static"  # static facts (registers, spills, smem): now MEASUREMENT["static"]
EVALUATOR = "evaluator"  # "gpu" | "replay": now MEASUREMENT["evaluator"]

# -- study system attrs (beside optuna-dashboard's notes, which its own package names) ------------------
REPLAYED_TABLE = "fa4tune:replayed_table"  # what a replayed table says of its own device and mode (notes.table_meta)

# -- Optuna's own names that search/ reads ----------------------------------------------------------
FIXED_PARAMS = "fixed_params"  # trial system attr: the params study.enqueue_trial fixed (a requeue keeps them)
CONSTRAINT_KEY = "feasibility"  # the key of trial.set_constraint

STUDY_ATTRS = (DIRECTION, PROBLEM_CLASS, TARGET, SPACE_SIGNATURE, SPACE, PROBLEMS, OBJECTIVE, REJECTED_PROPOSALS,
               SEARCH_SETTINGS, PROBLEM_SPECS, PENDING_TURNS)
TRIAL_ATTRS = (PROPOSER, RATIONALE, CONFIG, STATUS, REASON, RULE, TFLOPS, GEOMEAN_TFLOPS, DEVICE, MODE, OCCUPANCY, MEASUREMENT,
               TARGET, GIT_COMMIT, EVALUATED, CONSTRAINT, WORKER, CONFIRMATION_OF, CONFIRMED, DUPLICATE_OF, REQUEUED_FROM)
LEGACY_TRIAL_ATTRS = (RESULTS, ERRORS, STATIC, EVALUATOR)
STUDY_SYSTEM_ATTRS = (REPLAYED_TABLE,)
