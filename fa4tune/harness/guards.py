"""Guardrails the harness enforces on experiment.py, so that a faster number is a faster kernel.

Static, before anything runs (`check_module`, `check_source`): experiment.py's source, parsed with ast and
with import aliases resolved, may not reach another attention implementation (torch SDPA and its aten ops,
flex_attention, FA2/FA3, xformers, cuDNN attention, FA4's own dispatch and its SM90/SM100 kernels, which
SM120 cannot run), time itself, use side streams, defer work to threads or hooks, or reach the harness,
the import machinery, the environment or other processes.

At run time, while the harness gates a guarded candidate (experiment.attention):
  - `attention_trap`: torch's SDPA entry points and those of FA2/FA3/xformers/FA4's own interface raise,
    a TorchDispatchMode rejects every aten attention op however it is reached, imports of foreign
    attention libraries fail, and creating or switching to another CUDA stream fails. A violation the
    kernel catches and swallows is still recorded and fails it; so does patching the harness's functions.
  - `check_candidate` (after the gate passed): the candidate is called on input set A, on set B (new
    tensors, new values), then on A's tensors rewritten in place (same data_ptr and version counter, new
    values); every output must match the reference of its own inputs on sampled rows, and share no memory
    with any input or earlier output (output_reuse). Every output must be a plain torch.Tensor with an
    autograd graph only where one is recorded, leading to q, k and v (output_type); ready on the caller's
    current stream when the call returns: a snapshot after waiting on an event of that stream equals the
    value after a full synchronize (not_ready); with no thread left running (deferred_work), on the stream
    it started on (side_stream). For the backward, the forward's out is checked before any backward runs,
    then gradients are taken twice through the same graph, as they are timed, with dout rewritten in place.

Harness edits (`harness_changes`): prepare.py and the fa4tune modules that gate, time and log are pinned by
sha256 in fa4tune/harness.sha256; run_experiment refuses to run when one differs, unless
FA4TUNE_ALLOW_HARNESS_EDIT=1, and then every results.tsv row it writes says which files differ.

    uv run python -m fa4tune.guards            # check experiment.py and the harness pin (no GPU needed)
    uv run python -m fa4tune.guards --pin      # maintainers, after changing the harness: record its hashes
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import math
import os
import random
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from fa4tune.cli import CommandParser

ROOT = Path(__file__).resolve().parent.parent
PIN_PATH = Path(__file__).resolve().with_name("harness.sha256")
ALLOW_HARNESS_EDIT = "FA4TUNE_ALLOW_HARNESS_EDIT"
# The files that decide what a measurement says: pinned by hash.
HARNESS_FILES = (
    "prepare.py", "fa4tune/harness/gate.py", "fa4tune/harness/timing.py", "fa4tune/harness/isolation.py", "fa4tune/harness/metrics.py",
    "fa4tune/harness/results_tsv.py", "fa4tune/harness/flops.py", "fa4tune/harness/measurement.py", "fa4tune/harness/gpu.py", "fa4tune/harness/guards.py",
    "fa4tune/harness/step_server.py",
)


def _parser() -> CommandParser:
    """The command line's options (main() is at the end)."""
    parser = CommandParser(prog="python -m fa4tune.guards", description=(
        "Check experiment.py against the guardrails' static rules and the harness files against their pinned "
        "hashes (no GPU needed); the run-time guards run inside prepare.py."))
    parser.add_argument("experiment", nargs="?", default=str(ROOT / "experiment.py"), help="experiment file to check (default: experiment.py)")
    parser.add_argument("--pin", action="store_true", help="maintainers: record the current harness files' sha256 in fa4tune/harness.sha256")
    return parser


if __name__ == "__main__":
    _parser().parse_args()  # --help and bad arguments answer before torch is imported (seconds); main() parses again

import torch  # noqa: E402

from fa4tune.harness import flops, gate, measurement, timing  # noqa: E402

SAMPLED_ROWS = 16  # query rows compared against the reference in each guarded call

OTHER_ATTENTION, SELF_TIMING, SIDE_STREAM, DEFERRED_WORK = "other_attention", "self_timing", "side_stream", "deferred_work"
HARNESS_ACCESS, OUTPUT_REUSE, OUTPUT_TYPE, NOT_READY = "harness_access", "output_reuse", "output_type", "not_ready"
HARNESS_EDIT = "harness_edit"
WHY = {
    OTHER_ATTENTION: "experiment.py computes attention with its own SM120 kernels, never by calling another implementation",
    SELF_TIMING: "only the harness times kernels",
    SIDE_STREAM: "all work runs on the caller's current stream",
    DEFERRED_WORK: "no work (threads, timers, exit hooks) outlives the call",
    NOT_READY: "outputs are complete on the caller's current stream when the call returns",
    HARNESS_ACCESS: "experiment.py may not reach the harness, the import machinery, the environment or other processes",
    OUTPUT_REUSE: "every call computes its outputs from its own inputs, into fresh memory",
    OUTPUT_TYPE: "outputs are plain tensors, with an autograd graph only when one is recorded",
    HARNESS_EDIT: "prepare.py and the measuring modules of fa4tune/ are fixed",
}


