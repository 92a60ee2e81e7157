"""fa4tune imports quack without its package __init__'s eager kernels (fa4tune/light_imports.py): flash-attn-4
imports as before, without torch._dynamo, and quack's own names still resolve."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_flash_attn_cute_imports_after_fa4tune_without_torch_dynamo_and_quack_s_names_resolve():
    seen = _run(
        "import json, sys\n"
        "import fa4tune\n"
        "import flash_attn.cute\n"
        "from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120\n"
        "dynamo = 'torch._dynamo' in sys.modules\n"
        "import quack\n"
        "from quack import softmax\n"
        "print(json.dumps({'dynamo': dynamo, 'version': quack.__version__, 'softmax': softmax.__module__,\n"
        "                  'rmsnorm': quack.rmsnorm.__module__, 'indexing': 'quack.dsl.cute_tensor_indexing' in sys.modules}))\n")
    assert seen == {"dynamo": False, "version": "0.6.5", "softmax": "quack.softmax", "rmsnorm": "quack.rmsnorm",
                    "indexing": True}


def test_another_quack_version_or_an_imported_quack_is_left_as_it_is():
    seen = _run(
        "import importlib.util, json, sys\n"
        "spec = importlib.util.spec_from_file_location('light', 'fa4tune/light_imports.py')\n"
        "light = importlib.util.module_from_spec(spec); spec.loader.exec_module(light)\n"
        "light.READ_VERSION = '0.0.0'\n"
        "other = light.install()\n"
        "import quack\n"
        "print(json.dumps({'other': other, 'again': light.install(), 'eager': 'quack.rmsnorm' in sys.modules}))\n")
    assert seen == {"other": False, "again": False, "eager": True}  # quack's own __init__ ran
