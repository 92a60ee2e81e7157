"""One config of the fp16 / bf16 SASS comparison compiled for sm_120a, its cubin and PTX kept (a fresh process each):
    uv run python docs/measurements/data/2026-12-06-fp16-sass/compile_one.py A|B|U bf16|fp16 [OUT_DIR]
then `cuobjdump -sass` on the cubin and count.py / loops2.py on the SASS (paths inside them: /tmp/fp16diff)."""
import os, sys, shutil
from pathlib import Path
ROOT = str(Path(__file__).resolve().parents[4])
name, dtype = sys.argv[1], sys.argv[2]
out = Path(sys.argv[3] if len(sys.argv) > 3 else "/tmp/fp16diff"); dump = out / f"dump_{name}_{dtype}"
shutil.rmtree(dump, ignore_errors=True); dump.mkdir()
os.environ.update(FLASH_ATTENTION_ARCH="sm_120", CUTE_DSL_ARCH="sm_120a", FLASH_ATTENTION_NUM_SMS="132",
                  CUTE_DSL_KEEP="cubin,ptx", CUTE_DSL_DUMP_DIR=str(dump), PYTHONWARNINGS="ignore")
os.environ.pop("FA4TUNE_KERNEL_CACHE", None)
sys.path.insert(0, ROOT)
from fa4tune.harness.candidates import load_experiment
exp = load_experiment(ROOT + "/experiment.py")
from fa4tune import fake_compile
from fa4tune.config import ForwardConfig, Problem
fake_compile._clear_dumps = lambda: None
CFG = {
 "A": ForwardConfig(tile_m=64, tile_n=64, num_threads=128, num_stages=1, Q_in_regs=True, kernel="sm120_tma_lpt"),
 "B": ForwardConfig(tile_m=64, tile_n=64, num_threads=128, num_stages=1, Q_in_regs=True, kernel="sm120_tma_trimmed"),
 "U": ForwardConfig(tile_m=128, tile_n=64, num_threads=128, num_stages=1, Q_in_regs=False),
}
facts = fake_compile.compile_shapes(exp, "fwd", CFG[name], [Problem(1, 4096, 4096, 32, 8, 128, 128, True, dtype)])
print("FACTS", name, dtype, facts)
for p in dump.glob("*"):
    print("FILE", p.name[:120], p.stat().st_size)
