"""The run-time guardrails: what the harness watches while it gates a guarded candidate (experiment.attention).

  - `attention_trap`: torch's SDPA entry points and those of FA2/FA3/xformers/FA4's own interface raise,
    a TorchDispatchMode rejects every aten attention op however it is reached, imports of foreign
    attention libraries fail, and creating or switching to another CUDA stream fails. A violation the
    kernel catches and swallows is still recorded and fails it; so does patching a function or constant of
    a harness module (every module of fa4tune.harness that is loaded: sealed at import and at each trap).
  - `check_candidate` (after the gate passed): the candidate is called on input set A, on set B (new
    tensors, new values), then on A's tensors rewritten in place (same data_ptr and version counter, new
    values); every output must match the reference of its own inputs on sampled rows, and share no memory
    with any input or earlier output (output_reuse). Every output must be a plain torch.Tensor with an
    autograd graph only where one is recorded, leading to q, k and v (output_type); ready on the caller's
    current stream when the call returns: a snapshot after waiting on an event of that stream equals the
    value after a full synchronize (not_ready); with no thread left running (deferred_work), on the stream
    it started on (side_stream). For the backward, the forward's out is checked before any backward runs,
    then gradients are taken twice through the same graph, as they are timed, with dout rewritten in place.

The rules, their reasons and the static check of experiment.py's source are in fa4tune.harness.guards.
"""

from __future__ import annotations

import builtins
import contextlib
import math
import os
import random
import re
import statistics
import sys
import threading
import time
from typing import Callable, Sequence

import torch

from fa4tune.harness import fp8_gate, gate
from fa4tune.harness.guards import (
    DEFERRED_WORK, HARNESS_ACCESS, HARNESS_PACKAGE, NOT_READY, OTHER_ATTENTION, OUTPUT_REUSE, OUTPUT_TYPE, SIDE_STREAM, GuardViolation,
    under,
)

SAMPLED_ROWS = 16  # query rows compared against the reference in each guarded call

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
        if any(under(fullname, blocked) for blocked in _BLOCKED_IMPORTS):
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


# The functions and constants of every loaded module of the harness package, as first seen (seal_harness).
_SEALED: dict[tuple[str, str], object] = {}
_SEALED_MODULES: set[str] = set()


def _sealed_value(value) -> bool:
    # a flag (isolation's `retire`) is the process's state, not a constant of the harness
    return callable(value) or (isinstance(value, (int, float, str, tuple)) and not isinstance(value, bool))


def seal_harness() -> None:
    """Snapshot the functions and constants of every loaded module of fa4tune.harness not sealed yet: at this
    module's import, before experiment.py's code runs (candidates.load_experiment) and as each trap is set."""
    for module_name, module in list(sys.modules.items()):
        if module is None or not under(module_name, HARNESS_PACKAGE) or module_name in _SEALED_MODULES:
            continue
        _SEALED_MODULES.add(module_name)
        for name, value in vars(module).items():
            if not name.startswith("__") and _sealed_value(value):
                _SEALED[(module_name, name)] = value


# What the harness relies on outside its own modules (issue 66): the clocks, the random draws, threads, CUDA events
# and synchronization, the builtins and torch functions its checks compare with. Bound when this module is imported,
# before experiment.py runs; one a candidate replaces (time.perf_counter reached as logging.time, os.urandom,
# torch.equal) is refused at the next trap or timed round. Owners are dotted paths from a root module.
_RELIED_ON = {
    "time": "perf_counter perf_counter_ns monotonic time", "os": "urandom", "random": "Random SystemRandom",
    "threading": "active_count enumerate Thread", "statistics": "median",
    "builtins": "isinstance len sum min max sorted int float abs any all zip range getattr type id iter next list tuple dict set str",
    "torch": "equal allclose isnan isfinite logsumexp softmax matmul randn stack full zeros empty cat arange tensor where "
             "no_grad enable_grad set_grad_enabled Generator Tensor",
    "torch.autograd": "grad", "torch.Tensor": "copy_ sum float to clone detach view contiguous tolist item abs max norm __sub__ "
                                              "__eq__ untyped_storage data_ptr numel requires_grad_",
    "torch.cuda": "Event synchronize _sleep current_stream current_device get_device_properties get_device_name empty_cache",
    "torch.cuda.Event": "record elapsed_time query synchronize",
}
_ROOTS = {"time": time, "os": os, "random": random, "threading": threading, "statistics": statistics, "builtins": builtins, "torch": torch}