class GuardViolation(Exception):
    """A candidate broke a guardrail; the message names the rule."""

    def __init__(self, rule: str, detail: str):
        super().__init__(f"guard {rule}: {detail} ({WHY[rule]})")
        self.rule, self.detail = rule, detail


# ------------------------------------------------------------------------------------------------
# Static check of experiment.py's source.
# ------------------------------------------------------------------------------------------------

# Dotted names (modules, or objects in them): the name itself and everything under it is forbidden.
_FORBIDDEN_DOTTED: dict[str, tuple[str, ...]] = {
    OTHER_ATTENTION: (
        "flash_attn_interface", "flash_attn_2_cuda", "flash_attn_3", "flash_attn_3_cuda", "xformers", "flashinfer",
        "sageattention", "transformer_engine", "cudnn", "apex", "triton.ops", "torch.nn.attention", "torch.backends.cudnn",
        "flash_attn.cute.interface", "flash_attn.cute.testing",
    ),
    SELF_TIMING: (
        "time", "timeit", "datetime", "cProfile", "profile", "triton.testing", "torch.utils.benchmark", "torch.profiler",
        "torch.autograd.profiler", "torch.cuda.Event", "torch.cuda.streams.Event", "torch.Event",
        "flash_attn.cute.benchmark", "flash_attn.cute.bench_utils",
    ),
    SIDE_STREAM: (
        "torch.cuda.Stream", "torch.cuda.streams", "torch.cuda.ExternalStream", "torch.cuda.stream", "torch.cuda.set_stream",
        "torch.cuda.StreamContext", "torch.Stream",
    ),
    DEFERRED_WORK: (
        "threading", "_thread", "concurrent", "multiprocessing", "asyncio", "sched", "signal", "atexit", "weakref.finalize",
        "torch.futures", "torch.jit.fork", "torch.jit._fork",
    ),
    HARNESS_ACCESS: (
        "prepare", "fa4tune.harness.gate", "fa4tune.harness.timing", "fa4tune.harness.isolation", "fa4tune.harness.results_tsv", "fa4tune.harness.metrics",
        "fa4tune.guards", "fa4tune.harness.flops", "fa4tune.harness.measurement", "fa4tune.harness.gpu", "fa4tune.static_check", "importlib",
        "builtins", "gc", "inspect", "ctypes", "subprocess", "pty", "os.environ", "os.environb", "os.putenv", "os.unsetenv",
        "os.getenv", "os.system", "os.popen", "os.fork", "sys.modules", "sys.meta_path", "sys.path", "sys.path_hooks",
        "sys._getframe", "sys.settrace", "sys.setprofile", "sys.addaudithook",
    ),
}
# FA2 is `flash_attn` (flash_attn_func & co.); FA4 lives in `flash_attn.cute`, whose SM120/SM80 building blocks
# are allowed, but not the kernels of architectures SM120 lacks (wgmma, tcgen05) nor FA4's own dispatch.
_FA4_PACKAGE = "flash_attn.cute"
_FA4_FORBIDDEN_MODULE_PREFIXES = ("flash_attn.cute.flash_fwd_sm90", "flash_attn.cute.flash_bwd_sm90", "flash_attn.cute.flash_fwd_sm100",
                                  "flash_attn.cute.flash_bwd_sm100", "flash_attn.cute.flash_fwd_mla", "flash_attn.cute.flash_bwd_mla",
                                  "flash_attn.cute.sm100_")
# Names forbidden wherever they appear as an attribute, an imported name or a getattr string.
_FORBIDDEN_NAME_PATTERNS: dict[str, re.Pattern] = {
    OTHER_ATTENTION: re.compile(
        r"scaled_dot_product|memory_efficient_attention|flash_attention_(forward|backward)|efficient_attention_(forward|backward)"
        r"|cudnn_attention|flex_attention|multi_head_attention|MultiheadAttention|^Transformer(Encoder|Decoder)?(Layer)?$"
        r"|^flash_attn_(varlen_|qkvpacked_|kvpacked_|varlen_qkvpacked_|varlen_kvpacked_)?func$|^flash_attn_with_kvcache$"
        r"|^FlashAttention(Forward|Backward)Sm(90|100)|(^|_)sdpa?(_|$)"
    ),
    SELF_TIMING: re.compile(r"perf_counter|process_time|thread_time|^monotonic|elapsed_time|^do_bench|Event(Create|Record|ElapsedTime|Synchronize)|^time_ns$"),
    SIDE_STREAM: re.compile(r"StreamCreate|^ExternalStream$|^set_stream$|^StreamContext$|StreamWaitEvent"),
}
# Builtins that run code or reach namespaces the check cannot see.
_FORBIDDEN_BUILTINS = {"exec", "eval", "compile", "__import__", "globals", "vars", "breakpoint"}
_ATTRIBUTE_BUILTINS = {"getattr", "setattr", "delattr", "hasattr"}


