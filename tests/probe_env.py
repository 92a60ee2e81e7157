"""The environment of a compile probe (a subprocess of the tests): the DSL reads its arch from the
environment when it is imported, so a probe imports this module first.

sm_120a (or PROBE_ARCH) with fake tensors, PTX kept under the dump folder given as the probe's first argument, warnings
off, and the project root importable (experiment.py, fa4tune/).
"""

import os
import sys
import warnings
from pathlib import Path

# PROBE_ARCH: another arch to compile the SM120 code for (an H200 emulating SM120 compiles it for sm_90a)
os.environ.update(FLASH_ATTENTION_ARCH="sm_120", CUTE_DSL_ARCH=os.environ.get("PROBE_ARCH", "sm_120a"),
                  FLASH_ATTENTION_NUM_SMS="170", CUTE_DSL_KEEP="ptx")
dump = Path(sys.argv[1])
dump.mkdir(parents=True, exist_ok=True)
os.environ["CUTE_DSL_DUMP_DIR"] = str(dump)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
warnings.filterwarnings("ignore")
