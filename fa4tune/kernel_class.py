"""The kernel-class protocol: what a forward or backward kernel class declares about itself, and the registries that
find them (a backward class, `BackwardKernel`, declares what a forward one does; `backward_kernels` finds those).

A forward kernel class (a subclass of `ForwardKernel` and of upstream's SM120 forward; in practice of
kernels.tuned_forward_sm120.TunedForwardSm120, upstream's own) declares:
  - `name`: the value of a ForwardConfig's `kernel` knob that selects it;
  - `knobs`: its own constructor knobs beyond upstream's, with their search domains (a config carries them in `extra`);
  - `limits`: what it runs besides its shared memory (stages, threads, head dims, causal, GQA, sequence lengths);
  - `smem_bytes(config, problem_class)`: its shared storage in bytes, with a breakdown; the static check rejects a
    class whose compiled storage is larger (`smem_understated`);
  - `can_implement(config, problem_class, target)`: every other rule, as a fa4tune.feasibility Verdict;
  - `upstream`: the upstream class it runs unchanged, which export can write into upstream's interface;
  - optionally `varlen` (read from the class itself, never inherited; default False): it runs packed batches of
    mixed lengths (cu_seqlens; bench/varlen.py gates them per sequence); a varlen call runs another class where False;
  - optionally `features` (read from the class itself, never inherited; default none): the call features its code
    runs, of FEATURES: a sliding window, a soft-cap, seqused_k, seqused_q, a page table (the page size a constructor
    knob) and a learnable sink; a class lacking one never serves such a class, and such a call runs another config;
  - optionally `quantizes` (default False): True for a class that takes bf16 inputs and computes in FP8
    (fa4tune.fp8's host path runs it); it runs the opt-in "fp8" problem classes, and no other class runs those;
  - optionally `searched` (default True): False keeps the class out of the search's `kernel` domain while dispatch
    entries, the static check and the bench scripts still run it (a class no measurement has found winning);
  - optionally `regimes` (default all of fa4tune.config.REGIMES): the regimes whose problem classes' search spaces
    offer the class (split-KV: decode and chunked); dispatch entries and bench scripts still run it anywhere;
  - optionally, per problem (defaults: OK, 1, None): `can_implement_problem(config, problem, target)`, rules that need
    the sequence lengths (fa4tune.feasibility.check_forward_problem runs it before any compile);
    `num_splits_for(config, problem, num_sms)`, the KV splits it runs a problem with (above 1 the host path
    allocates fp32 partial O/LSE with a leading split mode and merges them with upstream's combine kernel);
    `static_problem(problem_class)`, the shape the static check compiles it for (None: fa4tune.fake_compile's).
fa4tune.feasibility, the search space, the static check, the host path and export read these, never a name.

The registry: our classes in kernels/ (one per file), then experiment.py's, each under the `name` it declares (one
that declares none is a base). The registry never loads experiment.py: it takes the module loaded as `experiment`
(fa4tune.harness.candidates.load_experiment puts it there), else asks the loader handed to `register_loader` (the
harness's), else holds our classes alone. experiment.py may import this module (it declares, it does not measure).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, ClassVar

from fa4tune.config import REGIMES, BackwardConfig, ConfigError, ForwardConfig
from fa4tune.verdict import OK

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "kernels"  # ours, at the project root, one class per file


@dataclass(frozen=True)
class Limits:
    """What a kernel class runs, besides its shared memory; fa4tune.feasibility checks each under its own rule."""

    num_stages: tuple[int, ...] = (1, 2, 3, 4)  # num_stages_domain
    num_threads: tuple[int, ...] | None = None  # num_threads_domain; None: any multiple of 32 up to 512
    head_dim: tuple[int, int] = (8, 256)  # head_dim_domain: the range of head_dim and head_dim_v
    causal: bool = True  # causal_supported: runs causal problems
    gqa: bool = True  # gqa_supported: runs qhead_per_kvhead > 1
    seqlen_q: tuple[int, int | None] = (1, None)  # seqlen_q_domain: (min, max or None), per problem
    seqlen_k: tuple[int, int | None] = (1, None)  # seqlen_k_domain


class ForwardKernel:
    """The protocol a forward kernel class implements (a mixin: put it before upstream's class in the bases)."""

    name: ClassVar[str] = ""
    knobs: ClassVar[dict[str, tuple]] = {}
    limits: ClassVar[Limits] = Limits()
    upstream: ClassVar[type | None] = None  # read from the class itself only: a subclass changes the code
    varlen: ClassVar[bool] = False  # runs packed batches (cu_seqlens); read from the class itself only, as `upstream`
    searched: ClassVar[bool] = True  # in the search's `kernel` domain (False: dispatch entries and benches only)
    regimes: ClassVar[frozenset[str]] = frozenset(REGIMES)  # the regimes whose classes' spaces offer it (inherited)
    quantizes: ClassVar[bool] = False  # takes bf16 q, k, v and computes in FP8: runs the fp8 classes and only those
    features: ClassVar[frozenset[str]] = frozenset()  # of FEATURES; read from the class itself only, as `varlen`

    @classmethod
    def smem_bytes(cls, config: ForwardConfig, problem_class) -> tuple[int, str]:
        """The bytes of the shared storage the kernel launches with, and a breakdown for messages."""
        raise NotImplementedError(f"{cls.__name__} declares no shared-memory formula (smem_bytes)")

    @classmethod
    def can_implement(cls, config: ForwardConfig, problem_class, target):
        """The class's rules beyond `limits` and its shared memory: fa4tune.feasibility.OK or the failing Verdict."""
        return OK

    @classmethod
    def can_implement_problem(cls, config: ForwardConfig, problem, target):
        """The class's rules for one problem (its sequence lengths): fa4tune.feasibility.OK or the failing Verdict."""
        return OK

    @classmethod
    def num_splits_for(cls, config: ForwardConfig, problem, num_sms: int) -> int:
        """How many KV splits the class runs `problem` with on `num_sms` SMs; 1: no split-KV (upstream's path)."""
        return 1

    @classmethod
    def static_problem(cls, problem_class):
        """The Problem the static check compiles the class for (None: fa4tune.fake_compile.static_shape's)."""
        return None


class BackwardKernel:
    """The protocol a backward kernel class implements (a mixin before upstream's SM120 backward in the bases; in
    practice a subclass of kernels.backward_sm120.BackwardSm120, upstream's code with the packed GQA fix): `name`
    (a BackwardConfig's `kernel`), `knobs` (its own constructor knobs, in BackwardConfig.extra), `limits` (num_stages:
    the domain of num_stages_Q and num_stages_dO), `smem_bytes`, `can_implement`, `upstream`, `searched` and `regimes`, as for a
    forward class. fa4tune.feasibility.check_backward applies them after upstream's backward rules, which every class
    built on upstream's code inherits except the gate-measured ones its code fixes (`fixes`). `call_knobs`: knobs the
    call sets, never the search (`deterministic`), in `extra` where set, else their domain's first value."""

    name: ClassVar[str] = ""
    knobs: ClassVar[dict[str, tuple]] = {}
    limits: ClassVar[Limits] = Limits(num_stages=(1, 2))
    upstream: ClassVar[type | None] = None
    searched: ClassVar[bool] = True
    regimes: ClassVar[frozenset[str]] = frozenset(REGIMES)
    fixes: ClassVar[frozenset[str]] = frozenset()  # upstream's backward rules (feasibility) its own code makes moot
    call_knobs: ClassVar[dict[str, tuple]] = {}  # knobs the call sets (absent: the first value); never searched
    features: ClassVar[frozenset[str]] = frozenset()  # of FEATURES, as a forward class's; read from the class itself

    @classmethod
    def smem_bytes(cls, config, problem_class) -> tuple[int, str]:
        """The bytes of the shared storage the kernel launches with, and a breakdown for messages."""
        raise NotImplementedError(f"{cls.__name__} declares no shared-memory formula (smem_bytes)")

    @classmethod
    def can_implement(cls, config, problem_class, target):
        """The class's rules beyond `limits`, upstream's backward rules and its shared memory."""
        return OK


def runs_varlen(cls: type) -> bool:
    """Whether the class itself declares that it runs packed batches (cu_seqlens); a subclass changes the code, so
    the declaration is never inherited."""
    return cls.__dict__.get("varlen", False) is True


# call features a kernel class may declare it runs (`features`); "learnable_sink": gpt-oss's per-head sink logit
FEATURES = ("local", "softcap", "seqused", "seqused_q", "paged", "learnable_sink")


def runs_features(cls: type) -> frozenset[str]:
    """The call features (FEATURES) the class itself declares it runs; never inherited: a subclass changes the code."""
    declared = frozenset(cls.__dict__.get("features", ()))
    if declared - set(FEATURES):
        raise ConfigError("kernel_features", f"{cls.__name__} declares features {sorted(declared - set(FEATURES))}, "
                                             f"not among {', '.join(FEATURES)}")
    return declared


def class_features(problem_class) -> frozenset[str]:
    """The features a problem class's calls need of a kernel class (its window, softcap and page-size dimensions)."""
    needs = (("local", problem_class.window), ("softcap", problem_class.softcap), ("paged", problem_class.page_size))
    return frozenset(name for name, needed in needs if needed)


def upstream_class(cls: type) -> type | None:
    """The upstream class `cls` runs unchanged (declared on `cls` itself, never inherited), or None."""
    return cls.__dict__.get("upstream")


_LOADER: list[Callable[[], object]] = []  # the loader handed over last (register_loader)


def register_loader(load: Callable[[], object]) -> None:
    """Hand the registry the way this process loads experiment.py (`load()` returns the module), used when no module
    is loaded as `experiment` yet; the registry itself never loads it."""
    _LOADER[:] = [load]


def experiment_module():
    """The experiment module: the one loaded as `experiment`; else what the registered loader returns; else None (no
    loader: our classes alone)."""
    module = sys.modules.get("experiment")
    if module is None and _LOADER:
        module = _LOADER[0]()
    return module


_FOUND: dict[tuple, tuple[object, dict[str, type]]] = {}  # (protocol, id(experiment module)) -> (module, registry)


def _registry(protocol: type, config_class: type, module) -> dict[str, type]:
    module = experiment_module() if module is None else sys.modules[module] if isinstance(module, str) else module
    found = _FOUND.get((protocol, id(module)))
    if found is not None and found[0] is module:
        return found[1]
    registry: dict[str, type] = {}
    for cls in [*_package_classes(protocol), *(_defined_in(module, protocol) if module is not None else [])]:
        _check_declaration(cls, config_class)
        other = registry.setdefault(cls.name, cls)
        if other is not cls:
            raise ConfigError("kernel_name_taken", f"{_where(cls)} and {_where(other)} both declare name = {cls.name!r}")
    _FOUND[(protocol, id(module))] = (module, registry)
    return registry


def forward_kernels(module=None) -> dict[str, type]:
    """name -> forward kernel class: ours in kernels/, then those `module` (default: experiment_module(); a module
    or its name, as experiment.py passes `__name__`) defines; with no experiment module, ours alone."""
    return _registry(ForwardKernel, ForwardConfig, module)


def backward_kernels(module=None) -> dict[str, type]:
    """name -> backward kernel class, found as forward_kernels finds the forward ones."""
    return _registry(BackwardKernel, BackwardConfig, module)


def forward_kernel(name: str, module=None) -> type:
    """The forward kernel class registered under `name`; ConfigError kernel_known otherwise."""
    return _named(forward_kernels(module), name, "kernel")


def backward_kernel(name: str, module=None) -> type:
    """The backward kernel class registered under `name`; ConfigError kernel_known otherwise."""
    return _named(backward_kernels(module), name, "backward kernel")


def _named(registry: dict[str, type], name: str, what: str) -> type:
    if name not in registry:
        raise ConfigError("kernel_known", f"{what} {name!r} is not one of {', '.join(registry)} (the kernel classes of kernels/ and experiment.py)")
    return registry[name]


def source_files() -> list[Path]:
    """The protocol's and our kernel classes' sources (caches of compiled kernels and static facts key on them)."""
    return [Path(__file__).resolve(), *sorted((ROOT / PACKAGE).glob("*.py"))]


def _package_classes(protocol: type) -> list[type]:
    package = importlib.import_module(PACKAGE)
    classes = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        classes += _defined_in(importlib.import_module(f"{PACKAGE}.{info.name}"), protocol)
    return sorted(classes, key=lambda cls: cls.name)


def _defined_in(module, protocol: type) -> list[type]:
    """The `protocol` classes a module defines (not imports), in definition order, each with a name of its own."""
    return [value for value in vars(module).values()
            if isinstance(value, type) and issubclass(value, protocol) and value.__module__ == module.__name__
            and "name" in value.__dict__]


def _where(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_declaration(cls: type, config_class: type) -> None:
    """A declaration the registry can use: a name, knob domains that do not shadow upstream's knobs, Limits."""
    def bad(message: str) -> ConfigError:
        return ConfigError("kernel_class_declaration", f"{_where(cls)}: {message}")

    if not isinstance(cls.name, str) or not cls.name.isidentifier():
        raise bad(f"name must be an identifier-like string (the `kernel` knob's value), got {cls.name!r}")
    base_knobs = {f.name for f in fields(config_class)}
    call_knobs = getattr(cls, "call_knobs", {})
    for kind, knobs, taken in (("knob", cls.knobs, base_knobs), ("call knob", call_knobs, {*base_knobs, *cls.knobs})):
        for knob, domain in dict(knobs).items():
            if knob in taken:
                raise bad(f"{kind} {knob!r} is one of {config_class.__name__}'s own knobs or the class's; declare it once")
            if not isinstance(domain, tuple) or not domain or not all(isinstance(v, (bool, int, float, str)) for v in domain):
                raise bad(f"{kind} {knob!r} needs a non-empty tuple of numbers, strings or booleans as its domain, got {domain!r}")
    if not isinstance(cls.limits, Limits):
        raise bad(f"limits must be a fa4tune.kernel_class.Limits, got {type(cls.limits).__name__}")
    if not isinstance(cls.searched, bool):
        raise bad(f"searched must be True or False (whether the search draws the class), got {cls.searched!r}")
    if not isinstance(cls.regimes, frozenset) or not cls.regimes or not cls.regimes <= set(REGIMES):
        raise bad(f"regimes must be a non-empty frozenset of {', '.join(REGIMES)} (where the search offers the class), "
                  f"got {cls.regimes!r}")
    fixes = getattr(cls, "fixes", frozenset())
    if not isinstance(fixes, frozenset) or not all(isinstance(rule, str) for rule in fixes):
        raise bad(f"fixes must be a frozenset of rule names (fa4tune.feasibility.GATE_RULES), got {fixes!r}")
