"""The GPU evaluator on the compile pipeline: search.evaluating.compile_stage in CPU processes, the harness on the GPU.

`search run`'s default evaluator. Same measurements as search.evaluating.gpu.GpuEvaluator (the harness's gate, then
timing, in the run's step server: one child on the GPU for the whole run), but each candidate is compiled ahead
(search.evaluating.compile_stage: its sm_120a static facts, then its compile for the GPU's arch into the kernel cache; one
compile on an sm_120a GPU) while earlier ones are measured, a candidate that fails to compile or whose compiled
shared storage exceeds the target's never reaches the GPU, and the GPU child only loads each kernel. A crash
still costs only its own step (fa4tune.harness.step_server). The gate seed is drawn once per evaluator, so that the
compile stage knows the gate's shapes and the child computes each problem's references once.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

from fa4tune.config import BackwardConfig, ForwardConfig, Problem, ProblemClass
from fa4tune.harness.measurement import Measurement, ProblemResult
from fa4tune.kernel_cache import ENV as KERNEL_CACHE_ENV
from fa4tune.kernel_cache import device_arch
from fa4tune.targets import Target
from search.evaluating.compile_stage import GPU_COMPILE_FUNCTION, CompileStage
from search.evaluating.gpu import not_run
from search.evaluating.pipeline import Pipeline, Ready
from search.evaluating.pruning import not_measured

DEFAULT_CACHE = Path(os.environ.get("FA4TUNE_CACHE_DIR", Path.cwd() / ".cache")) / "kernels"
COMPILE_FUNCTION = GPU_COMPILE_FUNCTION
MAX_COMPILING = 14  # trials compiling at once, at most (more would leave the sampler proposing blind)


def shared_env(target: Target, num_sms: int, cache_dir: Path) -> dict:
    """What the compilers and the GPU child must agree on (the kernel cache's fingerprint reads it)."""
    return {
        "FLASH_ATTENTION_ARCH": target.arch, "FLASH_ATTENTION_NUM_SMS": str(num_sms),
        KERNEL_CACHE_ENV: str(cache_dir),
        # upstream's own persistent cache, for the backward's pre/postprocess kernels
        "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(cache_dir / "upstream"),
    }


def compile_env(target: Target, capability: tuple[int, int], num_sms: int, cache_dir: Path) -> dict:
    """Compilers: the GPU's arch without touching the GPU (fake tensors), cubins kept for their facts (in a temporary
    folder: the DSL writes them to the working directory otherwise)."""
    return {
        **shared_env(target, num_sms, cache_dir), "CUTE_DSL_ARCH": device_arch(*capability), "CUDA_VISIBLE_DEVICES": "",
        "CUTE_DSL_KEEP": "cubin", "CUTE_DSL_DUMP_DIR": tempfile.mkdtemp(prefix="fa4tune-cubins-"), "PYTHONWARNINGS": "ignore",
    }


def compile_job(kind: str, config, problems: list[Problem], target: Target, experiment_path: str, gate_seed: int,
                gate_random_problems: int, arch: str) -> dict:
    """The JSON job of search.evaluating.compile_stage.CompileStage.compile_candidate and search.evaluating.precompile.compile_gate_shapes."""
    return {
        "kind": kind, "config": config.to_dict(), "problems": [p.to_dict() for p in problems], "target": target.name,
        "experiment_path": str(experiment_path), "gate_seed": gate_seed, "gate_random_problems": gate_random_problems, "arch": arch,
    }


class PipelinedGpuEvaluator:
    """Evaluator whose candidates compile ahead; `evaluate` may be called from several threads at once
    (one per trial in flight: `slots` of them keep the compilers and the GPU busy), and returns when that
    candidate's measurement is done. Its processes start with the first evaluation: a run that only checks
    its input (`search run --workers 0`) starts none."""

    def __init__(self, target: Target, compile_jobs: int, experiment_path: str | None = None, cache_dir: Path | None = None,
                 settings=None, max_batch: int = 8, ready_capacity: int = 4):
        from fa4tune.config import ConfigError
        from fa4tune.harness import evaluation, gpu
        from fa4tune.harness.candidates import load_experiment
        from fa4tune.harness.runs import prepare_sha256
        from fa4tune.harness.settings import EXPERIMENT_PATH, Settings, new_gate_seed

        self._harness = evaluation
        self._gpu = gpu
        self.info = info = gpu.read_device()
        mode = gpu.select_mode(info, target)
        if mode == gpu.UNSUPPORTED:
            raise ConfigError("gpu_evaluator", f"{info.name} (sm_{info.capability[0]}{info.capability[1]}) cannot run SM120 kernels, emulated or not")
        self.cache_dir = Path(cache_dir or DEFAULT_CACHE).resolve()
        self.target, self.device, self.mode = target, info.name, mode
        self.experiment_path = str(experiment_path or EXPERIMENT_PATH)
        self.arch = device_arch(*info.capability)
        self.settings = settings or Settings(gate_seed=new_gate_seed())
        self.child_env = {**gpu.kernel_env(info, target, mode), **shared_env(target, info.num_sms, self.cache_dir)}
        self.harness_sha256 = prepare_sha256()
        self._experiment = load_experiment(self.experiment_path)
        self.compile_jobs = compile_jobs
        # trials in flight: those compiling (no more than the compilers can take, and few enough that the sampler
        # still learns between proposals), one ready, one on the GPU
        self.slots = min(compile_jobs, MAX_COMPILING) + 2
        self.max_batch, self.ready_capacity = max_batch, ready_capacity
        self.stats = {"compile_s": 0.0, "static_compile_s": 0.0, "compiled": 0}  # CPU seconds of the compile stage
        self._pipeline: Pipeline | None = None
        self.server = None  # fa4tune.harness.step_server.StepServer: one child on the GPU for the whole run
        self._lock = threading.Lock()

    @property
    def pipeline(self) -> Pipeline:
        """The compile pools, the consumer and the step server, started on first use."""
        with self._lock:
            if self._pipeline is None:
                self.server = self._harness.new_step_server(env=self.child_env)  # its imports overlap the first compiles
                stage = CompileStage.open(self.target, self.arch, compile_env(self.target, self.info.capability, self.info.num_sms, self.cache_dir),
                                          self.compile_jobs)
                self._pipeline = Pipeline(stage, self._evaluate_batch, ready_capacity=self.ready_capacity, max_batch=self.max_batch)
            return self._pipeline

    def evaluate(self, kind: str, config, problem_class: ProblemClass, problems: list[Problem], monitor=None) -> Measurement:
        """Compile ahead (CPU), then gate and time on the GPU unless the compile stage ended it."""
        problems = [p for p in problems if kind == "fwd" or p.backward]
        job = compile_job(kind, config, problems, self.target, self.experiment_path, self.settings.gate_seed,
                          self.settings.gate_random_problems, self.arch)
        compiled, results = self.pipeline.run(job, payload=monitor)
        with self._lock:
            self.stats["compiled"] += 1
            self.stats["compile_s"] += (compiled.get("compile") or {}).get("seconds") or 0.0
            self.stats["static_compile_s"] += (compiled.get("static") or {}).get("compile_seconds") or 0.0
        if results is None:
            results = not_run(kind, problems, compiled)
        return Measurement(kind, problem_class.name, config.to_dict(), tuple(results), self.target.name, self.device, self.mode,
                           evaluator="gpu", static=compiled.get("static") or {})

    def close(self) -> None:
        with self._lock:
            pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            pipeline.close()
            self.server.close()

    def _configs(self, job: dict):
        kind = job["kind"]
        config = (ForwardConfig if kind == "fwd" else BackwardConfig).from_dict(job["config"])
        pc = Problem.from_dict(job["problems"][0]).problem_class
        if kind == "fwd":
            return config, self._experiment.backward_config(pc)
        return self._experiment.forward_config(pc), config

    def _evaluate_batch(self, batch: list[Ready], done) -> None:
        """The batch's candidates in the step server, problem by problem: each round sends every candidate's next
        problem as one call, reports each result to the candidate's monitor, and leaves a pruned candidate's
        other problems unmeasured; a candidate's result goes back as soon as its last problem is done."""
        from fa4tune.harness.candidates import experiment_spec
        from fa4tune.harness.evaluation import feasibility_failure
        from fa4tune.harness.steps import Step

        todo = [[Problem.from_dict(p) for p in item.job["problems"]] for item in batch]
        results: list[list[ProblemResult]] = [[] for _ in batch]
        specs = []
        for i, item in enumerate(batch):
            fwd_config, bwd_config = self._configs(item.job)
            specs.append((fwd_config, bwd_config, experiment_spec(f"candidate {i}", self.experiment_path, fwd_config, bwd_config)))
        while True:
            steps, owners = [], []
            for i, item in enumerate(batch):
                kind, monitor = item.job["kind"], item.payload
                while todo[i] and i not in owners:
                    problem = todo[i].pop(0)
                    failure = feasibility_failure(kind, specs[i][0], specs[i][1], problem, self.target)
                    if failure:
                        results[i].append(ProblemResult(problem.label, kind, "infeasible", reason=failure))
                        continue
                    limit = monitor.give_up_ms(problem.label) if monitor is not None else None
                    steps.append(Step(problem, kind, [specs[i][2]], limit))
                    owners.append(i)
                if not todo[i] and i not in owners and not item.future.done():
                    done(item, results[i])
            if not steps:
                return
            measured = self.server.run_steps(steps, self.settings)
            for i, step, found in zip(owners, steps, measured):
                result = found[f"candidate {i}"]
                results[i].append(result)
                monitor = batch[i].payload
                if monitor is not None and not monitor.report(result):
                    results[i] += [not_measured(p, step.direction, f"the config was pruned on {step.problem.label}") for p in todo[i]]
                    todo[i] = []