@dataclass(frozen=True)
class Violation:
    """One forbidden use in a source file: the rule, where, and what."""

    rule: str
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"guard {self.rule}: {self.path}:{self.line} uses {self.what} ({WHY[self.rule]})"


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def forbidden_rule(qualified: str) -> str | None:
    """The rule a dotted name breaks ('torch.nn.functional.scaled_dot_product_attention' -> other_attention), or None."""
    if _under(qualified, "flash_attn"):
        if not _under(qualified, _FA4_PACKAGE) or qualified.startswith(_FA4_FORBIDDEN_MODULE_PREFIXES):
            return OTHER_ATTENTION
    for rule, prefixes in _FORBIDDEN_DOTTED.items():
        if any(_under(qualified, p) for p in prefixes):
            return rule
    for part in qualified.split("."):
        rule = _name_rule(part)
        if rule:
            return rule
    return None


def _name_rule(name: str) -> str | None:
    for rule, pattern in _FORBIDDEN_NAME_PATTERNS.items():
        if pattern.search(name):
            return rule
    return None


class _SourceCheck(ast.NodeVisitor):
    def __init__(self, path: str, tree: ast.AST):
        self.path = path
        self.aliases: dict[str, str] = {}  # local name -> dotted name it was imported as
        self.found: dict[tuple[str, str], Violation] = {}
        for node in ast.walk(tree):  # imports anywhere (functions included) bind names for the whole file
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                    else:
                        root = alias.name.split(".")[0]
                        self.aliases[root] = root
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if alias.name != "*":
                        self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def _flag(self, rule: str | None, line: int, what: str) -> None:
        if rule and (rule, what) not in self.found:
            self.found[(rule, what)] = Violation(rule, self.path, line, what)

    def _dotted(self, node: ast.AST) -> str | None:
        """The dotted name an expression refers to, through import aliases (None if it is not a name chain)."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(self.aliases.get(node.id, node.id))
        return ".".join(reversed(parts))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._flag(forbidden_rule(alias.name), node.lineno, f"import {alias.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if not node.module or node.level:
            return
        for alias in node.names:
            if alias.name == "*":
                self._flag(HARNESS_ACCESS, node.lineno, f"from {node.module} import * (names the check cannot see)")
            else:
                what = f"{node.module}.{alias.name}"
                self._flag(forbidden_rule(what), node.lineno, f"from {node.module} import {alias.name}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = self._dotted(node)
        if dotted is not None:
            self._flag(forbidden_rule(dotted), node.lineno, dotted)
            return
        base = node  # a chain on a call or subscript: check the names, then what they hang on
        while isinstance(base, ast.Attribute):
            self._flag(_name_rule(base.attr), node.lineno, f"attribute {base.attr}")
            base = base.value
        self.visit(base)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.aliases:
            self._flag(forbidden_rule(self.aliases[node.id]), node.lineno, self.aliases[node.id])

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id not in self.aliases:
            if func.id in _FORBIDDEN_BUILTINS:
                self._flag(HARNESS_ACCESS, node.lineno, f"{func.id}()")
            elif func.id in _ATTRIBUTE_BUILTINS and len(node.args) >= 2:
                name = node.args[1]
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    target = self._dotted(node.args[0])
                    what = f"{target}.{name.value}" if target else name.value
                    self._flag(forbidden_rule(what), node.lineno, f"{func.id}({target or '...'}, {name.value!r})")
                elif func.id != "hasattr":
                    # a computed name: getattr(torch.nn.functional, "scaled_" + "dot...") hides what it reaches
                    target = self._dotted(node.args[0])
                    if target and target.split(".")[0] in self.aliases.values():
                        self._flag(HARNESS_ACCESS, node.lineno, f"{func.id}({target}, <computed name>)")
        self.generic_visit(node)


def check_source_text(text: str, path: str = "experiment.py") -> list[Violation]:
    """Every forbidden use in a source text, in line order (one per rule and name)."""
    tree = ast.parse(text, filename=path)
    check = _SourceCheck(path, tree)
    check.visit(tree)
    return sorted(check.found.values(), key=lambda v: (v.line, v.rule, v.what))


def check_source(path: str | Path) -> list[Violation]:
    """check_source_text on a file."""
    path = Path(path)
    return check_source_text(path.read_text(), path.name)


def check_kernel_classes(module) -> list[Violation]:
    """The classes experiment.py defines or imports (its kernel classes among them, fa4tune.kernel_class) must not
    derive from FA4's SM90/SM100 kernels (wgmma, tcgen05)."""
    classes = [value for value in vars(module).values() if isinstance(value, type)]
    path = Path(getattr(module, "__file__", "experiment.py")).name
    found = []
    for cls in classes:
        for base in getattr(cls, "__mro__", ()):
            if re.match(r"FlashAttention(Forward|Backward)Sm(90|100)", base.__name__):
                found.append(Violation(OTHER_ATTENTION, path, 0, f"kernel class {cls.__name__} derived from {base.__name__}"))
                break
    return found


