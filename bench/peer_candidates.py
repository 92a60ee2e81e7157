"""The peers as harness candidates (fa4tune.harness.candidates.Candidate: gated and timed like ours, never guarded):
upstream's autotuner and the config it picks, pull request #2634's dispatch (its TMA forward where it takes it), the
same with GQA unpacked, and its decode kernel, and torch SDPA (FA2 on its flash backend, or the backend SDPA runs where
flash cannot take the problem). Also the compile-ahead job of their kernels (`compile_job`, in CompilePool processes).

The peers' kernels are the SM120 classes compiled for the device, like ours: under emulation every DSL launch built in
the process (ours, upstream's, #2634's) is padded to SM120's CTAs per SM (fa4tune.emulated_occupancy), so the bench and
each compile process install the padding before any kernel is built. #2634 runs from .peers/ as the package
`fa4tune_peer_pr2634` (bench/peer_sources.py), beside the pinned flash-attn-4.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict

from fa4tune.config import Problem, is_local

PR2634_PACKAGE = "fa4tune_peer_pr2634"
PR2634_KERNELS = ("FlashAttentionForwardSm120Tma", "FlashAttentionForwardSm120", "FlashAttentionDecodeSm120")
DECODE_ENV = "FLASH_ATTENTION_SM120_DECODE_KERNEL"  # #2634's decode kernel: off unless set (interface.py l.1872-1876)
# the candidates' names as the records and tables show them
AUTOTUNE_OWN, AUTOTUNE_OURS = "autotune_own", "autotune_ours"
PR2634, PR2634_UNPACKED, PR2634_DECODE = "pr2634", "pr2634_unpacked", "pr2634_decode"
PR2771 = "pr2771"
FA2 = "fa2"


def window_sides(problem: Problem) -> tuple:
    """(left, right) as flash-attn's host functions take them: None for a side that does not limit."""
    if not is_local(problem.causal, problem.window_size_left, problem.window_size_right):
        return None, None
    return tuple(None if side is None or side < 0 else side for side in (problem.window_size_left, problem.window_size_right))


# ---- #2634 ----

def pr2634_eligible(problem: Problem, direction: str, variant: str) -> str:
    """Why a #2634 candidate is not run on a step ('' where it is): the dispatch runs every bf16/fp16 problem; with
    pack_gqa=False ("unpacked") on the GQA prefills, where the dispatch packs GQA and so never takes its TMA forward
    (interface.py l.2687-2695: its TMA class cannot pack; the record names the class that ran); its decode kernel on
    the one-token GQA decodes it gates on (interface.py l.1878-1904)."""
    if problem.dtype not in ("bf16", "fp16"):
        return f"#2634 has no {problem.dtype} path"
    if problem.lengths:
        return "packed batches: not run"
    if variant == PR2634:
        return ""
    if direction != "fwd":
        return "forward only"
    if variant == PR2634_UNPACKED:
        if problem.problem_class.regime == "decode" or problem.num_heads == problem.num_heads_kv:
            return "the dispatch's own call here (no GQA to pack, or a decode)"
        return ""
    if problem.seqlen_q != 1 or problem.num_heads == problem.num_heads_kv:
        return "its decode kernel runs one-token GQA decodes only"
    if problem.head_dim != problem.head_dim_v or problem.head_dim not in (128, 256):
        return "its decode kernel runs head_dim 128 and 256 only"
    if problem.softcap or window_sides(problem) != (None, None):
        return "its decode kernel takes no window or soft-cap"
    return ""


class KernelRecorder:
    """Which kernel #2634's forward dispatch ran for each call: its forward classes in its interface's namespace are
    replaced by subclasses that note what they build (class and tile), its compile caches by views that map each
    compile key to the kernel built for it (`kernels`, by the key's repr: the same in a compile process, whose map
    the bench merges) and note, per call, the kernel of the key it ran (`used`, tagged with `current`: the calling
    candidate; a key loaded from the persistent cache and built nowhere this run: "loaded")."""

    def __init__(self, interface):
        self.kernels: dict[str, str] = {}
        self.used: list[tuple[str, str]] = []
        self.current, self.last_built, self.last_key = "", "", ""
        for name in PR2634_KERNELS:
            base = getattr(interface, name)
            setattr(interface, name, type(name, (base,), {"__init__": self._init(base, name)}))
        function = interface._flash_attn_fwd
        function.compile_cache = _KeyedCache(function.compile_cache, self)
        function.decode_compile_cache = _KeyedCache(function.decode_compile_cache, self)

    def _init(self, base, name: str):
        recorder = self

        def __init__(self, *args, **kwargs):
            recorder.last_built = describe_kernel(name, args, kwargs)
            base.__init__(self, *args, **kwargs)

        return __init__

    def take(self) -> list[tuple[str, str]]:
        """(candidate, kernel) of every call since the last take."""
        used, self.used = self.used, []
        return used