def _relied_on_now() -> dict[str, object]:
    found = {}
    for owner_path, names in _RELIED_ON.items():
        root, *rest = owner_path.split(".")
        owner = _ROOTS[root]
        for part in rest:
            owner = getattr(owner, part, None)
        for name in names.split():
            found[f"{owner_path}.{name}"] = getattr(owner, name, None)
    return found


_BOUND = _relied_on_now()


def harness_tampering() -> list[str]:
    """Names of harness functions and constants that differ from what was sealed ('fa4tune.harness.gate.compare'), and
    of what the harness relies on outside it that differs from what it bound at import ('time.perf_counter')."""
    changed = []
    for (module, name), value in _SEALED.items():
        now = vars(sys.modules[module]).get(name, None)
        same = now is value if callable(value) else now == value
        if not same:
            changed.append(f"{module}.{name}")
    return changed + [name for name, value in _relied_on_now().items() if value is not _BOUND[name]]


def raise_if_tampered() -> None:
    """GuardViolation (harness_access) naming what was replaced, when harness_tampering finds anything: before each
    timed round, off the clock, as well as at every trap's end."""
    tampered = harness_tampering()
    if tampered:
        raise GuardViolation(HARNESS_ACCESS, f"changed {', '.join(tampered)} while the harness ran experiment.attention")


@contextlib.contextmanager
def attention_trap(enabled: bool = True):
    """While set: other attention implementations, new streams and stream switches raise and are recorded;
    on exit the first recorded violation (or a patched harness function) is raised as GuardViolation."""
    if not enabled:
        yield None
        return
    seal_harness()
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


def observe_call(call: Callable[[], object], names: Sequence[str], sync, label: str,
                 inputs: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor | None]:
    """Run `call` and return its tensor outputs, named `names`, after checking they are plain tensors that
    are final when the call returns on the current stream, and that it left its `inputs` as they were; GuardViolation
    otherwise."""
    stream = sync.current_stream()
    threads = set(threading.enumerate())
    verify = gate.read_only(inputs or {})
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
    verify(label)  # (after the snapshots: reading the inputs must not wait for a side stream's writes to the outputs)
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


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when two tensors' storages overlap."""
    (da, sa, ea), (db, sb, eb) = _storage_span(a), _storage_span(b)
    return da == db and sa < eb and sb < ea and ea > sa and eb > sb


def _check_no_alias(label: str, outputs: dict[str, torch.Tensor], others: dict[str, torch.Tensor]) -> None:
    for name, value in outputs.items():
        for other_name, other in others.items():
            if value is not None and other is not None and shares_memory(value, other):
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


