"""Exhaustive forward sweep on a GPU: every feasible config of each problem class, gated and timed by the harness.

    python3 bench/sweep.py --out DIR [--classes NAME ...] [--shards 8] [--time-budget 540]

One representative problem per class (the first of the class in the standard suite). Shards run in parallel
processes: each compiles its configs with fake tensors (CPU only, no launch) and then gates and times one config at
a time while holding an exclusive GPU lock, so compiles overlap timing but no two measurements share the GPU.
Each finished measurement is appended to DIR/sweep-<shard>.jsonl at once (a killed run loses nothing finished),
and configs already in DIR are skipped, so a sweep can be split over several calls. `--merge TABLE` writes the
replay table (search/evaluating/table.py format) from everything in DIR.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fa4tune.config import ForwardConfig, ProblemClass  # noqa: E402
from fa4tune.space import feasible_forward  # noqa: E402
from fa4tune.suites import load_suite, problem_classes  # noqa: E402
from fa4tune.targets import get_target  # noqa: E402


def representative_problems(suite: str = "standard") -> dict[str, object]:
    """Problem class name -> the first problem of that class in the suite."""
    problems = load_suite(suite)
    return {pc.name: next(p for p in problems if p.problem_class == pc) for pc in problem_classes(problems)}


def done_keys(out: Path) -> set[tuple]:
    """Configs measured, or started by a process that died before finishing them (never retried)."""
    keys = set()
    for path in out.glob("started-*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                name, config = json.loads(line)
            except json.JSONDecodeError:
                continue
            keys.add((name, ForwardConfig.from_dict(config).key()))
    for path in out.glob("sweep-*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                m = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line of a killed shard
            keys.add((m["problem_class"], ForwardConfig.from_dict(m["config"]).key()))
    return keys


def all_jobs(classes: list[str], out: Path) -> list[tuple[str, dict]]:
    target = get_target()
    done = done_keys(out)
    jobs = []
    for name in classes:
        for cfg in feasible_forward(ProblemClass.parse(name), target):
            if os.environ.get("SWEEP_KERNELS") and cfg.kernel not in os.environ["SWEEP_KERNELS"].split(","):
                continue
            if (name, cfg.key()) not in done:
                jobs.append((name, cfg.to_dict()))
    return jobs


@contextmanager
def gpu_lock(path: Path):
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_shard(shard: int, shards: int, classes: list[str], out: Path, deadline: float) -> None:
    """Compile this shard's configs without launching, then measure each under the GPU lock."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH as _EXPERIMENT

    experiment = load_experiment(_EXPERIMENT)  # the static rules and the pin first (guards.admit), as every measuring path
    from fa4tune.harness import evaluation
    from fa4tune.harness.settings import Settings

    reps = representative_problems()
    jobs = all_jobs(classes, out)[shard::shards]
    settings = Settings(gate_seed=1234 + shard, rounds=6, input_sets=2, gate_random_problems=1)
    sink = open(out / f"sweep-{shard}.jsonl", "a")
    started = open(out / f"started-{shard}.jsonl", "a")
    for name, config in jobs:
        if time.time() > deadline:
            print(f"shard {shard}: time budget reached, {name} {config} left for the next call", flush=True)
            break
        cfg = ForwardConfig.from_dict(config)
        problem = reps[name]
        try:  # compile only: fake tensors skip the launch, the kernel lands in the host's compile cache
            with FakeTensorMode():
                q = torch.empty(1, 256, problem.num_heads, problem.head_dim, dtype=torch.bfloat16, device="cuda")
                kv = torch.empty(1, 256, problem.num_heads_kv, problem.head_dim, dtype=torch.bfloat16, device="cuda")
                experiment.attention(q, kv, kv, causal=problem.causal, fwd_config=cfg)
        except Exception as err:  # the harness records the compile error as the config's result
            print(f"shard {shard}: compile of {name} {cfg.short()} failed: {type(err).__name__}", flush=True)
        started.write(json.dumps([name, config]) + "\n")
        started.flush()
        with gpu_lock(out / "gpu.lock"):
            m = evaluation.evaluate("fwd", cfg, [problem], experiment, settings=settings)
        sink.write(json.dumps(m.to_dict()) + "\n")
        sink.flush()
        r = m.results[0]
        print(f"shard {shard}: {name:26s} {cfg.short():70s} {r.status:10s} {r.tflops or 0:7.1f} TFLOPS", flush=True)
        if r.status == "crash":  # this process's CUDA context may be gone: stop; the next call goes on
            break


def merge(out: Path, table: Path, command: str) -> None:
    measurements = []
    seen = set()
    for path in sorted(out.glob("sweep-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                m = json.loads(line)
            except json.JSONDecodeError:
                continue
            key = (m["problem_class"], ForwardConfig.from_dict(m["config"]).key())
            if key not in seen:
                seen.add(key)
                measurements.append(m)
    for path in sorted(out.glob("started-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                name, config = json.loads(line)
            except json.JSONDecodeError:
                continue
            key = (name, ForwardConfig.from_dict(config).key())
            if key not in seen:  # started, never finished: the process died on it
                seen.add(key)
                measurements.append({
                    "kind": "fwd", "problem_class": name, "config": config, "target": "sm120", "device": "", "mode": "",
                    "evaluator": "gpu", "static": {}, "results": [{"problem": "", "direction": "fwd", "status": "crash",
                    "reason": "the sweep process died while measuring this config"}],
                })
    first = next((m for m in measurements if m.get("device")), {})
    reps = representative_problems()
    meta = {
        "format": "fa4tune-replay-table/1", "synthetic": False, "device": first.get("device", ""),
        "mode": first.get("mode", ""), "target": first.get("target", "sm120"), "command": command,
        "date": date.today().isoformat(),
        "note": "SM120 kernels emulated on NVIDIA H200 when mode is 'emulated'; one representative problem per class, "
                "harness settings rounds=6 input_sets=2 gate_random_problems=1",
        "problems": [p.to_dict() for p in reps.values()],
        "measurements": measurements,
    }
    table.parent.mkdir(parents=True, exist_ok=True)
    table.write_text(json.dumps(meta, indent=1))
    print(f"wrote {table}: {len(measurements)} measurements")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--classes", nargs="*", default=None)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--time-budget", type=float, default=540.0, help="seconds before shards stop taking configs")
    parser.add_argument("--shard", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--merge", type=Path, default=None, help="write the replay table from DIR and exit")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    classes = args.classes or list(representative_problems())
    if args.merge:
        merge(args.out, args.merge, "python3 bench/sweep.py --out DIR (see docs/measurements)")
        return
    if args.shard is not None:
        run_shard(args.shard, args.shards, classes, args.out, args.deadline)
        return
    from fa4tune.harness import gpu

    info = gpu.read_device()
    target = get_target()
    # native on SM120, else emulated (FLASH_ATTENTION_ARCH / FLASH_ATTENTION_NUM_SMS); the shards inherit it
    os.environ.update(gpu.kernel_env(info, target, gpu.select_mode(info, target)))
    deadline = time.time() + args.time_budget
    todo = all_jobs(classes, args.out)
    print(f"{len(todo)} configs to measure over {len(classes)} classes, {args.shards} shards", flush=True)
    procs = [
        subprocess.Popen([sys.executable, __file__, "--out", str(args.out), "--shards", str(args.shards), "--shard", str(i),
                          "--deadline", str(deadline), "--classes", *classes])
        for i in range(args.shards)
    ]
    for p in procs:
        p.wait()
    print(f"left: {len(all_jobs(classes, args.out))} configs", flush=True)


if __name__ == "__main__":
    main()
