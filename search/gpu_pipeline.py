"""The GPU evaluator on the compile pipeline: search.compile_stage in CPU processes, the harness on the GPU.

Same measurements as search.evaluators.GpuEvaluator (prepare's gate, then timing, in child processes), but
each candidate is compiled ahead (search.compile_stage: its sm_120a static facts, then its compile for the GPU's
arch into the kernel cache; one compile on an sm_120a GPU), a candidate that fails to compile
or whose compiled shared storage exceeds the target's never reaches the GPU, and the ready candidates of a
batch run in one harness child (prepare.run_steps_isolated: a crash still costs only its own step).
The gate seed is drawn once per evaluator, so that the compile stage knows the gate's shapes.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from fa4tune.config import BackwardConfig, ForwardConfig, Problem, ProblemClass
from fa4tune.kernel_cache import ENV as KERNEL_CACHE_ENV
from fa4tune.kernel_cache import device_arch
from fa4tune.measurement import Measurement, ProblemResult
from fa4tune.targets import Target
from search.compile_stage import GPU_COMPILE_FUNCTION, CompileStage
from search.evaluators import not_run
from search.pipeline import Pipeline, Ready

DEFAULT_CACHE = Path(os.environ.get("FA4TUNE_CACHE_DIR", Path.cwd() / ".cache")) / "kernels"
COMPILE_FUNCTION = GPU_COMPILE_FUNCTION


def shared_env(target: Target, num_sms: int, cache_dir: Path) -> dict:
    """What the compilers and the GPU child must agree on (the kernel cache's fingerprint reads it)."""
    return {
        "FLASH_ATTENTION_ARCH": target.arch, "FLASH_ATTENTION_NUM_SMS": str(num_sms),
        KERNEL_CACHE_ENV: str(cache_dir),
        # upstream's own persistent cache, for the backward's pre/postprocess kernels
        "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(cache_dir / "upstream"),
    }


def compile_env(target: Target, capability: tuple[int, int], num_sms: int, cache_dir: Path) -> dict:
    """Compilers: the GPU's arch without touching the GPU (fake tensors), cubins kept for their facts."""
    return {
        **shared_env(target, num_sms, cache_dir), "CUTE_DSL_ARCH": device_arch(*capability), "CUDA_VISIBLE_DEVICES": "",
        "CUTE_DSL_KEEP": "cubin", "PYTHONWARNINGS": "ignore",
    }


def compile_job(kind: str, config, problems: list[Problem], target: Target, experiment_path: str, gate_seed: int,
                gate_random_problems: int, arch: str) -> dict:
    """The JSON job of search.compile_stage.CompileStage.compile_candidate and search.precompile.compile_gate_shapes."""
    return {
        "kind": kind, "config": config.to_dict(), "problems": [p.to_dict() for p in problems], "target": target.name,
        "experiment_path": str(experiment_path), "gate_seed": gate_seed, "gate_random_problems": gate_random_problems, "arch": arch,
    }


class PipelinedGpuEvaluator:
    """Evaluator whose candidates compile ahead; `evaluate` may be called from several threads at once
    (one per trial in flight), and returns when that candidate's measurement is done."""

    def __init__(self, target: Target, compile_jobs: int, experiment_path: str | None = None, cache_dir: Path | None = None,
                 settings=None, max_batch: int = 8, ready_capacity: int = 4):
        import prepare
        from fa4tune import gpu
        from fa4tune.config import ConfigError

        self._prepare = prepare
        info = gpu.read_device()
        mode = gpu.select_mode(info, target)
        if mode == gpu.UNSUPPORTED:
            raise ConfigError("gpu_evaluator", f"{info.name} (sm_{info.capability[0]}{info.capability[1]}) cannot run SM120 kernels, emulated or not")
        cache_dir = Path(cache_dir or DEFAULT_CACHE).resolve()
        self.target, self.device, self.mode = target, info.name, mode
        self.experiment_path = str(experiment_path or prepare.EXPERIMENT_PATH)
        self.arch = device_arch(*info.capability)
        self.settings = settings or prepare.Settings(gate_seed=prepare.new_gate_seed())
        self.child_env = {**gpu.kernel_env(info, target, mode), **shared_env(target, info.num_sms, cache_dir)}
        self.harness_sha256 = prepare.prepare_sha256()
        self._experiment = prepare.load_experiment(self.experiment_path)
        stage = CompileStage.open(target, self.arch, compile_env(target, info.capability, info.num_sms, cache_dir), compile_jobs)
        self.pipeline = Pipeline(stage, self._evaluate_batch, ready_capacity=ready_capacity, max_batch=max_batch)
        self._lock = threading.Lock()

    def evaluate(self, kind: str, config, problem_class: ProblemClass, problems: list[Problem], monitor=None) -> Measurement:
        """Compile ahead (CPU), then gate and time on the GPU unless the compile stage ended it."""
        problems = [p for p in problems if kind == "fwd" or p.backward]
        job = compile_job(kind, config, problems, self.target, self.experiment_path, self.settings.gate_seed,
                          self.settings.gate_random_problems, self.arch)
        compiled, results = self.pipeline.run(job)
        if results is None:
            results = not_run(kind, problems, compiled)
        return Measurement(kind, problem_class.name, config.to_dict(), tuple(results), self.target.name, self.device, self.mode,
                           evaluator="gpu", static=compiled.get("static") or {})

    def close(self) -> None:
        self.pipeline.close()

    def _configs(self, job: dict):
        kind = job["kind"]
        config = (ForwardConfig if kind == "fwd" else BackwardConfig).from_dict(job["config"])
        pc = Problem.from_dict(job["problems"][0]).problem_class
        if kind == "fwd":
            return config, self._experiment.backward_config(pc)
        return self._experiment.forward_config(pc), config

    def _evaluate_batch(self, batch: list[Ready], done) -> None:
        """One harness child for the batch's steps; each candidate's result as soon as its last step ends."""
        prepare = self._prepare
        results: list[dict[str, ProblemResult]] = [{} for _ in batch]
        labels = [[Problem.from_dict(p).label for p in item.job["problems"]] for item in batch]
        steps = []
        for i, item in enumerate(batch):
            kind = item.job["kind"]
            fwd_config, bwd_config = self._configs(item.job)
            for data in item.job["problems"]:
                problem = Problem.from_dict(data)
                failure = prepare.feasibility_failure(kind, fwd_config, bwd_config, problem, self.target)
                if failure:
                    results[i][problem.label] = ProblemResult(problem.label, kind, "infeasible", reason=failure)
                    continue
                spec = prepare.experiment_spec(f"candidate {i}", self.experiment_path, fwd_config, bwd_config)
                steps.append(prepare.Step(problem, kind, [spec]))

        def finish(i: int) -> None:
            if len(results[i]) == len(labels[i]):
                done(batch[i], [results[i][label] for label in labels[i]])

        def on_result(step, name, result) -> None:
            i = int(name.split()[-1])
            results[i][step.problem.label] = result
            finish(i)

        for i in range(len(batch)):
            finish(i)  # candidates whose every problem was infeasible
        if steps:
            prepare.run_steps_isolated(steps, self.settings, env=self.child_env, on_result=on_result)