def row_reference(q, k, v, causal: bool, rows: torch.Tensor, dtype, dout=None, window_size=(-1, -1), softcap: float = 0.0):
    """Attention of some query rows only, computed in `dtype`: out (b, r, hq, dv), lse (b, hq, r), and with
    `dout` the rows' dQ (b, r, hq, d). Rows are independent, so this is exact for them at any sequence length. A
    sliding window and a soft-cap as the gate's reference applies them."""
    batch, seqlen_q, _, head_dim = q.shape
    seqlen_k, group = k.shape[1], q.shape[2] // k.shape[2]
    scale = 1.0 / math.sqrt(head_dim)
    rows = rows.to(q.device)
    windowed = any(side is not None and side >= 0 for side in window_size)
    mask = (gate.window_mask(rows, seqlen_q, seqlen_k, seqlen_k, causal, window_size) if windowed else
            gate.causal_mask(rows, seqlen_q, seqlen_k, seqlen_k) if causal else None)
    outs, lses, dqs = [], [], []
    with gate._fp32_matmul_exact(), torch.enable_grad():
        for b in range(batch):
            qc = q[b, rows].detach().to(dtype).requires_grad_(dout is not None)
            oc, lc = gate._attention_rows(qc, k[b].detach().to(dtype), v[b].detach().to(dtype), scale, mask, group, softcap)
            outs.append(oc.detach())
            lses.append(lc.detach())
            if dout is not None:
                dqs.append(torch.autograd.grad(oc, qc, dout[b, rows].to(dtype))[0])
    first, last = gate.key_range(rows, seqlen_q, seqlen_k, causal, window_size)
    valid = first <= last  # a row that sees no key has no LSE to compare
    valid = valid[None, None, :].expand(batch, q.shape[2], len(rows))
    return torch.stack(outs), torch.stack(lses), (torch.stack(dqs) if dout is not None else None), valid


def _pick_sequence(sizes, draw: int | None) -> int:
    """The sequence whose rows are checked: the largest (the first of equals) without a draw, else the draw-th of
    those with a key (modulo their count), so that a check drawn after the call may land on any of them."""
    if draw is None:
        return max(range(len(sizes)), key=lambda j: sizes[j])
    candidates = [j for j, size in enumerate(sizes) if size > 0] or [0]
    return candidates[draw % len(candidates)]


def rows_mismatch(q, k, v, causal, rows, *, out=None, lse=None, dout=None, dq=None, lengths=(), precision: str | None = None,
                  window_size=(-1, -1), softcap: float = 0.0, page_table=None, seqused_k=None, draw: int | None = None) -> str:
    """Sampled rows of out and lse (or of dq, with dout) against the reference of these inputs, by the gate's rule
    (the FP8 gate's for precision "fp8"): '' when they match, else why. A packed call's rows are one sequence's (the
    rows < its length), as a batch of one; a paged call's (forward only) one sequence's, gathered from the page pools.
    The sequence is the longest (most used keys) without `draw`, else the one `draw` picks (_pick_sequence): the
    check after timing draws it after the call, so no sequence is safe to skip."""
    if lengths:
        i = _pick_sequence(lengths, draw)
        part = slice(sum(lengths[:i]), sum(lengths[:i + 1]))
        q, k, v, out, dout, dq = (None if t is None else t[part][None] for t in (q, k, v, out, dout, dq))
        lse = None if lse is None else lse[:, part][None]
        rows = rows[rows < lengths[i]]  # row 0 is always sampled (sample_rows), and a picked sequence has a row
    if page_table is not None:
        used = seqused_k.tolist() if seqused_k is not None else [page_table.shape[1] * k.shape[1]] * q.shape[0]
        b = _pick_sequence(used, draw)
        k, v = (gate.gather_pages(pool, page_table[b], used[b])[None] for pool in (k, v))
        q, out = q[b:b + 1], None if out is None else out[b:b + 1]
        lse = None if lse is None else lse[b:b + 1]
    ref_out, ref_lse, ref_dq, valid = row_reference(q, k, v, causal, rows, torch.float32, dout, window_size, softcap)
    plain_out, plain_lse, plain_dq, _ = row_reference(q, k, v, causal, rows, q.dtype, dout, window_size, softcap)
    rows = rows.to(q.device)
    if precision == "fp8":
        found = fp8_gate.check(out.detach()[:, rows].float(), None if lse is None else lse.detach()[:, :, rows].float(),
                               ref_out, ref_lse)
        return "" if found.passed else found.reason
    if dq is not None:
        checks = [gate.compare("dq", dq[:, rows], ref_dq, plain_dq, q.dtype)]
    else:
        checks = [gate.compare("out", out.detach()[:, rows], ref_out, plain_out, q.dtype)]
        if lse is not None:
            checks.append(gate.compare("lse", lse.detach()[:, :, rows], ref_lse, plain_lse, q.dtype, valid=valid))
    failing = [c for c in checks if not c.passed]
    return failing[0].describe() if failing else ""


