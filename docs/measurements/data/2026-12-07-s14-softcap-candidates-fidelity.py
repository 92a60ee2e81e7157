"""Fidelity of the soft-cap studies' leading forward configs (sm_120a vs sm_90a), CPU compiles: python3 docs/measurements/data/2026-12-07-s14-softcap-candidates-fidelity.py"""
import sys
sys.path.insert(0, ".")
from bench import fidelity
from bench.table_vs_upstream import cpu_compile_env
from fa4tune.harness.settings import EXPERIMENT_PATH
from fa4tune.config import ForwardConfig
from fa4tune.suites import load_suite
from fa4tune.targets import get_target

cands = [dict(tile_m=64, tile_n=32, num_threads=128, num_stages=1, Q_in_regs=True, kernel="sm120_tma_trimmed"),
         dict(tile_m=128, tile_n=32, num_threads=256, num_stages=1, Q_in_regs=False, kernel="sm120_tma_lpt"),
         dict(tile_m=64, tile_n=96, num_threads=128, num_stages=1, Q_in_regs=True, kernel="sm120_tma"),
         dict(tile_m=64, tile_n=64, num_threads=128, num_stages=1, Q_in_regs=True, kernel="sm120_tma"),
         dict(tile_m=64, tile_n=32, num_threads=128, num_stages=1, Q_in_regs=False, kernel="sm120_tma_trimmed"),
         dict(tile_m=64, tile_n=32, num_threads=128, num_stages=2, Q_in_regs=True, kernel="sm120_tma_trimmed")]
problems = [p for p in load_suite("models") if p.problem_class.name in ("d128-causal-gqa2-window-softcap-bf16", "d128-causal-gqa2-softcap-bf16")]
firsts = {}
for p in problems:
    firsts.setdefault(p.problem_class.name, p)
pairs = [("fwd", ForwardConfig(**c), p) for p in firsts.values() for c in cands]
facts = fidelity.gather(fidelity.jobs_of(pairs), get_target(), EXPERIMENT_PATH, 8, "sm_90a", cpu_compile_env("sm_90a"))
for kind, cfg, p in pairs:
    f = facts[fidelity.facts_key(kind, cfg, p.problem_class)]
    d = fidelity.disagreement(f["sm120a"], f["run"]) if f["sm120a"] and f["run"] else "missing"
    print(f"{p.problem_class.name:38s} {cfg.kernel:18s} {cfg.tile_m}x{cfg.tile_n} t{cfg.num_threads} s{cfg.num_stages} Qregs={cfg.Q_in_regs}: "
          f"{fidelity.describe(f['sm120a'])} | {fidelity.describe(f['run'])} -> {'FLAGGED: ' + d if d else 'agree'}")