def check_module(module) -> list[Violation]:
    """The static rules for an imported experiment module: its source, and its classes."""
    source = getattr(module, "__file__", None)
    return (check_source(source) if source else []) + check_kernel_classes(module)


# ------------------------------------------------------------------------------------------------
# The run-time trap: what a guarded candidate may not call while the harness runs it.
# ------------------------------------------------------------------------------------------------

# (module, attribute): entry points of other attention implementations, replaced while the trap is set
# (only in modules already imported; the import blocker stops the rest from being imported).
_TRAPPED_CALLS = (
    ("torch.nn.functional", "scaled_dot_product_attention"), ("torch._C._nn", "scaled_dot_product_attention"),
    ("torch.nn.functional", "multi_head_attention_forward"), ("torch.nn.attention.flex_attention", "flex_attention"),
    ("flash_attn", "flash_attn_func"), ("flash_attn", "flash_attn_varlen_func"),
    ("flash_attn.flash_attn_interface", "flash_attn_func"), ("flash_attn.flash_attn_interface", "flash_attn_varlen_func"),
    ("flash_attn_interface", "flash_attn_func"), ("flash_attn_interface", "flash_attn_varlen_func"),
    ("xformers.ops", "memory_efficient_attention"), ("xformers.ops.fmha", "memory_efficient_attention"),
    ("flash_attn.cute.interface", "flash_attn_func"), ("flash_attn.cute.interface", "flash_attn_varlen_func"),
)
# Top-level packages of other attention implementations: importing them while the trap is set fails.
_BLOCKED_IMPORTS = ("flash_attn_interface", "flash_attn_2_cuda", "flash_attn_3", "flash_attn_3_cuda", "xformers", "flashinfer",
                    "sageattention", "transformer_engine", "cudnn", "flash_attn.flash_attn_interface", "flash_attn.bert_padding")
_ATEN_ATTENTION = re.compile(r"scaled_dot_product|_flash_attention|_efficient_attention|cudnn_attention|flex_attention"
                             r"|multi_head_attention|_transformer_encoder_layer|_fused_sdp|_triton_scaled_dot|_triton_multi_head")
# Harness modules whose functions and constants a candidate must leave alone (snapshot at import, below).
_SEALED_MODULES = (gate, timing, flops, measurement)


class Trap:
    """What the trap caught while it was set; `violations` survive a kernel that swallows the exception."""

    def __init__(self):
        self.violations: list[GuardViolation] = []

    def record(self, rule: str, detail: str) -> GuardViolation:
        """Remember a violation and return the exception to raise."""
        violation = GuardViolation(rule, detail)
        self.violations.append(violation)
        return violation

    def raise_first(self) -> None:
        """Raise the first recorded violation, if any."""
        if self.violations:
            raise self.violations[0]


def _raiser(trap: Trap, rule: str, what: str) -> Callable:
    def trapped(*args, **kwargs):
        raise trap.record(rule, f"called {what} while the harness ran experiment.attention")

    return trapped


class _ImportBlocker:
    """A sys.meta_path finder that refuses foreign attention libraries."""

    def __init__(self, trap: Trap):
        self.trap = trap

    def find_spec(self, fullname, path=None, target=None):
        if any(_under(fullname, blocked) for blocked in _BLOCKED_IMPORTS):
            raise self.trap.record(OTHER_ATTENTION, f"imported {fullname} while the harness ran experiment.attention")
        return None


