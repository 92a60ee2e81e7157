"""Configs and problems: frozen records whose field names are upstream's constructor knob names.

A `ForwardConfig` maps 1:1 onto `FlashAttentionForwardSm120(...)` (its `kernel` names the kernel class, and
`extra` holds that class's own knobs), a `BackwardConfig` onto `FlashAttentionBackwardSm120(...)`; a
`ProblemClass` is what a dispatch table is keyed on, and a `Problem` is one concrete attention call of a suite.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, fields
from typing import Any, Mapping

DTYPES = ("bf16", "fp16", "fp8")
# "fp8" is opt-in (issue 45): bf16 inputs and output, S = Q K^T on e4m3 tiles (K smoothed, per-tile scales) by a kernel
# class that quantizes (`quantizes`: kernels/fp8_forward_sm120.py), under the FP8 gate (fa4tune/harness/fp8_gate.py).
FP8 = "fp8"
# A problem with at most this many query tokens per sequence is a decode (one token, or a speculative draft's few):
# its class is the decode regime's. Issue #13's matrix gates split-KV at 1, 2 and 8 tokens; at 64 and more the
# query tiles alone fill the GPU and the prefill classes' configs apply.
DECODE_MAX_SEQLEN_Q = 16
# A causal prefill with at least this many keys per query token is a chunked prefill (a chunk of new tokens over a
# long KV cache, bottom-right aligned): the mask removes at most 1/(2 * ratio) of its scores, so it does nearly the
# work of a non-causal problem, and the causal classes' tiles, tuned where the mask halves the work, lose there
# (docs/measurements/2026-12-01-h200-table-vs-upstream.md: 0.85x upstream on sq 1024 over sk 4096, d128).
CHUNKED_MIN_KV_PER_Q = 2
REGIMES = ("prefill", "decode", "chunked")
SHORTEST_SOFTCAP = 50.0  # the soft-cap of a softcap class's shortest problem (Gemma 2's attention soft-cap)
NO_WINDOW = -1  # a window side that masks nothing (upstream's window_size (-1, -1), or None)
# A paged KV cache (vLLM-style block tables, issue 71): pages of a power-of-two number of tokens in this range; 0 in a
# class or problem means a contiguous cache.
PAGE_SIZES = (16, 256)


def check_page_size(page_size) -> None:
    """ConfigError (rule page_size) unless `page_size` is 0 (no pages) or a power of two in PAGE_SIZES' range."""
    low, high = PAGE_SIZES
    if (isinstance(page_size, bool) or not isinstance(page_size, int)
            or (page_size and (page_size & (page_size - 1) or not low <= page_size <= high))):
        raise ConfigError("page_size", f"a page holds a power of two of {low} to {high} tokens (0: no pages), got {page_size!r}")


def is_local(causal: bool, window_size_left: int | None, window_size_right: int | None) -> bool:
    """Whether a call's window masks as a sliding (local) window, as upstream's _resolve_causal_local_window decides:
    a left side >= 0, or a right side >= 0 without causal (causal with no left side is plain causal)."""
    left = NO_WINDOW if window_size_left is None else window_size_left
    right = NO_WINDOW if window_size_right is None else window_size_right
    return left >= 0 or (right >= 0 and not causal)


def regime_of(seqlen_q: int, seqlen_k: int | None = None, causal: bool = False) -> str:
    """'decode' for at most DECODE_MAX_SEQLEN_Q query tokens; 'chunked' for a causal problem with at least
    CHUNKED_MIN_KV_PER_Q keys per query token; else 'prefill'."""
    if seqlen_q <= DECODE_MAX_SEQLEN_Q:
        return "decode"
    if causal and seqlen_k is not None and seqlen_k >= CHUNKED_MIN_KV_PER_Q * seqlen_q:
        return "chunked"
    return "prefill"


class ConfigError(ValueError):
    """Bad input: names the rule that failed and the value that broke it."""

    def __init__(self, rule: str, message: str):
        super().__init__(f"{rule}: {message}")
        self.rule = rule


