"""The longest-first TMA class's d128 GQA 4 causal entry (64x64, 128 threads, Q in registers) compiled in bf16 and
fp16 for an arch (sm_90a: what the H100/H200 emulation runs; sm_120a), its static facts printed and each cubin kept
in /tmp/p90 for cuobjdump -sass. Record: docs/measurements/2026-12-05-h100-models-and-wide-tables.md.

    uv run python docs/measurements/data/2026-12-05-fp16-bf16-lpt-static.py sm_90a
"""
import json, os, sys
arch = sys.argv[1]
os.environ.update(FLASH_ATTENTION_ARCH="sm_120", CUTE_DSL_ARCH=arch, FLASH_ATTENTION_NUM_SMS="132",
                  CUTE_DSL_KEEP="cubin,ptx", PYTHONWARNINGS="ignore", CUTE_DSL_DUMP_DIR=f"/tmp/p90/{arch}")
os.makedirs(os.environ["CUTE_DSL_DUMP_DIR"], exist_ok=True)
sys.path.insert(0, os.getcwd())
from fa4tune.static_worker import compile_job
import fa4tune.fake_compile as fc
_orig = fc._read_cubin
SAVED = []
def _keep(fn):
    SAVED.append(getattr(fn, "__cubin__", None))
    return _orig(fn)
fc._read_cubin = _keep
cfg = {"tile_m": 64, "tile_n": 64, "num_threads": 128, "num_stages": 1, "Q_in_regs": True, "kernel": "sm120_tma_lpt"}
from fa4tune.config import ForwardConfig
for dtype in ("bf16", "fp16"):
    from fa4tune.config import ProblemClass
    pcs = ProblemClass.parse(f"d128-causal-gqa4-{dtype}").to_dict()
    r = compile_job({"kind": "fwd", "config": ForwardConfig(**cfg).to_dict(), "problem_class": pcs, "experiment_path": "experiment.py"})
    if SAVED and SAVED[-1]:
        open(f"/tmp/p90/{arch}-{dtype}.cubin", "wb").write(SAVED[-1])
    print(arch, dtype, r["status"], json.dumps(r.get("kernel"))[:400], r.get("reason", "")[:200])
