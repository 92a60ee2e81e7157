"""A static-check compiler process: reads jobs (JSON lines) on stdin, compiles each with fake tensors, answers on stdout.

Started by fa4tune.static_check with the environment that makes the DSL target sm_120a (it is read at import
time, so each worker is a fresh interpreter). `compile_job` is also the static stage of the search's compile
pipeline (search.evaluating.compile_stage runs it in search.evaluating.pipeline's compiler processes).
"""

from __future__ import annotations

import json
import sys

from fa4tune.config import BackwardConfig, ForwardConfig, ProblemClass
from fa4tune.static_check import RESULT_PREFIX, StaticJob


def compile_job(spec: dict) -> dict:
    """One job (fa4tune.static_check.job_spec) compiled here for its problem class's static shape:
    {"status": ok | static_error | compile_error, "reason", "kernel": KernelFacts.resources() when ok}."""
    from fa4tune.fake_compile import compile_shapes, error_reason, static_shape

    config_cls = ForwardConfig if spec["kind"] == "fwd" else BackwardConfig
    job = StaticJob(spec["kind"], config_cls.from_dict(spec["config"]), ProblemClass.from_dict(spec["problem_class"]))
    try:
        from fa4tune.harness.candidates import load_experiment

        experiment = load_experiment(spec["experiment_path"])
        kernel = experiment.kernel_class(job.config) if job.kind == "fwd" else None
        facts = compile_shapes(experiment, job.kind, job.config, [static_shape(job.problem_class, kernel)])
    except Exception as err:  # a compile error is a result, not a crash
        return {"status": "compile_error", "reason": error_reason(err)}
    if facts.cubin_error:
        return {"status": "static_error", "reason": facts.cubin_error[:500]}
    return {"status": "ok", "reason": "", "kernel": facts.resources()}


def main() -> None:
    """Serve jobs until stdin closes."""
    import warnings

    warnings.filterwarnings("ignore")
    for line in sys.stdin:
        reply = compile_job(json.loads(line))
        sys.stdout.write(RESULT_PREFIX + json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