def _attention_dispatch_mode(trap: Trap):
    """A TorchDispatchMode that rejects aten attention ops (SDPA's flash/efficient/cuDNN/math kernels, MHA)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class AttentionOpTrap(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = getattr(getattr(func, "_schema", None), "name", str(func))
            if _ATEN_ATTENTION.search(name):
                raise trap.record(OTHER_ATTENTION, f"ran the aten op {name} while the harness ran experiment.attention")
            return func(*args, **(kwargs or {}))

    return AttentionOpTrap()


def _stream_traps(trap: Trap) -> list[tuple[object, str, object]]:
    """(owner, attribute, replacement): stream constructors that create a new stream, and set_stream."""
    import torch.cuda
    import torch.cuda.streams

    original_stream, original_external = torch.cuda.streams.Stream, torch.cuda.streams.ExternalStream

    class TrappedStream(original_stream):
        def __new__(cls, *args, **kwargs):
            if "stream_id" in kwargs:  # torch.cuda.current_stream() wraps the existing stream this way
                return original_stream(*args, **kwargs)
            raise trap.record(SIDE_STREAM, "created a CUDA stream (torch.cuda.Stream) during the call")

    class TrappedExternalStream(original_external):
        def __new__(cls, *args, **kwargs):
            raise trap.record(SIDE_STREAM, "wrapped an external CUDA stream (torch.cuda.ExternalStream) during the call")

    def set_stream(stream):
        if stream is not None:
            raise trap.record(SIDE_STREAM, "switched the current CUDA stream (torch.cuda.set_stream / torch.cuda.stream) during the call")

    replacements = []
    for owner in (torch.cuda, torch.cuda.streams):
        replacements += [(owner, "Stream", TrappedStream), (owner, "ExternalStream", TrappedExternalStream)]
    replacements.append((torch.cuda, "set_stream", set_stream))
    return replacements


def _harness_snapshot() -> dict[tuple[str, str], object]:
    return {(m.__name__, name): value for m in _SEALED_MODULES for name, value in vars(m).items()
            if not name.startswith("__") and (callable(value) or isinstance(value, (int, float, str, tuple)))}


_SEALED = _harness_snapshot()


def harness_tampering() -> list[str]:
    """Names of harness functions and constants that differ from what was imported ('fa4tune.harness.gate.compare')."""
    changed = []
    for (module, name), value in _SEALED.items():
        now = vars(sys.modules[module]).get(name, None)
        same = now is value if callable(value) else now == value
        if not same:
            changed.append(f"{module}.{name}")
    return changed


@contextlib.contextmanager
def attention_trap(enabled: bool = True):
    """While set: other attention implementations, new streams and stream switches raise and are recorded;
    on exit the first recorded violation (or a patched harness function) is raised as GuardViolation."""
    if not enabled:
        yield None
        return
    trap = Trap()
    patched: list[tuple[object, str, object]] = []
    for module_name, attribute in _TRAPPED_CALLS:
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, attribute):
            patched.append((module, attribute, _raiser(trap, OTHER_ATTENTION, f"{module_name}.{attribute}")))
    patched += _stream_traps(trap)
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
    blocker = _ImportBlocker(trap)
    for owner, name, replacement in patched:
        setattr(owner, name, replacement)
    sys.meta_path.insert(0, blocker)
    try:
        with _attention_dispatch_mode(trap):
            yield trap
    finally:
        sys.meta_path.remove(blocker)
        for owner, name, original in originals:
            setattr(owner, name, original)
        tampered = harness_tampering()
        if tampered:
            trap.record(HARNESS_ACCESS, f"changed {', '.join(tampered)} while the harness ran experiment.attention")
        trap.raise_first()


# ------------------------------------------------------------------------------------------------
# Observing one call: streams, readiness, types, threads.
# ------------------------------------------------------------------------------------------------


class CudaSync:
    """The real device: the current stream, waiting on an event recorded on it, a full synchronize."""

    def current_stream(self):
        return torch.cuda.current_stream()

    def wait_current_stream(self) -> None:
        event = torch.cuda.Event()
        event.record()
        event.synchronize()

    def synchronize(self) -> None:
        torch.cuda.synchronize()


class HostSync:
    """CPU tensors: work is done when the call returns."""

    def current_stream(self):
        return None

    def wait_current_stream(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


def sync_for(device) -> CudaSync | HostSync:
    """The sync object of a device."""
    return CudaSync() if torch.device(device).type == "cuda" else HostSync()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.uint8)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN equals NaN here: an unwritten output is unwritten both times)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def observe_call(call: Callable[[], object], names: Sequence[str], sync, label: str) -> list[torch.Tensor | None]:
    """Run `call` and return its tensor outputs, named `names`, after checking they are plain tensors that
    are final when the call returns on the current stream; GuardViolation otherwise."""
    stream = sync.current_stream()
    threads = set(threading.enumerate())
    result = call()
    if sync.current_stream() != stream:
        raise GuardViolation(SIDE_STREAM, f"{label}: the call returned with another current stream than it started on")
    outputs = list(result) if isinstance(result, (tuple, list)) else [result]
    outputs = (outputs + [None] * len(names))[: len(names)]
    for name, value in zip(names, outputs):
        if value is not None and type(value) is not torch.Tensor:
            raise GuardViolation(OUTPUT_TYPE, f"{label}: {name} is a {type(value).__module__}.{type(value).__qualname__}, not a torch.Tensor")
    if outputs[0] is None:
        raise GuardViolation(OUTPUT_TYPE, f"{label}: returned no {names[0]}")
    sync.wait_current_stream()  # what the caller's stream has finished: all a later reader on it may rely on
    snapshots = [None if value is None else value.detach().clone() for value in outputs]
    sync.synchronize()
    started = [t for t in threading.enumerate() if t not in threads and t.is_alive()]
    if started:
        raise GuardViolation(DEFERRED_WORK, f"{label}: left {len(started)} thread(s) running after it returned ({started[0].name})")
    for name, value, snapshot in zip(names, outputs, snapshots):
        if value is not None and not _same_bits(value, snapshot):
            raise GuardViolation(
                NOT_READY, f"{label}: {name} changed after the call returned and its stream was idle "
                "(written on a side stream, or lazily after the timed region)")
    return outputs


def _storage_span(t: torch.Tensor) -> tuple[torch.device, int, int]:
    storage = t.untyped_storage()
    return t.device, storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    (da, sa, ea), (db, sb, eb) = _storage_span(a), _storage_span(b)
    return da == db and sa < eb and sb < ea and ea > sa and eb > sb


def _check_no_alias(label: str, outputs: dict[str, torch.Tensor], others: dict[str, torch.Tensor]) -> None:
    for name, value in outputs.items():
        for other_name, other in others.items():
            if value is not None and other is not None and _shares_memory(value, other):
                raise GuardViolation(OUTPUT_REUSE, f"{label}: {name} shares memory with {other_name}")


def _reaches_inputs(out: torch.Tensor, inputs: Sequence[torch.Tensor], limit: int = 100_000) -> bool:
    """True when out's autograd graph leads to every input (leaves requiring grad)."""
    wanted = {id(t) for t in inputs}
    seen: dict[int, object] = {}  # holding the nodes keeps their ids from being reused during the walk
    stack, found = [out.grad_fn], set()
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        variable = getattr(node, "variable", None)
        if variable is not None and id(variable) in wanted:
            found.add(id(variable))
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found == wanted


