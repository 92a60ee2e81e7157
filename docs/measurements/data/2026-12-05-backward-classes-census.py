"""The backward configs a fixing class opens, compiled for sm_120a (registers, spills, shared memory): every config of
the backward domain that the class accepts and upstream's class refuses. Record:
docs/measurements/2026-12-05-backward-classes-static.md.

    uv run python docs/measurements/data/2026-12-05-backward-classes-census.py sm120_vregs d128-noncausal-bf16 --threads 256
    uv run python docs/measurements/data/2026-12-05-backward-classes-census.py sm120_cmask d128-causal-bf16
"""
import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from fa4tune.config import BackwardConfig, ProblemClass  # noqa: E402
from fa4tune.feasibility import check_backward  # noqa: E402
from fa4tune.harness.candidates import load_default_experiment  # noqa: E402
from fa4tune.space import BACKWARD_DOMAIN, _product  # noqa: E402
from fa4tune.static_check import StaticJob, run_static  # noqa: E402
from fa4tune.targets import get_target  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("kernel")
    parser.add_argument("problem_class")
    parser.add_argument("--threads", type=int, default=0, help="only this num_threads (0: all)")
    args = parser.parse_args()
    experiment = load_default_experiment()
    target, pc = get_target("sm120"), ProblemClass.parse(args.problem_class)
    fixes = experiment.kernel_class(BackwardConfig(kernel=args.kernel)).fixes
    opened = []
    for values in _product(BACKWARD_DOMAIN):
        upstream = BackwardConfig(**values)
        ours = replace(upstream, kernel=args.kernel)
        if not check_backward(upstream, pc, target) and check_backward(ours, pc, target) and args.threads in (0, ours.num_threads):
            opened.append(ours)
    start = time.time()
    facts = run_static([StaticJob("bwd", c, pc) for c in opened], target, "experiment.py", workers=2)
    ok = [f for f in facts if f.ok]
    print(f"{args.kernel} (fixes {sorted(fixes)}) on {pc.name}: {len(opened)} configs upstream's class refuses, "
          f"compiled in {time.time() - start:.0f} s; {len(ok)} ok, {sum(f.spill_store_bytes == 0 for f in ok)} without spills")
    for f in sorted(facts, key=lambda f: (f.spill_store_bytes, f.registers)):
        c = f.config
        print(f"  {c['m_block_size']}x{c['n_block_size']} Q{c['num_stages_Q']} dO{c['num_stages_dO']} t{c['num_threads']} "
              f"swap {int(c['SdP_swapAB'])}{int(c['dKV_swapAB'])}{int(c['dQ_swapAB'])} atoms {c['AtomLayoutMSdP']}"
              f"{c['AtomLayoutNdKV']}{c['AtomLayoutMdQ']} V_in_regs {int(c['V_in_regs'])}: {f.status} registers "
              f"{f.registers} spill stores {f.spill_store_bytes} B shared {f.dynamic_smem_bytes} B {f.reason[:80]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
