"""Throughput of GPU evaluation: checked (config, problem) evaluations per GPU-hour, sequential vs pipelined.

    python3 bench/throughput.py [--suite standard] [--seconds 240] [--compile-jobs 8] [--modes sequential pipelined]

The same candidate list for both modes: forward configs of every problem class of the suite (the feasible
space in a fixed shuffled order), each evaluated on the suite's problems of its class, through prepare's
correctness gate and timing (settings as bench/sweep.py: rounds=6, input_sets=2, gate_random_problems=1).
A mode takes candidates until its time is up and finishes those it started.

- sequential: what `python -m search run` does per trial: search.evaluators.GpuEvaluator (the sm_120a static
  check of the config on the CPU, into a fresh facts cache, then prepare.evaluate_isolated: one harness child per
  config, which compiles its kernels, then gates and times them).
- pipelined: search.gpu_pipeline.PipelinedGpuEvaluator: --compile-jobs CPU processes compile ahead (fake
  tensors, for the GPU's arch) into a fresh kernel cache, compile failures end there, and the GPU takes the
  ready candidates in batches (one harness child per batch, kernels loaded from the cache).

"checked" counts (config, problem) results that went through the gate (ok or incorrect). GPU idle is the
share of nvidia-smi samples (every 100 ms) of utilization.gpu, as 1 - mean(utilization); the pipelined
mode also reports the share of time its consumer waited for a compiled candidate. Prints a table and, with
--out FILE, writes the per-candidate records as JSON lines. Record the output in docs/measurements/.
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

CHECKED = ("ok", "incorrect")  # results that went through the gate


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


def _tally(measurements: list, seconds: float, idle: float | None, waited: float | None) -> dict:
    results = [r for m in measurements for r in m.results]
    checked = sum(1 for r in results if r.status in CHECKED)
    return {
        "candidates": len(measurements), "checked": checked,
        "ok": sum(1 for r in results if r.status == "ok"), "incorrect": sum(1 for r in results if r.status == "incorrect"),
        "compile_stage": sum(1 for r in results if r.status in ("compile_error", "infeasible")),
        "crash_or_timeout": sum(1 for r in results if r.status in ("crash", "timeout")),
        "seconds": seconds, "per_gpu_hour": checked / seconds * 3600 if seconds else 0.0,
        "gpu_idle_share": idle, "consumer_wait_share": waited,
    }


def run_sequential(todo: list, settings, target, seconds: float, cache_dir: Path) -> tuple[list, dict]:
    from search.evaluators import GpuEvaluator

    evaluator = GpuEvaluator(target, static_cache=cache_dir / "static-facts.jsonl", settings=settings)
    sampler, start, done = UtilizationSampler(), time.monotonic(), []
    try:
        for cfg, pc, problems in todo:
            if time.monotonic() - start > seconds:
                break
            done.append(evaluator.evaluate("fwd", cfg, pc, problems))
            print(f"  sequential {len(done):4d} {pc.name:26s} {cfg.short():60s} {done[-1].status}", flush=True)
    finally:
        evaluator.close()
    wall = time.monotonic() - start
    return done, _tally(done, wall, sampler.stop(), None)


def run_pipelined(todo: list, settings, target, seconds: float, compile_jobs: int, max_batch: int, cache_dir: Path) -> tuple[list, dict]:
    from search.gpu_pipeline import PipelinedGpuEvaluator

    evaluator = PipelinedGpuEvaluator(target, compile_jobs, cache_dir=cache_dir, settings=settings, max_batch=max_batch)
    sampler, start, done, lock = UtilizationSampler(), time.monotonic(), [], threading.Lock()

    def one(item):
        cfg, pc, problems = item
        if time.monotonic() - start > seconds:
            return
        m = evaluator.evaluate("fwd", cfg, pc, problems)
        with lock:
            done.append(m)
            print(f"  pipelined  {len(done):4d} {pc.name:26s} {cfg.short():60s} {m.status}", flush=True)

    try:
        with ThreadPoolExecutor(compile_jobs + 2) as slots:  # trials in flight: compiling, ready, on the GPU
            list(slots.map(one, todo))
        wall = time.monotonic() - start
        stats = evaluator.pipeline.stats
        waited = sum(e - s for s, e in stats.waits) / wall if wall else None
    finally:
        evaluator.close()
    return done, _tally(done, wall, sampler.stop(), waited)


def _agreement(by_mode: dict) -> str:
    """Median TFLOPS ratio pipelined/sequential over (config, problem) measured ok by both (a loaded kernel must match)."""
    if set(by_mode) != {"sequential", "pipelined"}:
        return ""
    seq = {(json.dumps(m.config, sort_keys=True), r.problem): r.tflops for m in by_mode["sequential"] for r in m.results if r.status == "ok"}
    ratios = [r.tflops / seq[k] for m in by_mode["pipelined"] for r in m.results
              if r.status == "ok" and (k := (json.dumps(m.config, sort_keys=True), r.problem)) in seq and seq[k]]
    return f"same (config, problem) ok in both modes: {len(ratios)}, median TFLOPS pipelined/sequential {statistics.median(ratios):.3f}" if ratios else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="standard")
    parser.add_argument("--modes", nargs="+", default=["sequential", "pipelined"], choices=["sequential", "pipelined"])
    parser.add_argument("--seconds", type=float, default=240.0, help="time per mode before it stops taking candidates")
    parser.add_argument("--compile-jobs", type=int, default=8)
    parser.add_argument("--max-batch", type=int, default=8, help="ready candidates per harness child")
    parser.add_argument("--cache", type=Path, default=None, help="kernel cache (default: a fresh temporary one, so compiles count)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--input-sets", type=int, default=2)
    parser.add_argument("--gate-random-problems", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="JSON lines: one record per evaluated candidate and mode")
    args = parser.parse_args()

    import prepare
    from fa4tune import gpu

    target = get_target("sm120")
    info = gpu.read_device()
    settings = prepare.Settings(gate_seed=prepare.new_gate_seed(), rounds=args.rounds, input_sets=args.input_sets,
                                gate_random_problems=args.gate_random_problems)
    todo = candidates(args.suite, target, args.seed)
    print(f"device: {info.name} ({gpu.select_mode(info, target)} for {target.name}); suite {args.suite}: {len(todo)} candidates; "
          f"settings {settings.to_dict()}; {args.seconds:.0f} s per mode; compile jobs {args.compile_jobs}, batch {args.max_batch}", flush=True)
    cache_dir = args.cache or Path(tempfile.mkdtemp(prefix="fa4tune-kernels-"))
    rows, by_mode = {}, {}
    for mode in args.modes:
        print(f"{mode}:", flush=True)
        if mode == "sequential":
            by_mode[mode], rows[mode] = run_sequential(todo, settings, target, args.seconds, cache_dir)
        else:
            by_mode[mode], rows[mode] = run_pipelined(todo, settings, target, args.seconds, args.compile_jobs, args.max_batch, cache_dir)
        if args.out:
            with open(args.out, "a") as f:
                for m in by_mode[mode]:
                    f.write(json.dumps({"mode": mode, **m.to_dict()}) + "\n")
    if args.cache is None:
        shutil.rmtree(cache_dir, ignore_errors=True)

    def pct(x):
        return "n/a" if x is None else f"{100 * x:.0f} %"

    print()
    print("| mode | candidates | checked (config, problem) | ok | incorrect | ended in compile stage | crash/timeout | seconds | checked per GPU-hour | GPU idle (nvidia-smi) | consumer waiting |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mode, r in rows.items():
        print(f"| {mode} | {r['candidates']} | {r['checked']} | {r['ok']} | {r['incorrect']} | {r['compile_stage']} | {r['crash_or_timeout']} | "
              f"{r['seconds']:.0f} | {r['per_gpu_hour']:.0f} | {pct(r['gpu_idle_share'])} | {pct(r['consumer_wait_share'])} |")
    if line := _agreement(by_mode):
        print(line)
    for mode, r in rows.items():
        print(f"throughput_{mode}: {r['per_gpu_hour']:.0f}")


if __name__ == "__main__":
    main()