# ------------------------------------------------------------------------------------------------
# Output reuse: three calls whose inputs differ; each output must follow its own inputs.
# ------------------------------------------------------------------------------------------------


def sample_rows(seqlen_q: int, count: int, seed: int) -> torch.Tensor:
    """Sorted query rows to compare: the first, the last, and random ones between."""
    rng = random.Random(seed)
    rows = {0, seqlen_q - 1} | {rng.randrange(seqlen_q) for _ in range(max(0, count - 2))}
    return torch.tensor(sorted(rows))


def row_reference(q, k, v, causal: bool, rows: torch.Tensor, dtype, dout=None):
    """Attention of some query rows only, computed in `dtype`: out (b, r, hq, dv), lse (b, hq, r), and with
    `dout` the rows' dQ (b, r, hq, d). Rows are independent, so this is exact for them at any sequence length."""
    batch, seqlen_q, _, head_dim = q.shape
    seqlen_k, group = k.shape[1], q.shape[2] // k.shape[2]
    scale = 1.0 / math.sqrt(head_dim)
    rows = rows.to(q.device)
    mask = gate.causal_mask(rows, seqlen_q, seqlen_k, seqlen_k) if causal else None
    outs, lses, dqs = [], [], []
    with gate._fp32_matmul_exact(), torch.enable_grad():
        for b in range(batch):
            qc = q[b, rows].detach().to(dtype).requires_grad_(dout is not None)
            oc, lc = gate._attention_rows(qc, k[b].detach().to(dtype), v[b].detach().to(dtype), scale, mask, group)
            outs.append(oc.detach())
            lses.append(lc.detach())
            if dout is not None:
                dqs.append(torch.autograd.grad(oc, qc, dout[b, rows].to(dtype))[0])
    valid = (rows + (seqlen_k - seqlen_q) >= 0) if causal else torch.ones_like(rows, dtype=torch.bool)
    valid = valid[None, None, :].expand(batch, q.shape[2], len(rows))
    return torch.stack(outs), torch.stack(lses), (torch.stack(dqs) if dout is not None else None), valid


