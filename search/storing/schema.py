"""Names of the user attrs that search/ writes: the storage schema the report, apply and dashboards read.

On every study (`study.user_attrs`):
    direction, problem_class, target, space_signature, space, problems, objective, rejected_proposals
On every trial (`trial.user_attrs`):
    proposer, rationale, config, status, reason, rule, tflops, geomean_tflops, results, errors, static,
    device, mode, evaluator, target, git_commit, evaluated, constraint,
    and where they apply: confirmation_of, confirmed, duplicate_of, requeued_from
"""

# study
DIRECTION = "direction"  # "fwd" | "bwd"
PROBLEM_CLASS = "problem_class"  # ProblemClass.name
TARGET = "target"  # Target.name whose rules decide feasibility
SPACE_SIGNATURE = "space_signature"  # Space.signature(target): a study refuses another space
SPACE = "space"  # Space.describe(target): the domain, readable
PROBLEMS = "problems"  # labels of the problems whose geomean is the objective
OBJECTIVE = "objective"  # a sentence: what the trial value means
REJECTED_PROPOSALS = "rejected_proposals"  # {proposer: proposals rejected before enqueueing}

# trial
PROPOSER = "proposer"  # "tpe" | "gp" | "random" | "claude" | "scripted" | "baseline" | "explore" | "confirmation"
RATIONALE = "rationale"  # the proposer's one-paragraph reason ("" for samplers)
CONFIG = "config"  # the full config dict (ForwardConfig / BackwardConfig .to_dict())
STATUS = "status"  # "ok", a Measurement status, "infeasible", or "missing" (replay table lacks it)
REASON = "reason"  # why not ok (feasibility message, gate failure, crash text)
RULE = "rule"  # the feasibility rule that rejected the config
TFLOPS = "tflops"  # {problem label: TFLOPS}
GEOMEAN_TFLOPS = "geomean_tflops"  # the trial value when ok, else None
RESULTS = "results"  # [ProblemResult.to_dict(), ...]
ERRORS = "errors"  # {problem label: max errors vs the reference}
STATIC = "static"  # static facts (registers, spills, smem) when the evaluator gives them
DEVICE = "device"
MODE = "mode"  # "native" | "emulated" | "replay"
EVALUATOR = "evaluator"  # "gpu" | "replay"
GIT_COMMIT = "git_commit"
EVALUATED = "evaluated"  # True when the config reached the evaluator (counts towards n_trials)
CONSTRAINT = "constraint"  # [violation]: > 0 infeasible or failed, also set with trial.set_constraint
CONFIRMATION_OF = "confirmation_of"  # number of the trial this one re-measures
CONFIRMED = "confirmed"  # on a confirmation: passed the gate and within tolerance of the original
DUPLICATE_OF = "duplicate_of"  # a proposal of an already measured config: its value is copied, not measured
REQUEUED_FROM = "requeued_from"  # a trial left RUNNING by a killed run, enqueued again with its params

CONSTRAINT_KEY = "feasibility"  # the key of trial.set_constraint
