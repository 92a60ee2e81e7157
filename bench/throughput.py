"""Throughput of GPU evaluation: checked (config, problem) evaluations per GPU-hour, in the mode `search run` uses by
default and in the sequential mode, on the same candidates, with where the time goes.

    python3 bench/throughput.py [--suite standard] [--seconds 240] [--sequential-seconds 150] [--modes default sequential]

The same candidate list for both modes: forward configs of every problem class of the suite (the feasible
space in a fixed shuffled order), each evaluated on the suite's problems of its class, with the harness's own
settings (gate, timing) and pruning as `search run` prunes (an Optuna study per mode with search.evaluating.pruning's
SlowerThanBestPruner; the give-up times come from the best results so far). A mode takes candidates until
its time is up and finishes those it started.

- default: what `python -m search run` does: search.evaluating.protocol.make_evaluator("gpu") with its defaults, the
  pipelined evaluator: cores - 1 CPU processes compile ahead (the sm_120a static check, then the GPU's arch, into
  a fresh kernel cache), `evaluator.slots` candidates in flight, one step-server child on the GPU for the run.
- sequential: `--compile-jobs 0`: search.evaluating.gpu.GpuEvaluator, one candidate at a time, its sm_120a static
  check first, then the step server's child compiles and measures it.

"checked" counts (config, problem) results that went through the gate (ok, incorrect, or pruned after some
timing). GPU idle is 1 - mean(nvidia-smi utilization.gpu) sampled every 100 ms (the timer's blocking kernels
count as busy: their total is printed beside it). Prints a table and, with --out FILE, the per-candidate
records as JSON lines. Record the output in docs/measurements/.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fa4tune.space import feasible_forward  # noqa: E402
from fa4tune.suites import load_suite, problem_classes  # noqa: E402
from fa4tune.targets import get_target  # noqa: E402

CHECKED = ("ok", "incorrect", "pruned")  # results that went through the gate (a pruned one was timed, then stopped)


def checked(r) -> bool:
    """A result that went through the gate (not a problem left out after its config was pruned)."""
    return r.status in CHECKED and not (r.status == "pruned" and r.tflops is None)


def candidates(suite: str, target, seed: int = 0) -> list[tuple]:
    """(config, problem class, problems) for every feasible forward config, classes interleaved, shuffled per class."""
    problems = load_suite(suite)
    per_class = []
    for pc in problem_classes(problems):
        configs = feasible_forward(pc, target)
        random.Random(f"{seed}:{pc.name}").shuffle(configs)
        per_class.append([(cfg, pc, [p for p in problems if p.problem_class == pc]) for cfg in configs])
    interleaved = []
    for row in range(max(len(c) for c in per_class)):
        interleaved += [c[row] for c in per_class if row < len(c)]
    return interleaved


class UtilizationSampler:
    """nvidia-smi utilization.gpu every 100 ms in the background; idle_share() afterwards (None without nvidia-smi)."""

    def __init__(self, index: int = 0):
        self.samples: list[float] = []
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "100", "-i", str(index)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self.thread = threading.Thread(target=self._read, daemon=True)
            self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.samples.append(float(line.strip()))
            except ValueError:
                pass

    def stop(self) -> float | None:
        """The idle share: 1 - mean utilization over the samples."""
        if self.proc is None:
            return None
        self.proc.terminate()
        self.proc.wait()
        return 1 - statistics.fmean(self.samples) / 100 if self.samples else None


def _tally(measurements: list, seconds: float, idle: float | None, evaluator) -> dict:
    results = [r for m in measurements for r in m.results]
    count = sum(1 for r in results if checked(r))
    server = evaluator.server
    stats = dict(server.stats) if server is not None and hasattr(server, "stats") else {}
    pipeline = getattr(evaluator, "_pipeline", None)
    waited = sum(e - s for s, e in pipeline.stats.waits) if pipeline is not None else None
    static_s = sum((m.static or {}).get("compile_seconds") or 0.0 for m in measurements if not (m.static or {}).get("cached"))
    compile_s = getattr(evaluator, "stats", {}).get("compile_s", 0.0)
    return {
        "candidates": len(measurements), "checked": count,
        "ok": sum(1 for r in results if r.status == "ok"), "incorrect": sum(1 for r in results if r.status == "incorrect"),
        "pruned": sum(1 for m in measurements if m.status == "pruned"),
        "compile_stage": sum(1 for r in results if r.status in ("compile_error", "infeasible")),
        "crash_or_timeout": sum(1 for r in results if r.status in ("crash", "timeout")),
        "seconds": seconds, "per_gpu_hour": count / seconds * 3600 if seconds else 0.0,
        "gpu_idle_share": idle, "consumer_wait_s": waited, "static_compile_cpu_s": static_s, "gpu_arch_compile_cpu_s": compile_s,
        **{f"gpu_child_{k}": v for k, v in stats.items()},
    }


class Pruning:
    """search run's pruning for a list of candidates: an Optuna study with SlowerThanBestPruner, one trial each."""

    def __init__(self, factor: float):
        import optuna

        from search.evaluating.pruning import make_pruner

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.factor = factor
        self.study = optuna.create_study(direction="maximize", pruner=make_pruner(factor))
        self.lock = threading.Lock()

    def monitor(self, problems, kind: str):
        from search.evaluating.pruning import TrialMonitor, best_tflops, give_up_ms
        from search.storing import schema

        with self.lock:
            trial = self.study.ask()
            done = [t.user_attrs[schema.MEASUREMENT]["results"] for t in self.study.get_trials(deepcopy=False) if schema.MEASUREMENT in t.user_attrs]
            return TrialMonitor(trial, give_up_ms(problems, kind, best_tflops(done), self.factor))

    def tell(self, monitor, m) -> None:
        from optuna.trial import TrialState

        from search.storing import schema

        with self.lock:
            monitor.trial.set_user_attr(schema.MEASUREMENT, m.to_dict())
            if m.ok:
                self.study.tell(monitor.trial, m.geomean_tflops())
            else:
                self.study.tell(monitor.trial, state=TrialState.PRUNED if m.status == "pruned" else TrialState.FAIL)


