"""Guardrails the harness enforces on experiment.py, so that a faster number is a faster kernel: the rules, the
static check of experiment.py's source and the harness pin. Nothing here imports torch: `python -m fa4tune.guards`
answers in a second, without a GPU.

Static, before anything runs (`check_module`, `check_source`): experiment.py's source, parsed with ast and
with import aliases resolved, may not reach another attention implementation (torch SDPA and its aten ops,
flex_attention, FA2/FA3, xformers, cuDNN attention, FA4's own dispatch and its SM90/SM100 kernels, which
SM120 cannot run), time itself, use side streams, defer work to threads or hooks, or reach the harness,
the import machinery, the environment or other processes. At run time, while the harness gates experiment.attention,
fa4tune.harness.runtime_guards watches the rest (the trap, output reuse, readiness, types, threads, streams).

The harness is one rule: prepare.py and every file under fa4tune/harness/. experiment.py may not import either
(`prepare`, `fa4tune.harness`); runtime_guards seals every loaded module of the package; and the pin
(`harness_changes`) holds the sha256 of each of its files, and of every project module they import (transitively,
function-level imports included: fa4tune.import_graph; experiment.py and kernels/ aside, the agent's, guarded not
pinned), in fa4tune/harness.sha256: run_experiment refuses to run when one differs, is missing or is new, unless
FA4TUNE_ALLOW_HARNESS_EDIT=1, and then every results.tsv row it writes says which files differ.

    uv run python -m fa4tune.guards            # check experiment.py and the harness pin (no GPU needed)
    uv run python -m fa4tune.guards --pin      # maintainers, after changing the harness: record its hashes
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from fa4tune import import_graph
from fa4tune.command_line import CommandParser

ROOT = Path(__file__).resolve().parents[2]
PIN_PATH = ROOT / "fa4tune" / "harness.sha256"  # beside the package, not in it: the pin is no file of the harness
ALLOW_HARNESS_EDIT = "FA4TUNE_ALLOW_HARNESS_EDIT"
# The harness, whose files decide what a measurement says: the script and the package, as files and as modules.
HARNESS_SCRIPT, HARNESS_DIR = "prepare.py", "fa4tune/harness"
HARNESS_MODULE, HARNESS_PACKAGE = "prepare", "fa4tune.harness"
# Modules outside the package that decide with the harness's numbers: what the agent keeps (issue 66). Pinned with
# their imports (results_tsv, the row writer and reader, is in the package).
DECIDING_MODULES = ("fa4tune.keep",)

OTHER_ATTENTION, SELF_TIMING, SIDE_STREAM, DEFERRED_WORK = "other_attention", "self_timing", "side_stream", "deferred_work"
HARNESS_ACCESS, OUTPUT_REUSE, OUTPUT_TYPE, NOT_READY = "harness_access", "output_reuse", "output_type", "not_ready"
HARNESS_EDIT, INPUT_WRITE, BELOW_MEMORY_FLOOR = "harness_edit", "input_write", "below_memory_floor"
WHY = {
    OTHER_ATTENTION: "experiment.py computes attention with its own SM120 kernels, never by calling another implementation",
    SELF_TIMING: "only the harness times kernels",
    SIDE_STREAM: "all work runs on the caller's current stream",
    DEFERRED_WORK: "no work (threads, timers, exit hooks) outlives the call",
    NOT_READY: "outputs are complete on the caller's current stream when the call returns",
    HARNESS_ACCESS: "experiment.py may not reach the harness (prepare.py, fa4tune.harness), the import machinery, the environment "
                    "or other processes",
    OUTPUT_REUSE: "every call computes its outputs from its own inputs, into fresh memory",
    OUTPUT_TYPE: "outputs are plain tensors, with an autograd graph only when one is recorded",
    HARNESS_EDIT: "prepare.py, the files of fa4tune/harness/ and the project modules they import are fixed",
    INPUT_WRITE: "q, k, v and dout are read-only to the candidate",
    BELOW_MEMORY_FLOOR: "no call is faster than reading its inputs and writing its outputs once at the device's memory bandwidth",
}


def _parser() -> CommandParser:
    """The command line's options (main() is at the end)."""
    parser = CommandParser(prog="python -m fa4tune.guards", description=(
        "Check experiment.py against the guardrails' static rules and the harness files against their pinned "
        "hashes (no GPU needed); the run-time guards run inside prepare.py."))
    parser.add_argument("experiment", nargs="?", default=str(ROOT / "experiment.py"), help="experiment file to check (default: experiment.py)")
    parser.add_argument("--pin", action="store_true", help="maintainers: record the sha256 of the harness files (prepare.py, fa4tune/harness/ "
                        "and every project module they import) in fa4tune/harness.sha256")
    return parser


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
        HARNESS_MODULE, HARNESS_PACKAGE, "fa4tune.guards", "fa4tune.static_check",  # the harness, its command line, the static check
        "importlib",
        "builtins", "gc", "inspect", "ctypes", "subprocess", "pty", "os.environ", "os.environb", "os.putenv", "os.unsetenv",
        "os.getenv", "os.system", "os.popen", "os.fork", "sys.modules", "sys.meta_path", "sys.path", "sys.path_hooks",
        "sys._getframe", "sys.settrace", "sys.setprofile", "sys.addaudithook",
        # frames and tracebacks: the harness's locals (the gate seed, the check's schedule) are one walk away (issue 66)
        "sys.exc_info", "sys.exception", "sys.last_traceback", "sys.last_exc", "sys._current_frames", "traceback",
        "logging.currentframe", "operator.attrgetter", "operator.methodcaller",
    ),
}
# FA2 is `flash_attn` (flash_attn_func & co.); FA4 lives in `flash_attn.cute`, whose SM120/SM80 building blocks
# are allowed, but not the kernels of architectures SM120 lacks (wgmma, tcgen05) nor FA4's own dispatch.
_FA4_PACKAGE = "flash_attn.cute"
_KERNEL_BUILDING_BLOCKS = (_FA4_PACKAGE, "cutlass")
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
    SIDE_STREAM: re.compile(r"StreamCreate|^ExternalStream$|^set_stream$|^StreamContext$|StreamWaitEvent|_cuda_setStream$|StreamFromPool"),
    # Frame, traceback and namespace attributes: how a candidate reads the harness's locals or reaches a module's dict.
    HARNESS_ACCESS: re.compile(r"^(tb_frame|tb_next|f_back|f_locals|f_globals|f_builtins|f_code|gi_frame|gi_code|cr_frame|ag_frame"
                               r"|__traceback__|__globals__|__closure__|__code__|__builtins__|__dict__|__subclasses__"
                               r"|__getattribute__|__setattr__|__delattr__|cell_contents|exc_info|_getframe|currentframe)$"),
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


