"""The fake-tensor compile: one config's kernels for a list of shapes, called as the harness calls them, and the
facts of the kernel that runs the first shape, read one way for the static check and the compile pipeline.

Runs in a compiler process whose environment names the arch before the DSL is imported (the static check's
workers: sm_120a; the compile pipeline's: the GPU's). A forward runs through experiment.attention; a
backward through the patched host path as experiment._Attention.backward calls it, forward first (autograd on
fake CUDA tensors needs a device). So the compile keys are the harness's, and under FA4TUNE_KERNEL_CACHE the
kernels land in the kernel cache the GPU process loads from.

The facts: dynamic shared memory is the size of the struct the kernel class's `_get_shared_storage_cls`
returns while its kernel is traced (upstream's formula counts only the tiles; the struct is what the launch
asks for), and beside it what its kernel class declares (its `smem_bytes`, fa4tune.kernel_class);
registers, stack, static shared memory and spills come from the cubin (CUTE_DSL_KEEP must name cubin). A kernel
loaded from the kernel cache is not traced: its facts are the ones stored beside it when it was compiled.
"""

from __future__ import annotations

import math
import os
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from fa4tune.config import NO_WINDOW, SHORTEST_SOFTCAP, Problem, ProblemClass, is_local

STATIC_SEQLEN = 1024  # the static check's shape: several tiles in both directions; kernels do not specialise on it
STATIC_HEADS_KV = 2
RESOURCES = ("registers", "stack_bytes", "spill_store_bytes", "spill_load_bytes", "static_smem_bytes", "dynamic_smem_bytes",
             "declared_smem_bytes", "compile_seconds")


@dataclass(frozen=True)
class KernelFacts:
    """One compile call: the first shape's kernel's resources, and how many kernels the call compiled or loaded."""

    registers: int = 0
    stack_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    static_smem_bytes: int = 0
    dynamic_smem_bytes: int = 0
    declared_smem_bytes: int = 0  # the kernel class's own formula (smem_bytes) for the first shape; 0: none
    compile_seconds: float = 0.0  # the first shape's own call (for a loaded kernel: when it was compiled)
    kernels_compiled: int = 0
    kernels_loaded: int = 0
    shapes: int = 0
    cubin_error: str = ""  # the kernel compiled, but its facts could not be read: not the config's fault

    def resources(self) -> dict:
        """The kernel's own facts (what StaticFacts takes and the kernel cache stores beside the kernel)."""
        return {name: value for name, value in asdict(self).items() if name in RESOURCES}


def static_shape(pc: ProblemClass, kernel: type | None = None) -> Problem:
    """The one shape the static check compiles a problem class for: the forward kernel class's own
    (`static_problem`, e.g. a split-KV class's decode shape, which only splits for such shapes) or this one."""
    own = kernel.static_problem(pc) if kernel is not None and hasattr(kernel, "static_problem") else None
    if own is not None:
        return own
    # a window or soft-cap class compiles its own kernel (is_local, the soft-cap's score_mod), not the plain one
    return Problem(1, STATIC_SEQLEN, STATIC_SEQLEN, STATIC_HEADS_KV * pc.qhead_per_kvhead, STATIC_HEADS_KV, pc.head_dim,
                   pc.head_dim_v, pc.causal, pc.dtype, backward=not pc.page_size, page_size=pc.page_size,
                   window_size_left=STATIC_SEQLEN // 2 if pc.window else NO_WINDOW,
                   softcap=SHORTEST_SOFTCAP if pc.softcap else 0.0)


def error_reason(err: BaseException) -> str:
    """A compile error as one line (the exception's last line, 500 characters at most)."""
    return traceback.format_exception_only(type(err), err)[-1].strip()[:500]


