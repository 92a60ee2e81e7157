"""Seconds per config: a fresh harness child per evaluation vs one step server kept for the run; and a real
device fault (an illegal address) in the server's child between two configs.

    python3 bench/step_server.py [--suite standard] [--problem-class d128-causal-bf16] [--configs 3]

For the first --configs feasible forward configs of a problem class (fixed shuffled order), each evaluated on
the suite's problems of that class with the harness's settings (gate, then timing): once through
fa4tune.harness.evaluation.evaluate_isolated with no server (one child per config: torch, the CuTe DSL and a CUDA context each
time), once through one StepServer. Then, on that server: the first config with a give-up threshold of half
its median (it must be `pruned`), and three steps: a config, a kernel that writes to an unmapped address,
the config again (the fault must be that step's crash, the child replaced, the last config's rate as the
first's). Prints a table; record the output in docs/measurements/.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def illegal_address_candidate():
    """A candidate whose kernel stores to an unmapped address: a sticky CUDA error (illegal address)."""
    import torch
    import triton
    import triton.language as tl

    from fa4tune.harness import candidates

    @triton.jit
    def store_far(ptr):
        tl.store(ptr + (1 << 40), 1.0)

    def forward(q, k, v, causal):
        out = torch.empty_like(q)
        store_far[(1,)](out)
        torch.cuda.synchronize()
        return out, None

    return candidates.Candidate("illegal address", forward, {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="standard")
    parser.add_argument("--problem-class", default="d128-causal-bf16")
    parser.add_argument("--configs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="JSON lines: one record per evaluation")
    args = parser.parse_args()

    from fa4tune.harness import candidates, evaluation, gpu
    from fa4tune.harness.settings import EXPERIMENT_PATH, Settings, new_gate_seed
    from fa4tune.harness.steps import Step
    from fa4tune.space import feasible_forward
    from fa4tune.suites import load_suite
    from fa4tune.targets import get_target

    target = get_target("sm120")
    info = gpu.read_device()
    mode = gpu.select_mode(info, target)
    problems = [p for p in load_suite(args.suite) if p.problem_class.name == args.problem_class]
    if not problems:
        sys.exit(f"error: problem_class: no problem of suite {args.suite!r} is of class {args.problem_class!r}")
    configs = feasible_forward(problems[0].problem_class, target)
    random.Random(f"{args.seed}:{args.problem_class}").shuffle(configs)
    configs = configs[: args.configs]
    settings = Settings(gate_seed=new_gate_seed())
    print(f"device: {info.name} ({mode} for {target.name}); class {args.problem_class}: {len(problems)} problems "
          f"({', '.join(p.label for p in problems)}); {len(configs)} configs; settings {settings.to_dict()}", flush=True)
    records = []

    def evaluate(way: str, cfg, server=None, give_up_ms=None):
        start = time.monotonic()
        m = evaluation.evaluate_isolated("fwd", cfg, problems, target=target, settings=settings, server=server, give_up_ms=give_up_ms)
        seconds = time.monotonic() - start
        records.append({"way": way, "seconds": seconds, **m.to_dict()})
        rates = " ".join(f"{r.status}:{r.tflops or 0:.1f}" for r in m.results)
        print(f"  {way:22s} {seconds:7.1f} s  {cfg.short():55s} {rates}", flush=True)
        return m, seconds

    print("fresh child per config:", flush=True)
    fresh = [evaluate("fresh child", cfg) for cfg in configs]
    print("one step server:", flush=True)
    with evaluation.new_step_server(env=gpu.kernel_env(info, target, mode)) as server:
        kept = [evaluate("step server", cfg, server) for cfg in configs]
        first, _ = fresh[0]
        give_up = {r.problem: r.ms_median / 2 for r in first.results if r.ms_median}
        pruned, _ = evaluate("server, give-up 1/2", configs[0], server, give_up)
        pids_before = list(server.pids)
        fwd, bwd = configs[0], candidates.load_experiment(EXPERIMENT_PATH).backward_config(problems[0].problem_class)
        spec = candidates.experiment_spec("config", EXPERIMENT_PATH, fwd, bwd)
        fault = {"name": "illegal address", "kind": "callable", "factory": "bench.step_server:illegal_address_candidate"}
        start = time.monotonic()
        three = [Step(problems[0], "fwd", [spec]), Step(problems[0], "fwd", [fault]), Step(problems[0], "fwd", [spec])]
        faulted = server.run_steps(three, settings)
        fault_seconds = time.monotonic() - start
        children = len(server.pids) - len(pids_before) + 1
    print("\n| way | config | seconds | results (status:TFLOPS per problem) |\n|---|---|---|---|")
    for (m, s), way in [(x, "fresh child") for x in fresh] + [(x, "step server") for x in kept]:
        print(f"| {way} | {m.config} | {s:.1f} | {' '.join(f'{r.status}:{r.tflops or 0:.1f}' for r in m.results)} |")
    ratios = [k.tflops / f.tflops for (fm, _), (km, _) in zip(fresh, kept) for f, k in zip(fm.results, km.results)
              if f.status == k.status == "ok" and f.tflops]
    print(f"\nseconds per config: fresh child {sum(s for _, s in fresh) / len(fresh):.1f}; step server first "
          f"{kept[0][1]:.1f}, later {sum(s for _, s in kept[1:]) / max(1, len(kept) - 1):.1f}")
    if ratios:
        print(f"TFLOPS step server / fresh child, same (config, problem): min {min(ratios):.3f} max {max(ratios):.3f}")
    print(f"give-up at half the fresh median: {[(r.status, r.reason) for r in pruned.results]}")
    print(f"fault: {fault_seconds:.1f} s for 3 steps, children used {children}:")
    for one in faulted:
        for name, r in one.items():
            print(f"  {name}: {r.status} {r.tflops or 0:.1f} TFLOPS {r.reason[:160]}")
    if args.out:
        with open(args.out, "w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