class _KeyedCache:
    """A compile cache of #2634's interface, seen through a KernelRecorder."""

    def __init__(self, cache, recorder: KernelRecorder):
        self._cache, self._recorder = cache, recorder

    def __contains__(self, key) -> bool:
        self._recorder.last_key = repr(key)  # (a fake-tensor call asks, builds and never calls)
        return key in self._cache

    def __getitem__(self, key):
        self._recorder.used.append((self._recorder.current, self._recorder.kernels.get(repr(key), "loaded")))
        return self._cache[key]

    def __setitem__(self, key, fn) -> None:
        self._recorder.kernels[repr(key)] = self._recorder.last_built or "?"
        self._cache[key] = fn

    def __getattr__(self, name):
        return getattr(self._cache, name)


def describe_kernel(name: str, args: tuple, kwargs: dict) -> str:
    """'FlashAttentionForwardSm120Tma 128x64 kv_stages=2' from a #2634 class's constructor arguments."""
    short = {"FlashAttentionForwardSm120Tma": "tma", "FlashAttentionForwardSm120": "sm120", "FlashAttentionDecodeSm120": "decode"}
    tile = f" {kwargs['tile_m']}x{kwargs['tile_n']}" if "tile_m" in kwargs else (f" n{kwargs['tile_n']}" if "tile_n" in kwargs else "")
    if name == "FlashAttentionDecodeSm120" and len(args) > 4:
        kwargs = {**kwargs, "num_splits": args[4]}
    knobs = " ".join(f"{k}={kwargs[k]}" for k in ("num_threads", "num_stages", "Q_in_regs", "kv_stages", "num_mma_warps",
                                                  "pack_gqa", "num_splits") if kwargs.get(k) not in (None, False))
    return f"{short.get(name, name)}{tile}{(' ' + knobs) if knobs else ''}"


def recorder_of(interface) -> "KernelRecorder":
    """#2634's interface's KernelRecorder (load_pr2634 attaches it; read from the module's dict, as it is not upstream's)."""
    return vars(interface)["_fa4tune_recorder"]


def load_pr2634():
    """#2634's interface module (from .peers/, checked against the manifest first) with its KernelRecorder."""
    import importlib

    from bench import peer_sources

    peer_sources.require()
    interface = importlib.import_module(f"{PR2634_PACKAGE}.interface")
    if "_fa4tune_recorder" not in vars(interface):
        setattr(interface, "_fa4tune_recorder", KernelRecorder(interface))
    return interface