def _check_rows(label: str, q, k, v, causal, rows, **outputs) -> None:
    """rows_mismatch as a guard: GuardViolation (output_reuse) when the rows do not follow these inputs."""
    found = rows_mismatch(q, k, v, causal, rows, **outputs)
    if found:
        raise GuardViolation(OUTPUT_REUSE, f"{label}: does not match the reference of its own inputs: {found}")


def _forward_call(forward, q, k, v, causal, grad: bool, packed: dict | None = None):
    def call():
        with torch.set_grad_enabled(grad):
            return forward(q, k, v, causal, **(packed or {}))

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
    paged = gate.paging(problem, device, seed)  # a paged problem's table and used lengths, the same for the three calls
    packed = {**gate.packing(problem.lengths, device), **gate.call_arguments(problem), **paged}
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
        out, lse = observe_call(_forward_call(forward, q, k, v, problem.causal, False, packed), ("out", "lse"), sync, label,
                                {"q": q, "k": k, "v": v})
        _check_graph(label, out, inputs, recording=False)
        _check_no_alias(label, {"out": out, "lse": lse}, live)
        for earlier_label, earlier_out in previous:
            if _same_bits(out, earlier_out):
                raise GuardViolation(OUTPUT_REUSE, f"{label}: returned the same out as {earlier_label}, for other inputs")
        _check_rows(label, q, k, v, problem.causal, sample, out=out, lse=lse, lengths=problem.lengths, precision=problem.dtype,
                    **gate.call_arguments(problem), **paged)
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
    packed = {**gate.packing(problem.lengths, device), **gate.call_arguments(problem)}
    out, lse = observe_call(_forward_call(forward, q, k, v, problem.causal, True, packed), ("out", "lse"), sync, label,
                            {"q": q, "k": k, "v": v})
    _check_graph(label, out, (q, k, v), recording=True)
    _check_no_alias(label, {"out": out, "lse": lse}, {"q": q, "k": k, "v": v})
    _check_rows(label, q, k, v, problem.causal, sample, out=out, lse=lse, lengths=problem.lengths,
                **gate.call_arguments(problem))
    live = {"q": q, "k": k, "v": v, "dout": dout, "out": out, "lse": lse}
    previous = None
    for number in (1, 2):
        label = f"backward {number}" + (" (dout rewritten in place)" if number == 2 else "")
        if number == 2:
            generator = torch.Generator(device=device).manual_seed(seed + 3)
            dout.data.copy_(torch.randn(dout.shape, generator=generator, device=device, dtype=dout.dtype))

        def call():
            return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

        dq, dk, dv = observe_call(call, ("dq", "dk", "dv"), sync, label, {"q": q, "k": k, "v": v, "dout": dout})
        grads = {"dq": dq, "dk": dk, "dv": dv}
        _check_no_alias(label, grads, live)
        if previous is not None:
            for name in ("dk", "dv"):
                if _same_bits(grads[name], previous[name]):
                    raise GuardViolation(OUTPUT_REUSE, f"{label}: returned the same {name} as backward 1, for another dout")
        _check_rows(label, q, k, v, problem.causal, sample, dout=dout, dq=dq, lengths=problem.lengths,
                    **gate.call_arguments(problem))
        live.update({f"{name} of backward {number}": value for name, value in grads.items()})
        previous = grads


def check_candidate(forward, problem, direction: str, device, seed: int, *, sync=None, rows: int = SAMPLED_ROWS) -> None:
    """The run-time guards for one (problem, direction) of a candidate that passed the gate; GuardViolation if one fails."""
    sync = sync or sync_for(device)
    if direction == "fwd":
        check_forward_reuse(forward, problem, device, seed, sync, rows)
    else:
        check_backward_reuse(forward, problem, device, seed, sync, rows)


seal_harness()  # what is loaded now; the rest before experiment.py runs, or at the first trap
