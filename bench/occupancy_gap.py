"""How many CTAs per SM each dispatch entry (and upstream's default) gets on the target, and on the GPU that emulates it.

    uv run python bench/occupancy_gap.py [--suite standard] [--device h200]

CPU only: the forward entries of the suite's problem classes and upstream's defaults are compiled for sm_120a
(fa4tune.static_check.run_static, cached), and their registers, threads and shared memory give the resident CTAs
per SM (fa4tune.occupancy) under the target's limits and under the emulating GPU's. Under emulation the kernels
run at the second figure; on the target at the first. Where the two differ between a table entry and the config it
is compared with, an emulated speedup may not carry over to the target.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Per-SM limits of the GPUs the project emulates on (CUDA C++ Programming Guide, compute capability 9.0 / 8.0).
DEVICES = {
    "h200": {"smem_per_sm": 233472, "max_threads_per_sm": 2048},
    "a100": {"smem_per_sm": 167936, "max_threads_per_sm": 2048},
}


def rows(jobs, facts, target, device) -> list[dict]:
    """One row per (job, facts): the config, its registers and shared memory, CTAs per SM on both (and limiter)."""
    from fa4tune.occupancy import occupancy

    out = []
    for job, f in zip(jobs, facts):
        if f.registers is None:  # it did not compile (or its cubin was not read): nothing to count
            out.append({"problem_class": job.problem_class, "config": job.config, "registers": None, "smem": None,
                        "target": (0, getattr(f, "status", "no facts")), "device": (0, getattr(f, "status", "no facts"))})
            continue
        smem = (f.dynamic_smem_bytes or 0) + (f.static_smem_bytes or 0)
        on_target = occupancy(target, job.config.num_threads, f.registers, smem)
        on_device = occupancy(device, job.config.num_threads, f.registers, smem)
        out.append({"problem_class": job.problem_class, "config": job.config, "registers": f.registers, "smem": smem,
                    "target": (on_target.blocks_per_sm, on_target.limiter), "device": (on_device.blocks_per_sm, on_device.limiter)})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="standard")
    parser.add_argument("--device", choices=sorted(DEVICES), default="h200")
    args = parser.parse_args(argv)

    import experiment
    from fa4tune import defaults
    from fa4tune.static_check import StaticJob, run_static
    from fa4tune.suites import load_suite
    from fa4tune.targets import get_target

    target = get_target()
    device = dataclasses.replace(target, **DEVICES[args.device])
    classes = list(dict.fromkeys(p.problem_class for p in load_suite(args.suite)))
    jobs = [StaticJob("fwd", config, pc) for pc in classes
            for config in dict.fromkeys((experiment.forward_config(pc), defaults.upstream_forward(pc)))]
    facts = run_static(jobs, target, str(ROOT / "experiment.py"))
    print(f"| class | config | regs | smem B | CTAs/SM on {target.name} (limiter) | on {args.device} (limiter) |")
    print("|---|---|---|---|---|---|")
    for row in rows(jobs, facts, target, device):
        c, pc = row["config"], row["problem_class"]
        upstream = defaults.upstream_forward(pc)
        which = ("table = upstream" if c == upstream else "table") if c == experiment.forward_config(pc) else "upstream"
        print(f"| {pc.name} | {which}: {c.kernel} {c.tile_m}x{c.tile_n} t{c.num_threads} s{c.num_stages}{' Q_in_regs' if c.Q_in_regs else ''} "
              f"| {row['registers']} | {row['smem']} | {row['target'][0]} ({row['target'][1]}) | {row['device'][0]} ({row['device'][1]}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