def run_mode(mode: str, todo: list, target, seconds: float, cache_dir: Path, prune_factor: float, slots: int = 0) -> tuple[list, dict]:
    """Evaluates candidates from `todo` for `seconds` in a mode, with `slots` in flight (0: `evaluator.slots`, what
    `search run` gives it by default; a host with many cores needs more to keep its compile processes busy)."""
    from search.evaluating.gpu import GpuEvaluator
    from search.evaluating.gpu_pipeline import PipelinedGpuEvaluator
    from search.evaluating.protocol import default_compile_jobs

    if mode == "sequential":
        evaluator = GpuEvaluator(target, static_cache=cache_dir / "static-facts.jsonl")
    else:  # make_evaluator("gpu")'s default, with a fresh kernel cache so that every compile counts
        evaluator = PipelinedGpuEvaluator(target, default_compile_jobs(), cache_dir=cache_dir)
    pruning = Pruning(prune_factor)
    in_flight = slots if slots and mode != "sequential" else evaluator.slots
    print(f"{mode}: {type(evaluator).__name__}, compile jobs {getattr(evaluator, 'compile_jobs', 0)}, slots {in_flight}", flush=True)
    sampler, start, done, lock = UtilizationSampler(), time.monotonic(), [], threading.Lock()

    def one(item):
        cfg, pc, problems = item
        if time.monotonic() - start > seconds:
            return
        monitor = pruning.monitor(problems, "fwd")
        m = evaluator.evaluate("fwd", cfg, pc, problems, monitor=monitor)
        pruning.tell(monitor, m)
        with lock:
            done.append(m)
            print(f"  {mode:10s} {len(done):4d} {time.monotonic() - start:6.1f}s {pc.name:26s} {cfg.short():60s} {m.status}", flush=True)

    try:
        with ThreadPoolExecutor(in_flight) as pool:
            list(pool.map(one, todo))
        wall = time.monotonic() - start
        idle = sampler.stop()
        tally = _tally(done, wall, idle, evaluator)
    finally:
        evaluator.close()
    return done, tally