@functools.cache
def _knobs(cls) -> tuple[dict[str, dataclasses.Field], bool]:
    """A config class's fields but `extra`, by name, and whether it has `extra` (read once: searches build 10^5)."""
    return {f.name: f for f in fields(cls) if f.name != EXTRA}, any(f.name == EXTRA for f in fields(cls))


def _check_knobs(cls, names) -> None:
    """ConfigError naming the first unknown knob and listing the known ones."""
    known, has_extra = _knobs(cls)
    unknown = [name for name in names if name not in known and name != EXTRA]
    if unknown:
        own = "; a kernel class's own knobs go in extra={...}" if has_extra else ""
        raise ConfigError("unknown_knob", f"{cls.__name__} has no knob {unknown[0]!r} (knobs: {', '.join(known)}{own})")


EXTRA = "extra"  # a config's field for its kernel class's own knobs
UPSTREAM_BACKWARD_KERNEL = "sm120"  # the backward class that runs upstream's code (kernels/backward_sm120.py)
_EXTRA_TYPES = (bool, int, float, str)


def _from_mapping(cls, data: Mapping[str, Any]):
    """Builds a frozen config from a mapping, rejecting unknown knobs and wrong types by name.

    A config with an `extra` field (ForwardConfig) takes the names it does not know as its kernel class's own
    knobs: which ones that class has is fa4tune.feasibility's rule `kernel_knobs`, not the record's.
    """
    known, has_extra = _knobs(cls)
    unknown = sorted(set(data) - set(known))
    extra = {}
    if unknown and not has_extra:
        raise ConfigError("unknown_knob", f"{cls.__name__} has no knob {unknown[0]!r} (knobs: {', '.join(known)})")
    for name in unknown:
        value = data[name]
        if not isinstance(value, _EXTRA_TYPES):
            raise ConfigError("knob_type", f"{name} must be a number, a string or true/false, got {value!r}")
        extra[name] = value
    values: dict[str, Any] = {EXTRA: extra} if extra else {}
    for name, value in data.items():
        if name not in known:
            continue
        expected = known[name].type
        if expected == "bool":
            if not isinstance(value, bool):
                raise ConfigError("knob_type", f"{name} must be true or false, got {value!r}")
        elif expected == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError("knob_type", f"{name} must be an integer, got {value!r}")
        elif expected == "str":
            if not isinstance(value, str):
                raise ConfigError("knob_type", f"{name} must be a string, got {value!r}")
        values[name] = value
    return cls(**values)


class _Record:
    """Shared behaviour of the frozen records: dict round trip and a stable, complete key."""

    def __new__(cls, *args, **kwargs):
        # the dataclass __init__ would raise a bare TypeError for ForwardConfig(tile_k=32); name the knobs instead
        _check_knobs(cls, kwargs)
        return super().__new__(cls)

    def to_dict(self) -> dict[str, Any]:
        """All fields, in declaration order (JSON-ready)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]):
        """Inverse of to_dict; unknown knobs and wrong types raise ConfigError."""
        return _from_mapping(cls, data)

    def key(self) -> tuple:
        """Every field, in order: use it in any cache key so that no knob can be left out."""
        return (type(self).__name__,) + tuple(getattr(self, f.name) for f in fields(self))

    def short(self) -> str:
        """One compact line for tables and logs."""
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


class _KernelKnobs(_Record):
    """A config whose `kernel` names its kernel class (fa4tune.kernel_class) and whose `extra` holds that class's own
    knobs, as sorted (name, value) pairs (given as a dict, e.g. extra={"spare_kb": 1})."""

    def __post_init__(self):
        items = self.extra.items() if isinstance(self.extra, Mapping) else self.extra
        object.__setattr__(self, EXTRA, tuple(sorted((str(name), value) for name, value in items)))

    @property
    def extra_knobs(self) -> dict[str, Any]:
        """The kernel class's own knobs, by name (what reaches its constructor besides upstream's knobs)."""
        return dict(self.extra)

    def to_dict(self) -> dict[str, Any]:
        """Upstream's knobs and `kernel` in declaration order, then the class's own knobs (JSON-ready, flat)."""
        values = {name: getattr(self, name) for name in _knobs(type(self))[0]}
        return {**values, **dict(self.extra)}

    def key(self) -> tuple:
        """Every knob, the class's own ones as (name, value) pairs: use it in any cache key."""
        return (type(self).__name__,) + tuple(getattr(self, f.name) for f in fields(self) if f.name != EXTRA) + self.extra

    def short(self) -> str:
        """One compact line for tables and logs."""
        return " ".join(f"{name}={value}" for name, value in self.to_dict().items())


