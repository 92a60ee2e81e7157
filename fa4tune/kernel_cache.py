"""Compiled kernels on disk, so that a kernel compiled in a CPU process is loaded, not recompiled, by the GPU process.

CuTe-DSL compiled functions cannot be pickled, but the DSL exports one as an object file
(`JitCompiledFunction.export_to_c`, TVM-FFI ABI) and loads it back (`cute.runtime.load_module`): the
mechanism of upstream's `JITPersistentCache` (flash_attn/cute/cache_utils.py), which our patched host path
does not use (it keeps its own `CompileCache`, defined here: the in-memory cache, and `DiskCompileCache` on it). Both work on a CPU machine with fake tensors.

Enabled by FA4TUNE_KERNEL_CACHE=DIR (search.evaluating.pipeline sets it for its compilers and the GPU process).
An entry is DIR/<fingerprint>/<sha256 of the pickled compile key>.o. The compile key leads with every knob
of the config and the kernel class (fa4tune.sm120_interface) and holds every decision of the host path
(dtype, head dims, GQA packing, causal, ...). The fingerprint covers what the key does not: the
flash-attn-4 sources (flash_attn/cute/*.py), the kernel classes' modules (experiment.py, kernels/ and the
protocol, fa4tune.kernel_class), the patched host path, the CUTLASS DSL and Python versions, the compile arch and the SM120 emulation settings.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys
from pathlib import Path
from typing import Callable

from fa4tune import emulated_occupancy
from fa4tune.emulated_occupancy import compile_arch, device_arch  # noqa: F401  (named here too: the arch of a cache entry)

ENV = "FA4TUNE_KERNEL_CACHE"
EXPORT_NAME = "func"
# Variables that change what the DSL compiles for (read when the kernels are built).
ARCH_VARIABLES = ("FLASH_ATTENTION_ARCH", "FLASH_ATTENTION_NUM_SMS")


def fingerprint(kernel_module_file: str, arch: str) -> str:
    """A short hash of everything a compiled kernel depends on besides its compile key."""
    import cutlass
    import flash_attn.cute

    h = hashlib.sha256()
    h.update(f"py{sys.version_info.major}.{sys.version_info.minor} cutlass={cutlass.__version__} arch={arch}".encode())
    for name in ARCH_VARIABLES:
        h.update(f"{name}={os.environ.get(name, '')}".encode())
    h.update(f"padded_occupancy={emulated_occupancy.requested()}".encode())  # the launch's shared memory
    cute_root = Path(flash_attn.cute.__file__).resolve().parent
    from fa4tune.kernel_class import source_files

    sources = sorted(cute_root.rglob("*.py")) + [Path(kernel_module_file), Path(__file__).with_name("sm120_interface.py"), Path(__file__).with_name("emulated_occupancy.py"), *source_files()]
    for source in sources:
        content = source.read_bytes()
        h.update(source.name.encode() + len(content).to_bytes(8, "little") + content)
    return h.hexdigest()[:24]


class CompileCache(dict):
    """Compiled kernels by full key; `listeners` see each new compile (the static check reads cubins)."""

    def __init__(self):
        super().__init__()
        self.listeners: list[Callable[[tuple, object], None]] = []

    def __setitem__(self, key, fn):
        super().__setitem__(key, fn)
        for listener in list(self.listeners):
            listener(key, fn)


def entry_name(key: tuple) -> str:
    """The file name of a compile key's entry."""
    return hashlib.sha256(pickle.dumps(key)).hexdigest() + ".o"


class DiskCompileCache(CompileCache):
    """A CompileCache that exports each new compile to DIR and loads entries it does not hold from there.

    `compiled`, `loaded` and `used` (keys, in order) say what happened in this process. A load that fails
    (a torn or foreign file) counts as a miss: the kernel is compiled and the entry rewritten. Next to an
    entry, `<entry>.json` may hold the kernel's facts (fa4tune.fake_compile writes them when it compiles the
    kernel: a loaded kernel cannot be traced again for its shared-storage size).
    """

    def __init__(self, directory: Path):
        super().__init__()
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.compiled = 0
        self.loaded = 0
        self.used: list = []

    def __contains__(self, key) -> bool:
        found = dict.__contains__(self, key) or self._load(key)
        if found:
            self.used.append(key)
        return found

    def __getitem__(self, key):
        if not dict.__contains__(self, key):
            self._load(key)
        return dict.__getitem__(self, key)

    def __setitem__(self, key, fn) -> None:
        super().__setitem__(key, fn)  # listeners (the static check) see real compiles only
        self.compiled += 1
        self.used.append(key)
        self._export(key, fn)

    def write_facts(self, key, facts: dict) -> None:
        """Stores a kernel's static facts next to its entry."""
        path = self.directory / (entry_name(key) + ".json")
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(facts))
        os.replace(tmp, path)

    def read_facts(self, key) -> dict | None:
        """The static facts stored next to an entry, or None."""
        path = self.directory / (entry_name(key) + ".json")
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None

    def _load(self, key) -> bool:
        path = self.directory / entry_name(key)
        if not path.exists():
            return False
        import cutlass.cute as cute
        import flash_attn.cute.cache_utils  # noqa: F401  (loads the DSL runtime with RTLD_GLOBAL, as loading needs)

        try:
            fn = getattr(cute.runtime.load_module(str(path), enable_tvm_ffi=True), EXPORT_NAME)
        except Exception:
            path.unlink(missing_ok=True)  # entries are renamed into place whole: this one is foreign or damaged
            return False
        dict.__setitem__(self, key, fn)
        self.loaded += 1
        return True

    def _export(self, key, fn) -> None:
        path = self.directory / entry_name(key)
        if path.exists():
            return
        # a temporary name, then rename: a reader never sees a half-written entry
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.o")
        try:
            fn.export_to_c(object_file_path=str(tmp), function_name=EXPORT_NAME)
            os.replace(tmp, path)
        except Exception:
            tmp.unlink(missing_ok=True)  # an export that fails costs the GPU process a compile, nothing else


def new_cache(class_for) -> CompileCache:
    """The host path's compile cache: on disk under $FA4TUNE_KERNEL_CACHE when set, else in memory."""
    root = os.environ.get(ENV)
    if not root:
        return CompileCache()
    module = sys.modules[class_for.__module__]
    return DiskCompileCache(Path(root) / fingerprint(module.__file__, compile_arch()))
