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
        "                  'indexing': 'quack.dsl.cute_tensor_indexing' in sys.modules}))\n")
    assert seen == {"dynamo": False, "version": "0.6.5", "softmax": "quack.softmax", "indexing": True}


def test_another_quack_version_or_an_imported_quack_is_left_as_it_is(monkeypatch):
    from fa4tune import light_imports

    assert "quack" in sys.modules and not light_imports.install()  # already imported: left alone
    monkeypatch.delitem(sys.modules, "quack")  # put back by monkeypatch
    monkeypatch.setattr(light_imports, "READ_VERSION", "0.0.0")
    hooks = list(sys.meta_path)
    assert not light_imports.install()  # another version: its own __init__ will run
    assert "quack" not in sys.modules and sys.meta_path == hooks