def _check_rows(label: str, q, k, v, causal, rows, *, out=None, lse=None, dout=None, dq=None) -> None:
    """Sampled rows of out and lse (or of dq, with dout) against the reference of these inputs, by the gate's rule."""
    ref_out, ref_lse, ref_dq, valid = row_reference(q, k, v, causal, rows, torch.float32, dout)
    plain_out, plain_lse, plain_dq, _ = row_reference(q, k, v, causal, rows, q.dtype, dout)
    rows = rows.to(q.device)
    if dq is not None:
        checks = [gate.compare("dq", dq[:, rows], ref_dq, plain_dq, q.dtype)]
    else:
        checks = [gate.compare("out", out.detach()[:, rows], ref_out, plain_out, q.dtype)]
        if lse is not None:
            checks.append(gate.compare("lse", lse.detach()[:, :, rows], ref_lse, plain_lse, q.dtype, valid=valid))
    failing = [c for c in checks if not c.passed]
    if failing:
        raise GuardViolation(OUTPUT_REUSE, f"{label}: does not match the reference of its own inputs: {failing[0].describe()}")


def _forward_call(forward, q, k, v, causal, grad: bool):
    def call():
        with torch.set_grad_enabled(grad):
            return forward(q, k, v, causal)

    return call


def _check_graph(label: str, out: torch.Tensor, inputs: Sequence[torch.Tensor], recording: bool) -> None:
    if not recording:
        if out.requires_grad or out.grad_fn is not None:
            raise GuardViolation(OUTPUT_TYPE, f"{label}: out carries an autograd graph under torch.no_grad()")
    elif out.grad_fn is None or not _reaches_inputs(out, inputs):
        raise GuardViolation(OUTPUT_TYPE, f"{label}: out's autograd graph does not lead back to q, k and v")


def check_forward_reuse(forward, problem, device, seed: int, sync, rows: int = SAMPLED_ROWS) -> None:
    """Call the forward (under no_grad, as it is timed) on set A, on set B, then on A's tensors rewritten in
    place; every output must match its inputs' reference and share memory with nothing before it."""
    a = gate.random_inputs(problem, seed, device, count=3)
    b = gate.random_inputs(problem, seed + 1, device, count=3)
    c = gate.random_inputs(problem, seed + 2, device, count=3)
    sample = sample_rows(problem.seqlen_q, rows, seed)
    live: dict[str, torch.Tensor] = {"q of set A": a[0], "k of set A": a[1], "v of set A": a[2],
                                     "q of set B": b[0], "k of set B": b[1], "v of set B": b[2]}
    calls = [("call 1 (set A)", a, None), ("call 2 (set B: new tensors, new values)", b, None),
             ("call 3 (set A's tensors rewritten in place)", a, c)]
    previous = []
    for number, (label, inputs, new_values) in enumerate(calls, start=1):
        if new_values is not None:
            for t, values in zip(inputs, new_values):
                t.data.copy_(values)  # through .data: same data_ptr, and no version-counter bump either
        q, k, v = inputs
        out, lse = observe_call(_forward_call(forward, q, k, v, problem.causal, grad=False), ("out", "lse"), sync, label)
        _check_graph(label, out, inputs, recording=False)
        _check_no_alias(label, {"out": out, "lse": lse}, live)
        for earlier_label, earlier_out in previous:
            if _same_bits(out, earlier_out):
                raise GuardViolation(OUTPUT_REUSE, f"{label}: returned the same out as {earlier_label}, for other inputs")
        _check_rows(label, q, k, v, problem.causal, sample, out=out, lse=lse)
        previous.append((label, out))
        live.update({f"out of call {number}": out, f"lse of call {number}": lse})


def check_backward_reuse(forward, problem, device, seed: int, sync, rows: int = SAMPLED_ROWS) -> None:
    """Forward on set A (its out checked before any backward), then the gradients twice through the same
    graph (as they are timed) with dout rewritten in place between; dQ rows must follow dout, nothing may
    alias, and dK, dV must change with dout."""
    q, k, v, dout = gate.random_inputs(problem, seed, device, count=4)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    sample = sample_rows(problem.seqlen_q, rows, seed)
    label = "forward (set A, recording autograd)"
    out, lse = observe_call(_forward_call(forward, q, k, v, problem.causal, grad=True), ("out", "lse"), sync, label)
    _check_graph(label, out, (q, k, v), recording=True)
    _check_no_alias(label, {"out": out, "lse": lse}, {"q": q, "k": k, "v": v})
    _check_rows(label, q, k, v, problem.causal, sample, out=out, lse=lse)
    live = {"q": q, "k": k, "v": v, "dout": dout, "out": out, "lse": lse}
    previous = None
    for number in (1, 2):
        label = f"backward {number}" + (" (dout rewritten in place)" if number == 2 else "")
        if number == 2:
            generator = torch.Generator(device=device).manual_seed(seed + 3)
            dout.data.copy_(torch.randn(dout.shape, generator=generator, device=device, dtype=dout.dtype))

        def call():
            return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

        dq, dk, dv = observe_call(call, ("dq", "dk", "dv"), sync, label)
        grads = {"dq": dq, "dk": dk, "dv": dv}
        _check_no_alias(label, grads, live)
        if previous is not None:
            for name in ("dk", "dv"):
                if _same_bits(grads[name], previous[name]):
                    raise GuardViolation(OUTPUT_REUSE, f"{label}: returned the same {name} as backward 1, for another dout")
        _check_rows(label, q, k, v, problem.causal, sample, dout=dout, dq=dq)
        live.update({f"{name} of backward {number}": value for name, value in grads.items()})
        previous = grads