@contextmanager
def recording_shared_storage(cls: type, sizes: list[int]):
    """While open, each `cls._get_shared_storage_cls` call on a `cls` object appends the struct's size to `sizes`.

    The class itself is patched (and restored on exit), not subclassed: the compile keys name the class, and
    they must stay the harness's.
    """
    own = cls.__dict__.get("_get_shared_storage_cls")
    resolved = cls._get_shared_storage_cls

    def _get_shared_storage_cls(self):
        storage = resolved(self)
        if type(self) is cls:  # not a subclass's kernel that inherits the method
            sizes.append(int(storage.size_in_bytes()))
        return storage

    cls._get_shared_storage_cls = _get_shared_storage_cls
    try:
        yield sizes
    finally:
        if own is None:
            del cls._get_shared_storage_cls
        else:
            cls._get_shared_storage_cls = own


FACTS_NOT_READ = "not read: the caller needs no cubin facts of this compile"


def compile_shapes(experiment, kind: str, config, shapes: list[Problem], read_facts: bool = True) -> KernelFacts:
    """Compile (or load) `config`'s kernels for every shape as the harness calls them; facts of the first shape's
    kernel. The other direction's config is experiment.py's dispatch entry. Raises on a compile error.

    `read_facts=False` skips the cubin read (cuobjdump; 0.7-0.9 s a cubin when it has local memory): the facts then
    hold the shared storage (from the trace) but no registers or spills (cubin_error FACTS_NOT_READ), and nothing is
    stored beside the kernel. The compile pipeline's GPU stage asks for that when the GPU's arch is not the target's
    (its sm_120a facts come from the static check's own compile)."""
    from fa4tune.sm120_interface import build

    if not shapes:
        raise ValueError("compile_shapes needs at least one shape, got none")
    host = build(experiment.kernel_class)
    cache = host.fwd_cache if kind == "fwd" else host.bwd_cache
    if kind == "fwd" and getattr(experiment.kernel_class(config), "quantizes", False):
        from fa4tune import fp8

        cache = fp8.COMPILED  # the FP8 forward's host path (fa4tune.fp8) compiles outside upstream's host
    pc = shapes[0].problem_class
    fwd_config, bwd_config = (config, experiment.backward_config(pc)) if kind == "fwd" else (experiment.forward_config(pc), config)
    sizes: list[int] = []
    compiled: dict = {}  # key -> (compiled function, its dynamic shared memory), in compile order

    def on_compile(key, fn) -> None:
        compiled[key] = (fn, max(sizes, default=0))
        sizes.clear()

    # Every kernel this call needs is then compiled or loaded here, never taken from an earlier call's memory,
    # so the first entry is the first shape's kernel and its facts are read, not guessed.
    cache.clear()
    cache.listeners.append(on_compile)
    seconds: list[float] = []
    try:
        with recording_shared_storage(experiment.kernel_class(config), sizes):
            for shape in shapes:
                seconds.append(_run_shape(experiment, host, kind, shape, fwd_config, bwd_config))
    finally:
        cache.listeners.remove(on_compile)
        _clear_dumps()
    first = next(iter(cache), None)
    if first is None:
        raise RuntimeError(f"the {kind} host path ran {len(shapes)} shapes but compiled and loaded no kernel")
    counts = dict(kernels_compiled=len(compiled), kernels_loaded=len(cache) - len(compiled), shapes=len(shapes))
    if first not in compiled:
        stored = cache.read_facts(first) if hasattr(cache, "read_facts") else None
        if stored is None or any(name not in stored for name in RESOURCES):
            return KernelFacts(**counts, cubin_error="loaded from the kernel cache, which holds no facts for it")
        return KernelFacts(**{name: stored[name] for name in RESOURCES}, **counts)
    fn, dynamic_smem = compiled[first]
    declared = experiment.kernel_class(config).smem_bytes(config, pc)[0]  # the class's formula, forward or backward
    if not read_facts:
        return KernelFacts(dynamic_smem_bytes=dynamic_smem, declared_smem_bytes=declared, compile_seconds=seconds[0], **counts,
                           cubin_error=FACTS_NOT_READ)
    try:
        facts = _read_cubin(fn)
    except Exception as err:  # the kernel compiled; reading it failed (a missing cuobjdump, say)
        return KernelFacts(**counts, cubin_error=f"compiled, but its cubin could not be read: {error_reason(err)}")
    facts = KernelFacts(**facts, dynamic_smem_bytes=dynamic_smem, declared_smem_bytes=declared, compile_seconds=seconds[0], **counts)
    if hasattr(cache, "write_facts"):
        cache.write_facts(first, facts.resources())  # for a later process that loads the kernel instead
    return facts