def under(name: str, prefix: str) -> bool:
    """True when a dotted name is `prefix` or lies under it ('fa4tune.harness.gate' under 'fa4tune.harness')."""
    return name == prefix or name.startswith(prefix + ".")


def forbidden_rule(qualified: str) -> str | None:
    """The rule a dotted name breaks ('torch.nn.functional.scaled_dot_product_attention' -> other_attention), or None.
    PyTorch's private bindings (torch._C) are harness access: global numeric state the gate's plain reference uses
    (cuBLAS's reduced-precision reductions) and internals no kernel needs."""
    if under(qualified, "flash_attn"):
        if not under(qualified, _FA4_PACKAGE) or qualified.startswith(_FA4_FORBIDDEN_MODULE_PREFIXES):
            return OTHER_ATTENTION
    for rule, prefixes in _FORBIDDEN_DOTTED.items():
        if any(under(qualified, p) for p in prefixes):
            return rule
    for part in qualified.split("."):
        rule = _name_rule(part)
        if rule:
            return rule
    # last, so that a named rule under it comes first (torch._C._cuda_setStream is a side stream)
    return HARNESS_ACCESS if under(qualified, "torch._C") else None


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
        for node in ast.walk(tree):  # `c = torch.cuda`: c names what it was given, wherever it is used (issue 66)
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                value = self._dotted(node.value)
                if value is not None and value.split(".")[0] in self.imported_roots():
                    self.aliases[node.targets[0].id] = value

    def imported_roots(self) -> set[str]:
        """The top-level names the file's imports bind ('torch', 'os')."""
        return {dotted.split(".")[0] for dotted in self.aliases.values()}

    def _flag(self, rule: str | None, line: int, what: str) -> None:
        if rule and (rule, what) not in self.found:
            self.found[(rule, what)] = Violation(rule, self.path, line, what)

    def _dotted(self, node: ast.AST) -> str | None:
        """The dotted name an expression refers to, through import aliases and getattr with a constant name (None if it
        is not a name chain)."""
        parts = []
        while isinstance(node, ast.Attribute) or _constant_getattr(node):
            if isinstance(node, ast.Attribute):
                parts.append(node.attr)
                node = node.value
            else:
                parts.append(node.args[1].value)
                node = node.args[0]
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
        if node.id in self.aliases and not isinstance(node.ctx, ast.Store):
            self._flag(forbidden_rule(self.aliases[node.id]), node.lineno, self.aliases[node.id])

    def _imported(self, target: str | None) -> bool:
        return bool(target) and target.split(".")[0] in self.imported_roots()

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id not in self.aliases:
            if func.id in _FORBIDDEN_BUILTINS:
                self._flag(HARNESS_ACCESS, node.lineno, f"{func.id}()")
            elif func.id in _ATTRIBUTE_BUILTINS and len(node.args) >= 2:
                name = node.args[1]
                target = self._dotted(node.args[0])
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    what = f"{target}.{name.value}" if target else name.value
                    self._flag(forbidden_rule(what), node.lineno, f"{func.id}({target or '...'}, {name.value!r})")
                    if func.id in ("setattr", "delattr") and self._imported(target):
                        self._flag(HARNESS_ACCESS, node.lineno, f"{func.id}({target}, {name.value!r}) (an imported module's attribute)")
                elif func.id in ("setattr", "delattr") or self._imported(target):
                    # a computed name: getattr(torch.nn.functional, "scaled_" + "dot...") hides what it reaches; a computed
                    # getattr on the kernel's own objects (a dataclass's fields, a delegate) stays allowed
                    self._flag(HARNESS_ACCESS, node.lineno, f"{func.id}({target or '...'}, <computed name>)")
        self.generic_visit(node)

    def _assigned(self, targets, line: int) -> None:
        """An imported module's attribute as an assignment target (`os.urandom = ...`): the harness runs on those modules.
        FA4's cute package and the CuTe DSL are the kernels' own building blocks, which the harness does not run on: a
        kernel class may route one of their helpers while it traces (kernels/cmask_kregs_backward_sm120.py)."""
        for target in targets:
            for node in ast.walk(target):
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
                    dotted = self._dotted(node)
                    if (self._imported(dotted) and not forbidden_rule(dotted)
                            and not any(under(dotted, own) for own in _KERNEL_BUILDING_BLOCKS)):
                        self._flag(HARNESS_ACCESS, line, f"assignment to {dotted} (an imported module's attribute)")

    def visit_Assign(self, node: ast.Assign) -> None:
        self._assigned(node.targets, node.lineno)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._assigned([node.target], node.lineno)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._assigned([node.target], node.lineno)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        self._assigned(node.targets, node.lineno)
        self.generic_visit(node)


