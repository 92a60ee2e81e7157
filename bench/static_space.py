"""The static facts of a problem class's whole feasible forward space: every config the static rules accept, compiled
for sm_120a on the CPU (fake tensors), with its registers, spills, shared memory and CTAs per SM on the target.

    uv run python bench/static_space.py --problem-class d128-causal-gqa4-chunked-bf16 [--kernels sm120,sm120_tma]
        [--jobs 2] [--out FILE.jsonl] [--top 30]

What a sweep of the class on a GPU (`search run --sampler sweep`) will meet before it times anything: how many
configs compile, how many spill, and how many warps each keeps resident per SM. The facts go through
fa4tune.static_check.run_static, so they land in the facts cache (.cache/static-facts.jsonl) that `search run`'s
static stage reads: a later run on this machine skips these compiles. Prints a summary per kernel class, then
the `--top` configs by resident warps per SM (ties: fewer spilled bytes, then fewer registers: more headroom).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def label(config: dict) -> str:
    """e.g. 'sm120_tma 64x64 t128 s1 Qr' (and the class's own knobs)."""
    extra = " ".join(f"{k}={v}" for k, v in sorted(config.items())
                     if k not in ("kernel", "tile_m", "tile_n", "num_threads", "num_stages", "Q_in_regs"))
    text = f"{config['kernel']} {config['tile_m']}x{config['tile_n']} t{config['num_threads']} s{config['num_stages']}"
    return text + (" Qr" if config["Q_in_regs"] else "") + (f" {extra}" if extra else "")


def summary(facts) -> list[str]:
    """Per kernel class: configs, compiled ok, spilling, and the CTAs per SM they reach."""
    lines = ["| kernel | configs | ok | spill | not ok | CTAs per SM (ok ones: count) |", "|---|---|---|---|---|---|"]
    for kernel in sorted({f.config["kernel"] for f in facts}):
        mine = [f for f in facts if f.config["kernel"] == kernel]
        ok = [f for f in mine if f.ok]
        spill = sum(1 for f in ok if f.spill_store_bytes or f.spill_load_bytes)
        ctas = Counter(f.blocks_per_sm for f in ok)
        lines.append(f"| {kernel} | {len(mine)} | {len(ok)} | {spill} | {len(mine) - len(ok)} | "
                     f"{', '.join(f'{n}: {c}' for n, c in sorted(ctas.items())) or '-'} |")
    return lines


def top(facts, n: int) -> list[str]:
    """The n ok configs with the most resident warps per SM."""
    ok = [f for f in facts if f.ok]
    ok.sort(key=lambda f: (-f.blocks_per_sm * f.num_threads, f.spill_store_bytes + f.spill_load_bytes, f.registers))
    lines = ["| config | registers | spill B (st/ld) | smem B | CTAs/SM | warps/SM | limiter |", "|---|---|---|---|---|---|---|"]
    for f in ok[:n]:
        lines.append(f"| {label(f.config)} | {f.registers} | {f.spill_store_bytes}/{f.spill_load_bytes} | {f.smem_bytes} | "
                     f"{f.blocks_per_sm} | {f.blocks_per_sm * f.num_threads // 32} | {f.occupancy_limiter} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem-class", required=True, help="e.g. d128-causal-gqa4-chunked-bf16")
    parser.add_argument("--kernels", default="", help="comma-separated kernel classes (default: every one)")
    parser.add_argument("--target", default="sm120")
    parser.add_argument("--jobs", type=int, default=2, help="compiler processes")
    parser.add_argument("--out", type=Path, default=None, help="JSON lines: one StaticFacts per config")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)

    from fa4tune.config import ConfigError, ProblemClass
    from fa4tune.static_check import StaticJob, run_static
    from fa4tune.targets import get_target
    from search.space import get_space

    pc, target = ProblemClass.parse(args.problem_class), get_target(args.target)
    space = get_space("fwd").for_class(pc, target)
    configs = space.feasible(pc, target)
    known = sorted({c.kernel for c in configs})
    kernels = [k for k in args.kernels.split(",") if k]
    unknown = [k for k in kernels if k not in known]
    if unknown:
        raise ConfigError("kernels", f"--kernels names {unknown}, which have no feasible config of {pc.name} "
                                     f"(kernels with one: {', '.join(known)})")
    configs = [c for c in configs if not kernels or c.kernel in kernels]
    print(f"{pc.name} on {target.name}: {len(configs)} feasible configs ({', '.join(kernels) or 'every kernel class'}), "
          f"{args.jobs} compiler processes", flush=True)
    jobs = [StaticJob("fwd", c, pc) for c in configs]
    out = args.out.open("a") if args.out else None

    def on_result(job, facts) -> None:
        print(f"  {label(facts.config)}: {facts.status} {facts.registers} regs, spill {facts.spill_store_bytes} B, "
              f"{facts.blocks_per_sm} CTAs/SM{' (cached)' if facts.cached else ''}", flush=True)
        if out:
            out.write(json.dumps(facts.to_dict()) + "\n")
            out.flush()

    try:
        facts = run_static(jobs, target, ROOT / "experiment.py", workers=args.jobs, on_result=on_result)
    finally:
        if out:
            out.close()
    print("\n".join(["", *summary(facts), "", *top(facts, args.top)]))
    return 0


if __name__ == "__main__":
    from fa4tune.config import ConfigError

    try:
        sys.exit(main())
    except ConfigError as err:  # bad input: one line naming the rule and the value
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