@dataclass(frozen=True)
class ForwardConfig(_KernelKnobs):
    """Knobs of the SM120 forward kernel (FlashAttentionForwardSm120 constructor names)."""

    tile_m: int = 128
    tile_n: int = 64
    num_threads: int = 128
    num_stages: int = 1
    Q_in_regs: bool = False
    # Which kernel class runs it: the `name` a class of kernels/ or experiment.py declares (fa4tune.kernel_class).
    kernel: str = "sm120"
    # That class's own knobs (its `knobs`), as sorted (name, value) pairs; given as a dict, e.g. extra={"spare_kb": 1}.
    extra: tuple = ()


@dataclass(frozen=True)
class BackwardConfig(_KernelKnobs):
    """Knobs of the SM120 backward kernel (FlashAttentionBackwardSm120 constructor names), its kernel class and that
    class's own knobs. `kernel` leaves to_dict() while it is upstream's ("sm120"), as every config stored before
    backward kernel classes existed has it, so that a stored study's configs and today's compare equal."""

    m_block_size: int = 64
    n_block_size: int = 64
    num_stages_Q: int = 1
    num_stages_dO: int = 1
    num_threads: int = 128
    SdP_swapAB: bool = False
    dKV_swapAB: bool = False
    dQ_swapAB: bool = False
    AtomLayoutMSdP: int = 4
    AtomLayoutNdKV: int = 4
    AtomLayoutMdQ: int = 4
    V_in_regs: bool = False
    # Which backward kernel class runs it (fa4tune.kernel_class.backward_kernels), and that class's own knobs.
    kernel: str = "sm120"
    extra: tuple = ()

    def to_dict(self) -> dict[str, Any]:
        values = super().to_dict()
        if values["kernel"] == UPSTREAM_BACKWARD_KERNEL:
            del values["kernel"]
        return values