def check_candidate(forward, problem, direction: str, device, seed: int, *, sync=None, rows: int = SAMPLED_ROWS) -> None:
    """The run-time guards for one (problem, direction) of a candidate that passed the gate; GuardViolation if one fails."""
    sync = sync or sync_for(device)
    if direction == "fwd":
        check_forward_reuse(forward, problem, device, seed, sync, rows)
    else:
        check_backward_reuse(forward, problem, device, seed, sync, rows)


# ------------------------------------------------------------------------------------------------
# Harness edits: hashes of the harness files against the pinned ones.
# ------------------------------------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_pin(pin_path: Path | None = None) -> dict[str, str]:
    """{relative path: sha256} from a pin file (`sha256sum` format); {} when it does not exist."""
    pin_path = pin_path or PIN_PATH
    if not pin_path.exists():
        return {}
    pins = {}
    for line in pin_path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            digest, _, name = line.partition("  ")
            pins[name.strip()] = digest.strip()
    return pins


def write_pin(root: Path | None = None, pin_path: Path | None = None, files: Sequence[str] = HARNESS_FILES) -> None:
    """Record the harness files' hashes (what `python -m fa4tune.guards --pin` does)."""
    root, pin_path = root or ROOT, pin_path or PIN_PATH
    lines = [f"{file_sha256(root / name)}  {name}" for name in files]
    pin_path.write_text("\n".join(lines) + "\n")


def harness_changes(root: Path | None = None, pin_path: Path | None = None, files: Sequence[str] = HARNESS_FILES) -> list[str]:
    """The harness files whose hash differs from the pin (all of them when there is no pin)."""
    root = root or ROOT
    pins = read_pin(pin_path or PIN_PATH)
    return [name for name in files if not (root / name).exists() or pins.get(name) != file_sha256(root / name)]


def harness_edit_allowed() -> bool:
    """True when FA4TUNE_ALLOW_HARNESS_EDIT=1: runs go on, and their rows are marked."""
    return os.environ.get(ALLOW_HARNESS_EDIT) == "1"


def harness_edit_error(changed: Sequence[str]) -> str:
    """The one-line refusal for an edited harness."""
    return (f"guard {HARNESS_EDIT}: {', '.join(changed)} differ from the hashes pinned in fa4tune/{PIN_PATH.name} "
            f"({WHY[HARNESS_EDIT]}); restore them (git checkout -- {' '.join(changed)}), or, as a maintainer, pin the new "
            f"harness with `uv run python -m fa4tune.guards --pin` ({ALLOW_HARNESS_EDIT}=1 runs anyway and marks every row)")


def harness_edit_mark(changed: Sequence[str]) -> str:
    """What a results.tsv row's description starts with when the harness was edited."""
    return f"[harness edited: {', '.join(changed)}]"


# ------------------------------------------------------------------------------------------------
# Command line.
# ------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Check experiment.py and the harness pin, or --pin the harness; a violation is a refusal (one `error:` line
    each, exit code 2, as every refusal of the project's commands), a clean check exits 0."""
    args = _parser().parse_args(argv)
    if args.pin:
        write_pin()
        print(f"pinned {len(HARNESS_FILES)} harness files in {PIN_PATH}")
        return 0
    path = Path(args.experiment)
    if not path.is_file():
        print(f"error: experiment_file: {str(path)!r} does not exist", file=sys.stderr)
        return 2
    violations = check_source(path)
    for violation in violations:
        print(f"error: {violation}", file=sys.stderr)
    changed = harness_changes()
    if changed:
        print(f"error: {harness_edit_error(changed)}", file=sys.stderr)
    print(f"guards: {len(violations)} violation(s) in {path.name}; harness {'edited' if changed else 'as pinned'}")
    return 2 if violations or changed else 0


if __name__ == "__main__":
    sys.exit(main())
