"""Scratch: one fwd build on sm_120a (or sm_90a) with cubin/ptx kept.
  uv run python docs/measurements/data/2026-12-06-sm90-schedule/compile_one.py KERNEL DTYPE H HKV [ARCH] [--scratch]
KERNEL: tma|lpt|paired|trimmed. --scratch: tags the build "opaque-$SCRATCH_OPAQUE"; run it with
docs/measurements/data/2026-12-06-opaque-bf16.patch applied (opaque_i32 in bf16 too)."""
import os, sys, shutil, subprocess
from pathlib import Path
ROOT = str(Path(__file__).resolve().parents[4])  # the repository
args = [a for a in sys.argv[1:] if not a.startswith("--")]
opaque_all = "--scratch" in sys.argv
kern, dtype, h, hkv = args[0], args[1], int(args[2]), int(args[3])
arch = args[4] if len(args) > 4 else "sm_120a"
tag = f"{kern}_{dtype}_h{h}-{hkv}_{arch}" + (f"_opaque-{os.environ.get('SCRATCH_OPAQUE', 'default')}" if opaque_all else "")
out = Path(os.environ.get("SCHEDULE_BUILDS", "/tmp/sm90-schedule/builds")); dump = out / f"dump_{tag}"
shutil.rmtree(dump, ignore_errors=True); dump.mkdir(parents=True)
os.environ.update(FLASH_ATTENTION_ARCH="sm_120", CUTE_DSL_ARCH=arch, FLASH_ATTENTION_NUM_SMS="132",
                  CUTE_DSL_KEEP="cubin,ptx", CUTE_DSL_DUMP_DIR=str(dump), PYTHONWARNINGS="ignore")
os.environ.pop("FA4TUNE_KERNEL_CACHE", None)
sys.path.insert(0, ROOT)
import kernels, kernels.tma_forward_sm120 as tf
print("KERNELS FROM", kernels.__file__)
orig_init = tf.TmaForwardSm120.__init__
def init(self, *a, **kw):
    orig_init(self, *a, **kw)
    print("CTOR", type(self).__name__, "dtype", self.dtype, "pack_gqa", getattr(self, "pack_gqa", None),
          "qhead_per_kvhead", getattr(self, "qhead_per_kvhead", None), "tile", self.tile_m, self.tile_n, flush=True)
tf.TmaForwardSm120.__init__ = init
from fa4tune.harness.candidates import load_experiment
exp = load_experiment(ROOT + "/experiment.py")
from fa4tune import fake_compile
from fa4tune.config import ForwardConfig, Problem
fake_compile._clear_dumps = lambda: None
cfg = ForwardConfig(tile_m=64, tile_n=64, num_threads=128, num_stages=1, Q_in_regs=True, kernel="sm120_tma" if kern == "tma" else f"sm120_tma_{kern}")
facts = fake_compile.compile_shapes(exp, "fwd", cfg, [Problem(1, 4096, 4096, h, hkv, 128, 128, True, dtype)])
print("FACTS", tag, facts)
from fa4tune.cubin import tool_path
cubins = sorted(dump.glob("*.cubin")); ptxs = sorted(dump.glob("*.ptx"))
assert len(cubins) == 1, cubins
shutil.copy(cubins[0], out / f"{tag}.cubin"); shutil.copy(ptxs[0], out / f"{tag}.ptx")
sass = subprocess.run([str(tool_path("cuobjdump")), "-sass", str(cubins[0])], capture_output=True, text=True, check=True).stdout
(out / f"{tag}.sass").write_text(sass)
shutil.rmtree(dump)
print("WROTE", out / f"{tag}.sass")