@dataclass(frozen=True)
class ProblemClass(_Record):
    """What a config is tuned for: kernels specialise on these, not on batch or sequence length, except for two
    lines: a decode (at most DECODE_MAX_SEQLEN_Q query tokens) is a class of its own, since one query token over a
    long KV wants another kernel (split-KV) than a prefill does; and a chunked prefill (causal, at least
    CHUNKED_MIN_KV_PER_Q keys per query token) is one too, since its mask removes little of the work. A sliding window
    (`window`: a local mask, Mistral's and Gemma's) and a logit soft-cap (`softcap`: Gemma 2's tanh) are class
    dimensions too: the kernel compiles each in (is_local, a score_mod), and a window changes the work per row. So is
    a paged KV cache's page size (`page_size`, 0: contiguous): the kernel compiles its gather for it (a KV tile within
    one page, or each row from its own page)."""

    head_dim: int
    head_dim_v: int
    causal: bool
    qhead_per_kvhead: int = 1
    dtype: str = "bf16"
    regime: str = "prefill"
    window: bool = False
    softcap: bool = False
    page_size: int = 0

    def __post_init__(self):
        check_page_size(self.page_size)
        if self.dtype not in DTYPES:
            raise ConfigError("dtype", f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for name in ("head_dim", "head_dim_v"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % 8:
                raise ConfigError("head_dim_multiple_of_8", f"{name} must be a positive multiple of 8, got {value!r}")
        if self.qhead_per_kvhead < 1:
            raise ConfigError("gqa_ratio", f"qhead_per_kvhead must be >= 1, got {self.qhead_per_kvhead}")
        if self.regime not in REGIMES:
            raise ConfigError("regime", f"regime must be one of {', '.join(REGIMES)}, got {self.regime!r}")
        if self.regime == "chunked" and not self.causal:
            raise ConfigError("regime", "a chunked prefill is causal (bottom-right aligned); got regime 'chunked' with causal=False")

    @property
    def name(self) -> str:
        """Stable text id, e.g. 'd128-causal-gqa4-bf16', 'd128-noncausal-gqa4-decode-bf16' (a study name and a table key)."""
        hd = f"d{self.head_dim}" if self.head_dim == self.head_dim_v else f"d{self.head_dim}v{self.head_dim_v}"
        gqa = f"-gqa{self.qhead_per_kvhead}" if self.qhead_per_kvhead > 1 else ""
        regime = "" if self.regime == "prefill" else f"-{self.regime}"
        features = ("-window" if self.window else "") + ("-softcap" if self.softcap else "")
        features += f"-page{self.page_size}" if self.page_size else ""
        return f"{hd}-{'causal' if self.causal else 'noncausal'}{gqa}{features}{regime}-{self.dtype}"

    @classmethod
    def parse(cls, name: str) -> "ProblemClass":
        """Inverse of `name`."""
        parts = name.split("-")
        features: dict = {part: part in parts for part in ("window", "softcap")}
        pages = [part for part in parts if part.startswith("page")]
        parts = [part for part in parts if part not in features and part not in pages]
        try:
            if pages:
                features["page_size"] = int(pages[-1][4:])
            hd = parts[0][1:]
            head_dim, head_dim_v = (int(x) for x in hd.split("v")) if "v" in hd else (int(hd), int(hd))
            causal = {"causal": True, "noncausal": False}[parts[1]]
            gqa = int(parts[2][3:]) if parts[2].startswith("gqa") else 1
            regime = parts[-2] if parts[-2] in REGIMES else "prefill"
            dtype = parts[-1]
        except (IndexError, KeyError, ValueError):
            raise ConfigError("problem_class_name", f"cannot parse problem class {name!r} (expected e.g. d128-causal-gqa4-bf16)")
        return cls(head_dim, head_dim_v, causal, gqa, dtype, regime, **features)

    def shortest_problem(self) -> "Problem":
        """The class's shortest problem (one batch, one KV head): a decode of 1 query over 1 key, a chunked prefill
        of DECODE_MAX_SEQLEN_Q + 1 queries over CHUNKED_MIN_KV_PER_Q times as many keys, a prefill of
        DECODE_MAX_SEQLEN_Q + 1 over as many. A dispatch entry runs every problem of its class, this one too."""
        seqlen_q = 1 if self.regime == "decode" else DECODE_MAX_SEQLEN_Q + 1
        seqlen_k = CHUNKED_MIN_KV_PER_Q * seqlen_q if self.regime == "chunked" else seqlen_q
        return Problem(1, seqlen_q, seqlen_k, self.qhead_per_kvhead, 1, self.head_dim, self.head_dim_v, self.causal,
                       self.dtype, backward=False, name=f"{self.name} at seqlen_q={seqlen_q}, seqlen_k={seqlen_k}",
                       window_size_left=seqlen_k // 2 if self.window else NO_WINDOW,
                       softcap=SHORTEST_SOFTCAP if self.softcap else 0.0, page_size=self.page_size)


@dataclass(frozen=True)
class Problem(_Record):
    """One attention call: (batch, seqlen, heads, head_dim), causal or not, forward(+backward). With `lengths`, a packed
    (varlen) call of sequences end to end, each attending to itself: batch is their count, seqlen_q = seqlen_k the longest."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    num_heads: int
    num_heads_kv: int
    head_dim: int
    head_dim_v: int
    causal: bool
    dtype: str = "bf16"
    backward: bool = True
    name: str = ""
    lengths: tuple[int, ...] = ()
    window_size_left: int = NO_WINDOW  # a sliding window, as upstream's window_size: keys [i - left, i + right] of
    window_size_right: int = NO_WINDOW  # query i (bottom-right aligned), -1 for no limit on that side
    softcap: float = 0.0  # scores become softcap * tanh(scores / softcap) (0: none), as upstream's softcap
    # a paged KV cache (0: contiguous): each sequence's seqlen_k keys in pages of page_size tokens, found through a page
    # table (the harness shuffles the pages: fa4tune.harness.gate.paging); forward only, not packed
    page_size: int = 0

    def __post_init__(self):
        n = self.lengths
        if not isinstance(n, (list, tuple)) or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in n):
            raise ConfigError("packed_lengths", f"lengths must be a list of positive sequence lengths, got {n!r}")
        object.__setattr__(self, "lengths", tuple(n))
        if n and (self.batch, self.seqlen_q, self.seqlen_k) != (len(n), max(n), max(n)):
            raise ConfigError("packed_lengths", f"a packed problem's batch is its sequence count and seqlen_q = seqlen_k its longest "
                                                f"({len(n)}, {max(n)}, {max(n)}), got ({self.batch}, {self.seqlen_q}, {self.seqlen_k})")
        if self.num_heads_kv <= 0 or self.num_heads % self.num_heads_kv:
            raise ConfigError("gqa_ratio", f"num_heads ({self.num_heads}) must be a multiple of num_heads_kv ({self.num_heads_kv})")
        for name in ("batch", "seqlen_q", "seqlen_k", "num_heads"):
            if getattr(self, name) <= 0:
                raise ConfigError("problem_size", f"{name} must be positive, got {getattr(self, name)}")
        for side in ("window_size_left", "window_size_right"):
            value = getattr(self, side)
            if isinstance(value, bool) or not isinstance(value, int) or value < NO_WINDOW:
                raise ConfigError("window_size", f"{side} must be an integer >= -1 (-1: no limit), got {value!r}")
        if isinstance(self.softcap, bool) or not isinstance(self.softcap, (int, float)) or self.softcap < 0:
            raise ConfigError("softcap", f"softcap must be a number >= 0 (0: none), got {self.softcap!r}")
        check_page_size(self.page_size)
        if self.page_size and (self.backward or self.lengths):
            raise ConfigError("paged_forward_only", f"a paged KV cache (page_size={self.page_size}) is a forward problem of "
                                                    "padded sequences: backward must be false and lengths empty")
        self.problem_class  # validates head dims and dtype

    @property
    def problem_class(self) -> ProblemClass:
        """The class this problem dispatches on."""
        return ProblemClass(self.head_dim, self.head_dim_v, self.causal, self.num_heads // self.num_heads_kv, self.dtype,
                            regime_of(self.seqlen_q, self.seqlen_k, self.causal),
                            window=is_local(self.causal, self.window_size_left, self.window_size_right),
                            softcap=self.softcap > 0, page_size=self.page_size)

    @property
    def label(self) -> str:
        """Human label, e.g. 'b1 s8192 h16 d128 causal'."""
        if self.name:
            return self.name
        s = f"s{self.seqlen_q}" if self.seqlen_q == self.seqlen_k else f"sq{self.seqlen_q} sk{self.seqlen_k}"
        h = f"h{self.num_heads}" if self.num_heads == self.num_heads_kv else f"hq{self.num_heads}/hkv{self.num_heads_kv}"
        if self.lengths:
            s = f"packed {len(self.lengths)} seqs {sum(self.lengths)} tokens (longest {self.seqlen_q})"
        window = (f" window ({self.window_size_left}, {self.window_size_right})"
                  if is_local(self.causal, self.window_size_left, self.window_size_right) else "")
        softcap = f" softcap {self.softcap:g}" if self.softcap else ""
        paged = f" paged {self.page_size}" if self.page_size else ""
        return (f"{s if self.lengths else f'b{self.batch} {s}'} {h} d{self.head_dim} {'causal' if self.causal else 'non-causal'}"
                f"{window}{softcap}{paged}")