@contextlib.contextmanager
def decode_kernel_on(on: bool):
    """#2634's decode kernel switched on (its environment flag, read per call) while open."""
    if not on:
        yield
        return
    before = os.environ.get(DECODE_ENV)
    os.environ[DECODE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[DECODE_ENV]
        else:
            os.environ[DECODE_ENV] = before


def pr2634_candidate(variant: str, interface):
    """#2634 through its public flash_attn_func (its dispatch, its backward), the unpacked variant with pack_gqa=False
    (where the dispatch would pack GQA; its TMA forward where that can run), the decode variant with its decode kernel
    switched on."""
    from fa4tune.harness.candidates import Candidate

    def forward(q, k, v, causal, window_size=(-1, -1), softcap=0.0):
        sides = tuple(None if s is None or s < 0 else s for s in window_size)
        recorder_of(interface).current = variant
        with decode_kernel_on(variant == PR2634_DECODE):
            out, lse = interface.flash_attn_func(q, k, v, causal=causal, window_size=sides, softcap=softcap, return_lse=True,
                                                 **({"pack_gqa": False} if variant == PR2634_UNPACKED else {}))
        return out, lse

    return Candidate(variant, forward, {"path": f"{PR2634_PACKAGE}.interface.flash_attn_func", "variant": variant})


# ---- upstream's autotuner ----

def autotune_kwargs(problem: Problem, q, k, v, autotune) -> dict:
    """The autotuner's forward_kwargs for the problem's call, normalized by its own _normalize_kwargs (layouts,
    checks), then aimed at SM120's kernels (`_arch` 120: under emulation the device's own arch would pick its SM90
    kernels)."""
    left, right = window_sides(problem)
    kwargs = {"q": q, "k": k, "v": v, "causal": problem.causal, "window_size_left": left, "window_size_right": right}
    return {**autotune._normalize_kwargs(kwargs), "_arch": 120}


def tune(problem: Problem, configs: list, device, seed: int) -> dict:
    """Upstream's autotuner on the problem's own call: {"picked": FwdConfig, "seconds", "how", "candidates"}.

    On an SM 12.x GPU with its persistent cache on: its tune_fwd_config as shipped (parallel compile workers, CUDA
    graphs). Elsewhere its timing (_measure_configs: the check against its default config's output, CUDA graphs, 5
    rounds of 31 replays per candidate) on kernels compiled in this process or loaded from the persistent cache
    (compiled ahead by `compile_job`): its compile workers build for the device's arch, not SM120's. The seconds are
    the wall time of the call (compiles included where they happen in it)."""
    import torch
    from flash_attn.cute import autotune, cache_utils

    from fa4tune.harness import gate

    q, k, v = gate.random_inputs(problem, seed, device, count=3)
    kwargs = autotune_kwargs(problem, q, k, v, autotune)
    native = torch.cuda.get_device_capability(device)[0] == 12
    start = time.perf_counter()
    if native and cache_utils.CUTE_DSL_CACHE_ENABLED:
        picked = autotune.tune_fwd_config(configs, {name: value for name, value in kwargs.items() if name != "_arch"})
        how = "tune_fwd_config"
    else:
        with torch.cuda.device(device):
            picked = autotune._measure_configs(tuple(dict.fromkeys(configs)), kwargs)
        how = "_measure_configs (SM120 kernels for this device; its workers would build the device's own)"
    return {"picked": picked, "seconds": time.perf_counter() - start, "how": how, "candidates": len(configs)}


def autotune_candidate(name: str, picked):
    """The autotuner's pick through upstream's own interface (flash_attn.cute.interface._flash_attn_fwd with
    config=): output-only, as it tuned it."""
    from flash_attn.cute import interface

    from fa4tune.harness.candidates import Candidate

    def forward(q, k, v, causal, window_size=(-1, -1), softcap=0.0):
        left, right = (None if s is None or s < 0 else s for s in window_size)
        out, *_ = interface._flash_attn_fwd(q, k, v, causal=causal, window_size_left=left, window_size_right=right,
                                            config=picked, _arch=120)
        return out, None

    return Candidate(name, forward, {"path": "flash_attn.cute.interface._flash_attn_fwd(config=...)", "config": repr(picked)})


# ---- torch SDPA: FA2, or what SDPA runs instead ----

SDPA_BACKENDS = ("flash", "efficient", "math")


def sdpa_name(backend: str) -> str:
    """The candidate's name: fa2 on the flash backend (FA2's kernels), sdpa_<backend> otherwise."""
    return FA2 if backend == "flash" else f"sdpa_{backend}"


def sdpa_backend(problem: Problem, direction: str, device) -> tuple[str, str]:
    """(backend, why not flash) SDPA runs the problem on: flash where its check takes the call as the candidate makes
    it (causal with seqlen_q != seqlen_k: torch's causal_lower_right, whose flash path is FA2's bottom-right causal;
    a window: a boolean mask, which flash cannot take), else the memory-efficient backend, else math."""
    import warnings

    import torch
    from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention

    from fa4tune.harness import gate

    q, k, v = (t.transpose(1, 2) for t in gate.random_inputs(problem, 0, device, count=3))
    if direction == "bwd":
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    mask = None
    if window_sides(problem) != (None, None):
        rows = torch.arange(problem.seqlen_q, device=device)
        mask = ~gate.window_mask(rows, problem.seqlen_q, problem.seqlen_k, problem.seqlen_k, problem.causal,
                                 (problem.window_size_left, problem.window_size_right))
    is_causal = problem.causal and mask is None and problem.seqlen_q == problem.seqlen_k
    params = SDPAParams(q, k, v, mask, 0.0, is_causal, problem.num_heads != problem.num_heads_kv)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if can_use_flash_attention(params, True):
            return "flash", ""
    why = "; ".join(str(w.message) for w in caught)[:300] or "its flash check refused the call"
    return ("efficient" if can_use_efficient_attention(params, False) else "math"), why


def sdpa_candidate(backend: str):
    """torch SDPA held to one backend (sdpa_kernel); causal with seqlen_q != seqlen_k through causal_lower_right
    (torch's flash path for it is FA2's bottom-right causal; the efficient one its lower-right mask)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    from fa4tune.harness.candidates import Candidate, sdpa_candidate as harness_sdpa

    chosen = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]
    sdpa = harness_sdpa()

    def forward(q, k, v, causal, **arguments):
        with sdpa_kernel(chosen):
            seqlen_q, seqlen_k = q.shape[1], k.shape[1]
            if not causal or seqlen_q == seqlen_k or arguments:
                return sdpa.forward(q, k, v, causal, **arguments)
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 attn_mask=causal_lower_right(seqlen_q, seqlen_k),
                                                 enable_gqa=q.shape[2] != k.shape[2])
            return out.transpose(1, 2), None

    return Candidate(sdpa_name(backend), forward, {"path": f"torch SDPA, backend {backend}"})


# ---- compiling the peers' kernels ahead (a CompilePool job, in a CPU process) ----

def compile_job(job: dict) -> dict:
    """One peer kernel set compiled with fake tensors for the device's arch into the persistent caches the GPU
    process loads (FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED): {"kind": "autotune", "config": FwdConfig fields or None,
    "problems": [...]} (upstream's interface, output-only, as the autotuner calls it) or {"kind": "pr2634", "variant",
    "direction", "shapes"}; every shape (the problem first, then its gate cases). A #2634 reply names the kernel of
    the first shape's call ("kernels") and every compile key this process built ("keys": repr -> kernel)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fa4tune import emulated_occupancy
    from fa4tune.harness.gate import TORCH_DTYPES
    from fa4tune.targets import get_target

    emulated_occupancy.install(get_target().smem_per_sm)  # before any kernel is built: the padding is compiled in
    start = time.perf_counter()
    shapes = [Problem.from_dict(p) for p in job["shapes"]]
    built = []
    try:
        if job["kind"] == "autotune":
            from flash_attn.cute import config as config_module
            from flash_attn.cute import interface as call
            config = config_module.FwdConfig(**job["config"]) if job["config"] else None  # SM120's: registers None
        else:
            call = load_pr2634()
        for i, p in enumerate(shapes):
            dtype = TORCH_DTYPES[p.dtype]
            left, right = window_sides(p)
            with FakeTensorMode():
                q = torch.empty(p.batch, p.seqlen_q, p.num_heads, p.head_dim, dtype=dtype, device="cuda")
                k = torch.empty(p.batch, p.seqlen_k, p.num_heads_kv, p.head_dim, dtype=dtype, device="cuda")
                v = torch.empty(p.batch, p.seqlen_k, p.num_heads_kv, p.head_dim_v, dtype=dtype, device="cuda")
                if job["kind"] == "autotune":
                    call._flash_attn_fwd(q, k, v, causal=p.causal, window_size_left=left, window_size_right=right,
                                         config=config, _arch=120)
                    continue
                # as its flash_attn_func calls it (FlashAttnFunc.forward), so that the compile keys are the timed call's
                out, lse, *_ = call._flash_attn_fwd(q, k, v, causal=p.causal, window_size_left=left, window_size_right=right,
                                                    softcap=float(p.softcap), num_splits=1, return_lse=True,
                                                    pack_gqa=False if job["variant"] == PR2634_UNPACKED else None)
                if job["direction"] == "bwd":
                    call._flash_attn_bwd(q, k, v, out, torch.empty_like(out), lse, None, p.causal, float(p.softcap),
                                         window_size_left=left, window_size_right=right, deterministic=False, pack_gqa=None)
            if i == 0 and job["kind"] == "pr2634":  # the problem's own call: its key was the last one asked for
                recorder = recorder_of(call)
                built = [recorder.kernels.get(recorder.last_key, "loaded")]
    except Exception as err:  # the peer's compile error is its result; it fails again in the gate, named there
        from fa4tune.fake_compile import error_reason

        return {"status": "compile_error", "reason": error_reason(err), "seconds": time.perf_counter() - start}
    known = recorder_of(call).kernels if job["kind"] == "pr2634" else {}
    return {"status": "ok", "reason": "", "kernels": built, "keys": known, "seconds": time.perf_counter() - start}


def autotune_job(config, shapes: list[Problem]) -> dict:
    """The compile_job of one autotuner candidate (None: its default config, the reference it checks against)."""
    fields = None if config is None else {name: value for name, value in asdict(config).items()}
    return {"kind": "autotune", "config": fields, "shapes": [p.to_dict() for p in shapes]}


def pr2634_job(variant: str, direction: str, shapes: list[Problem]) -> dict:
    return {"kind": "pr2634", "variant": variant, "direction": direction, "shapes": [p.to_dict() for p in shapes]}