def _agreement(by_mode: dict) -> str:
    """Median TFLOPS ratio default/sequential over (config, problem) measured ok by both (the same kernel, the same harness)."""
    if set(by_mode) != {"sequential", "default"}:
        return ""
    seq = {(json.dumps(m.config, sort_keys=True), r.problem): r.tflops for m in by_mode["sequential"] for r in m.results if r.status == "ok"}
    ratios = [r.tflops / seq[k] for m in by_mode["default"] for r in m.results
              if r.status == "ok" and (k := (json.dumps(m.config, sort_keys=True), r.problem)) in seq and seq[k]]
    if not ratios:
        return ""
    return (f"same (config, problem) ok in both modes: {len(ratios)}, TFLOPS default/sequential: median {statistics.median(ratios):.3f}, "
            f"min {min(ratios):.3f}, max {max(ratios):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="standard")
    parser.add_argument("--modes", nargs="+", default=["default", "sequential"], choices=["default", "sequential"])
    parser.add_argument("--seconds", type=float, default=240.0, help="time of the default mode before it stops taking candidates")
    parser.add_argument("--sequential-seconds", type=float, default=150.0)
    parser.add_argument("--prune-factor", type=float, default=None, help="default: search run's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slots", type=int, default=0, help="candidates in flight in the default mode (search run's --slots; default: the evaluator's)")
    parser.add_argument("--out", type=Path, default=None, help="JSON lines: one record per evaluated candidate and mode")
    args = parser.parse_args()

    from fa4tune.harness import gpu
    from search.evaluating.pruning import DEFAULT_FACTOR

    target = get_target("sm120")
    info = gpu.read_device()
    todo = candidates(args.suite, target, args.seed)
    factor = DEFAULT_FACTOR if args.prune_factor is None else args.prune_factor
    print(f"device: {info.name} ({gpu.select_mode(info, target)} for {target.name}); suite {args.suite}: {len(todo)} candidates; "
          f"prune factor {factor}; harness settings as search run", flush=True)
    rows, by_mode = {}, {}
    for mode in args.modes:
        cache_dir = Path(tempfile.mkdtemp(prefix=f"fa4tune-{mode}-"))
        limit = args.seconds if mode == "default" else args.sequential_seconds
        by_mode[mode], rows[mode] = run_mode(mode, todo, target, limit, cache_dir, factor, args.slots)
        shutil.rmtree(cache_dir, ignore_errors=True)
        if args.out:
            with open(args.out, "a") as f:
                for m in by_mode[mode]:
                    f.write(json.dumps({**m.to_dict(), "bench_mode": mode}) + "\n")
                f.write(json.dumps({"bench_mode": mode, "tally": rows[mode]}) + "\n")

    def pct(x):
        return "n/a" if x is None else f"{100 * x:.0f} %"

    def sec(x):
        return "n/a" if x is None else f"{x:.0f}"

    print()
    print("| mode | candidates | checked (config, problem) | ok | incorrect | pruned configs | ended in compile stage | crash/timeout | seconds | checked per GPU-hour | GPU idle (nvidia-smi) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mode, r in rows.items():
        print(f"| {mode} | {r['candidates']} | {r['checked']} | {r['ok']} | {r['incorrect']} | {r['pruned']} | {r['compile_stage']} | {r['crash_or_timeout']} | "
              f"{r['seconds']:.0f} | {r['per_gpu_hour']:.0f} | {pct(r['gpu_idle_share'])} |")
    print()
    print("where the time goes (seconds; the GPU child's are wall time in that process, the compiles CPU-seconds spread over the compile processes)")
    print("| mode | wall | GPU child starts (s) | gate incl. kernel loads/compiles | timing | of which the timed outputs' check | GPU child waiting for work | sm_120a static compiles (CPU) | GPU-arch compiles (CPU) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, r in rows.items():
        busy = r.get("gpu_child_startup_s", 0) + r.get("gpu_child_step_s", 0)
        print(f"| {mode} | {r['seconds']:.0f} | {r.get('gpu_child_starts', 0)} ({sec(r.get('gpu_child_startup_s'))}) | {sec(r.get('gpu_child_gate_s'))} | "
              f"{sec(r.get('gpu_child_timing_s'))} | {r.get('gpu_child_check_s', 0):.1f} | {sec(max(0.0, r['seconds'] - busy))} | {sec(r['static_compile_cpu_s'])} | {sec(r['gpu_arch_compile_cpu_s'])} |")
    if line := _agreement(by_mode):
        print(line)
    for mode, r in rows.items():
        print(f"throughput_{mode}: {r['per_gpu_hour']:.0f}")


if __name__ == "__main__":
    main()