def _read_cubin(fn) -> dict:
    from fa4tune.cubin import read_cubin

    cubin = getattr(fn, "__cubin__", None)
    if not cubin:
        raise RuntimeError(f"no cubin was kept (CUTE_DSL_KEEP={os.environ.get('CUTE_DSL_KEEP', '')!r} must name cubin)")
    facts = read_cubin(cubin)
    return dict(registers=facts.registers, stack_bytes=facts.stack_bytes, spill_store_bytes=facts.spill_store_bytes,
                spill_load_bytes=facts.spill_load_bytes, static_smem_bytes=facts.static_smem_bytes)


def _run_shape(experiment, host, kind: str, problem: Problem, fwd_config, bwd_config) -> float:
    """One shape through the harness's call; the seconds of the `kind` call itself (its compile, when it compiled)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fa4tune.harness.gate import TORCH_DTYPES

    dtype = TORCH_DTYPES[problem.dtype]
    # the problem's sliding window and soft-cap, as the harness calls it (they are in upstream's compile key)
    local = is_local(problem.causal, problem.window_size_left, problem.window_size_right)
    window = (problem.window_size_left, problem.window_size_right) if local else (None, None)
    host_args = dict(window_size_left=window[0], window_size_right=window[1], softcap=float(problem.softcap))
    # a paged problem's K and V are page pools, its call has a page table and used lengths (as gate.paging gives them)
    pages = -(-problem.seqlen_k // problem.page_size) if problem.page_size else 0
    lead_k = (problem.batch * pages, problem.page_size) if pages else (problem.batch, problem.seqlen_k)
    with FakeTensorMode():
        q = torch.empty(problem.batch, problem.seqlen_q, problem.num_heads, problem.head_dim, dtype=dtype, device="cuda")
        k = torch.empty(*lead_k, problem.num_heads_kv, problem.head_dim, dtype=dtype, device="cuda")
        v = torch.empty(*lead_k, problem.num_heads_kv, problem.head_dim_v, dtype=dtype, device="cuda")
        paged = {} if not pages else dict(page_table=torch.empty(problem.batch, pages, dtype=torch.int32, device="cuda"),
                                          seqused_k=torch.empty(problem.batch, dtype=torch.int32, device="cuda"))
        if kind == "fwd":
            start = time.perf_counter()
            with torch.no_grad():
                experiment.attention(q, k, v, causal=problem.causal, fwd_config=fwd_config, bwd_config=bwd_config, return_lse=True,
                                     **({"window_size": window} if local else {}),
                                     **({"softcap": problem.softcap} if problem.softcap else {}), **paged)
            return time.perf_counter() - start
        scale = 1.0 / math.sqrt(problem.head_dim)
        out, lse, *_ = host.flash_attn_fwd(q, k, v, softmax_scale=scale, causal=problem.causal,
                                           tile_mn=(fwd_config.tile_m, fwd_config.tile_n), return_lse=True, sm120_config=fwd_config,
                                           **host_args)
        start = time.perf_counter()
        own = getattr(experiment, "preprocess_threads", None)  # the preprocess's thread count, as _Attention.backward passes it
        threads = own(problem.problem_class, bwd_config) if own else 256
        host.flash_attn_bwd(q, k, v, out, torch.empty_like(out), lse, softmax_scale=scale, causal=problem.causal, sm120_config=bwd_config,
                            sm120_preprocess_threads=threads, **host_args)
        return time.perf_counter() - start


def _clear_dumps() -> None:
    """Removes the cubin/ptx files CUTE_DSL_KEEP left (the facts are read from the compiled function)."""
    dump = os.environ.get("CUTE_DSL_DUMP_DIR")
    if dump and os.environ.get("CUTE_DSL_KEEP"):
        for path in Path(dump).glob("*"):
            path.unlink(missing_ok=True)
