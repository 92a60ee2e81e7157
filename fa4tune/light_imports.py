"""quack (a flash-attn-4 dependency) imported without its package __init__'s eager kernels.

quack 0.6.5's `__init__` imports quack.dsl (it patches CuTe's tensor indexing, which flash-attn-4's kernels use),
then rmsnorm, softmax and cross_entropy, whose autotuner pulls in torch._dynamo: about 4 s of a 10 s
`import flash_attn.cute`, in every process that compiles a kernel (each search worker, compile process and probe),
for kernels flash-attn-4 never calls. `install()` registers the package and an import hook that runs its side
effects (quack.dsl, the ptxas patch under CUTE_DSL_PTXAS_PATH) at the first import of a quack module, as quack's
own __init__ would, so that importing fa4tune imports neither torch nor the CuTe DSL; the four top-level names
resolve on first use, so `quack.rmsnorm` and `from quack import softmax` still work. Any other quack version is
imported as it is.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.metadata
import importlib.util
import os
import sys

READ_VERSION = "0.6.5"  # the __init__ this mirrors
LAZY = {"rmsnorm": "quack.rmsnorm", "softmax": "quack.softmax", "cross_entropy": "quack.cross_entropy",
        "RoundingMode": "quack.rounding"}


class _FirstQuackImport(importlib.abc.MetaPathFinder):
    """Runs quack's package side effects before the first quack module is found, then steps aside."""

    def __init__(self):
        self.done = False

    def find_spec(self, fullname, path=None, target=None):
        if self.done or not fullname.startswith("quack."):
            return None
        self.done = True
        sys.meta_path.remove(self)
        importlib.import_module("quack.dsl")  # CuTe tensor indexing, which flash-attn-4's kernels use
        if os.environ.get("CUTE_DSL_PTXAS_PATH") is not None:
            importlib.import_module("quack.dsl.cute_dsl_ptxas").patch()
        return None  # the regular finders find `fullname`


def install() -> bool:
    """Register the light quack package unless quack is already imported, absent or another version; True if so."""
    if "quack" in sys.modules:
        return False
    try:
        version = importlib.metadata.version("quack-kernels")
    except importlib.metadata.PackageNotFoundError:
        return False
    spec = importlib.util.find_spec("quack")
    if version != READ_VERSION or spec is None or spec.submodule_search_locations is None:
        return False
    module = importlib.util.module_from_spec(spec)
    module.__version__ = version
    module.__all__ = list(LAZY)

    def __getattr__(name):
        if name in LAZY:
            value = getattr(importlib.import_module(LAZY[name]), name)
            setattr(module, name, value)
            return value
        raise AttributeError(f"module 'quack' has no attribute {name!r}")

    module.__getattr__ = __getattr__
    sys.modules["quack"] = module
    sys.meta_path.insert(0, _FirstQuackImport())
    return True