def _constant_getattr(node: ast.AST) -> bool:
    """getattr(x, "name") with a constant name: the same as x.name."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) == 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str))


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


def kernel_sources(root: Path | None = None) -> list[Path]:
    """kernels/*.py: the agent's kernel classes (promoted from experiment.py), checked like it, not pinned."""
    return sorted(((root or ROOT) / "kernels").glob("*.py"))


class Refused(Exception):
    """What `admit` refuses: one line per violation (the static rules, the pin), each `guard <rule>: ...`."""

    def __init__(self, lines: Sequence[str]):
        super().__init__("; ".join(lines))
        self.lines = list(lines)


def admission_refusals(experiment_path: str | Path, root: Path | None = None) -> list[str]:
    """Why the harness may not run this experiment file: the static rules on its source and on every kernels/
    source (before any of their code runs), and the pin of prepare.py and the harness (unless
    FA4TUNE_ALLOW_HARNESS_EDIT=1). [] when it may."""
    refusals = [str(v) for v in check_source(experiment_path)]
    for path in kernel_sources(root):
        refusals += [str(v) for v in check_source_text(path.read_text(), f"kernels/{path.name}")]
    changed = harness_changes(root) if root is not None else harness_changes()
    if changed and not harness_edit_allowed():
        refusals.append(harness_edit_error(changed))
    return refusals


def admit(experiment_path: str | Path, root: Path | None = None) -> None:
    """The one entry point every measuring path passes (fa4tune.harness.candidates.load_experiment calls it
    before experiment.py's code runs: prepare.py, experiment.py, search run / worker, the bench scripts, and
    each step child): raises Refused with admission_refusals' lines."""
    refusals = admission_refusals(experiment_path, root)
    if refusals:
        raise Refused(refusals)


# ------------------------------------------------------------------------------------------------
# Harness edits: hashes of the pinned files (prepare.py, fa4tune/harness/ and the project modules they import) against the pin.
# ------------------------------------------------------------------------------------------------


def unpinned_module(name: str) -> bool:
    """The project modules the harness runs but the pin leaves out: experiment.py and kernels/, the coding agent's
    (guarded by the rules above, not pinned)."""
    return name == "experiment" or under(name, "kernels")


def _measured_path_imports(root: Path) -> list[str]:
    """The project modules experiment.py and kernels/ import (fa4tune.api, fa4tune.sm120_interface: the host path
    every timed call runs), themselves aside: the agent's files are checked by the static rules, what they call
    into is pinned."""
    modules = import_graph.project_modules(root)
    known = set(modules)
    found = []
    for name, path in sorted(modules.items()):
        if unpinned_module(name):
            try:
                edges = import_graph.imports_of(name, path, known)
            except (SyntaxError, ValueError, UnicodeDecodeError):
                edges = []
            found += [edge.target for edge in edges if not unpinned_module(edge.target)]
    return sorted(set(found))


def harness_files(root: Path | None = None) -> list[str]:
    """The pinned files, relative to the root: prepare.py, then every file under fa4tune/harness/ in path order
    (bytecode caches aside), then fa4tune/keep.py (DECIDING_MODULES) and every other project module these,
    experiment.py or kernels/ import, transitively
    and at any depth (read with ast: fa4tune.import_graph.reachable), in path order; experiment.py and kernels/
    themselves aside (unpinned_module: the agent's, guarded by the static rules, not pinned)."""
    root = root or ROOT
    package = sorted(path.relative_to(root).as_posix() for path in (root / HARNESS_DIR).rglob("*")
                     if path.is_file() and "__pycache__" not in path.relative_to(root).parts)
    starts = [HARNESS_MODULE, *DECIDING_MODULES, *(import_graph.module_name(root / name, root) for name in package if name.endswith(".py"))]
    starts += _measured_path_imports(root)
    imported = sorted(path.relative_to(root).as_posix() for path in import_graph.reachable(starts, root, unpinned_module).values())
    return [HARNESS_SCRIPT, *package, *(name for name in imported if name != HARNESS_SCRIPT and name not in package)]


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


def write_pin(root: Path | None = None, pin_path: Path | None = None) -> list[str]:
    """Record the hash of every harness file (what `python -m fa4tune.guards --pin` does); the files pinned."""
    root, pin_path = root or ROOT, pin_path or PIN_PATH
    files = harness_files(root)
    pin_path.write_text("".join(f"{file_sha256(root / name)}  {name}\n" for name in files))
    return files


def harness_changes(root: Path | None = None, pin_path: Path | None = None) -> list[str]:
    """The harness files that differ from the pin: edited, new (not pinned) or gone (pinned, missing); all of them
    when there is no pin."""
    root = root or ROOT
    pins = read_pin(pin_path or PIN_PATH)
    files = harness_files(root)
    changed = [name for name in files if pins.get(name) != file_sha256(root / name)]
    return changed + [name for name in pins if name not in files]


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
        files = write_pin()
        print(f"pinned {len(files)} harness files in {PIN_PATH}")
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
