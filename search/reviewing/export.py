"""`python -m search export`: the confirmed winners as a `git format-patch` patch for upstream flash-attention.

The patch is made against the pinned flash-attn-4 wheel's `flash_attn/cute/interface.py` (upstream's file at
that version): a pristine copy of the installed text is edited with exact replacements, each of which must
match once, and diffed. The edited interface
  - gets `_tile_size_fwd_sm120` (FwdConfig gains num_threads, num_stages, Q_in_regs), which `_get_fwd_config`
    calls for SM120, and `Sm120BwdConfig` / `_tile_size_bwd_sm120`, which `_flash_attn_bwd` reads instead of
    its hard-coded SM120 knobs; both are keyed on head_dim, causal and qhead_per_kvhead, and shapes that were
    not tuned keep the previous defaults;
  - passes num_threads, num_stages and Q_in_regs to FlashAttentionForwardSm120, with the last two added to the
    forward compile key, and runs the backward postprocess with the main kernel's thread count.
The commit message carries the evidence: device, mode, per-problem TFLOPS of the default and the winner, the
correctness gate, and the commands that reproduce the patch. A winner without the confirmations, or whose
gate record is missing or failed, is refused before anything is written.
"""

from __future__ import annotations

import difflib
import hashlib
import shlex
import textwrap
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

from fa4tune import emulated_occupancy
from fa4tune.config import FP8, BackwardConfig, ConfigError, ForwardConfig
from fa4tune.harness.measurement import ProblemResult
from fa4tune.kernel_class import backward_kernel, forward_kernel, upstream_class
from fa4tune.sm120_interface import (PINNED_FLASH_ATTN_VERSION, UPSTREAM_BWD_KNOBS, UPSTREAM_FWD_CONSTRUCTOR, bwd_knobs_from,
                                     fwd_constructor)
from fa4tune.targets import TARGETS
from search.reviewing import mask_fix
from search.reviewing.carry import SPLITKV, CarriedClass, apply_edits, carried, upstream_source, upstream_test
from search.reviewing.evidence import StudyEvidence, load_studies, mode_sentence
from search.space import get_space
from search.storing import schema
from search.storing.history import FINISHED, TrialRecord, winner

UPSTREAM_PATH = "flash_attn/cute/interface.py"
SUBJECT = "cute: tune SM120 forward and backward defaults per head_dim, causal and GQA"
AUTHOR = "fa4-tune <fa4-tune@users.noreply.github.com>"
WIDTH = 100  # commit message prose; tables and commands may be longer
# What the patch applies to. flash-attn-4 4.0.0b36 is the tag fa4-v4.0.0.beta36 (upstream's publish-fa4 workflow
# builds each fa4-v* tag with setuptools-scm, tag_regex "^fa4-v(?P<version>.+)$"). Its commit was looked up on
# 2026-12-01 in the stored snapshot of github:Dao-AILab/flash-attention by the blob hashes of the installed
# wheel's flash_attn/cute/*.py (`git hash-object`, then `git log --all --raw --no-abbrev`): the snapshot ends at
# fa4-v4.0.0.beta27 (0251105a, 2026-08-15) and holds no commit with the wheel's interface.py (blob below; the
# closest tree matched 20 of its 58 files), so the commit is not recorded here: UPSTREAM_COMMIT stays empty
# until it is (docs/measurements/2026-12-01-export-upstream-check.md). The blob identifies the file exactly.
UPSTREAM_TAG = "fa4-v4.0.0.beta36"
UPSTREAM_COMMIT = ""
UPSTREAM_INTERFACE_BLOB = "20636fa5d2e7ee4fb057d0b7c2637e45ee3b353d"  # git hash-object flash_attn/cute/interface.py
EMULATION_CAVEAT = ("Measured with SM120 kernels emulated on {gpus} (SM80 mma.sync code with SM120's 99 KB "
                    "shared-memory rule, timed on {that}), not on SM120 hardware: the winners are to be confirmed "
                    "on an RTX 5090 / RTX PRO 6000 before this is merged.")
OCCUPANCY_CAVEAT = ("Winners marked \"at <GPU>'s CTAs per SM\" were measured before fa4-tune reproduced SM120's occupancy "
                    "under emulation: that GPU then ran up to 3 CTAs per SM where SM120 runs one, which favours configs "
                    "with more shared memory (the others ran with each launch padded to SM120's CTAs per SM).")


@dataclass(frozen=True)
class Winner:
    """A study's winner that export accepted: confirmed, gated, upstream's kernel, feasible."""

    study: StudyEvidence
    trial: TrialRecord
    config: ForwardConfig | BackwardConfig
    confirmations: tuple[TrialRecord, ...]
    default: TrialRecord | None  # the measurement of upstream's previous default, when the study has one
    replaces: TrialRecord | None = None  # the study's winner, when this is its best upstream-kernel trial instead
    why: str = ""  # why the winner was replaced (a sentence for the commit message)

    @property
    def direction(self) -> str:
        return self.study.direction

    @property
    def carried(self) -> CarriedClass | None:
        """The class of ours the patch carries into upstream's tree for this winner, or None (upstream's kernel)."""
        return carried(self.config.kernel) if isinstance(self.config, ForwardConfig) else None

    @property
    def changed(self) -> bool:
        """False when upstream's previous default won: no dispatch entry is needed."""
        return self.config != get_space(self.direction).upstream(self.study.problem_class)


# ------------------------------------------------------------------------------------------------
# Choosing what to export.
# ------------------------------------------------------------------------------------------------


def select(storage, storage_text: str, target: str = "sm120", needed: int = 2, allow_replay: bool = False,
           classes: list[str] | None = None, directions: tuple[str, ...] = ("fwd", "bwd"),
           upstream_only: bool = False, leave_out: list[str] | None = None,
           decode: bool = False) -> tuple[list[Winner], list[str]]:
    """(the winner of every chosen study, notes on the studies left out); a one-line ConfigError for the first
    study that cannot be exported. `decode`: the decode classes too, a split-KV winner kept as it is (the series'
    patch 2 gives them a table of their own, chosen by the query length)."""
    studies = [ev for ev in load_studies(storage, target) if ev.direction in directions]
    if not studies:
        raise ConfigError("storage_empty", f"no search studies for target {target} in {storage_text}: run `python -m search run` first")
    if classes:
        unknown = sorted(set(classes) - {ev.problem_class.name for ev in studies})
        if unknown:
            have = ", ".join(sorted({ev.problem_class.name for ev in studies}))
            raise ConfigError("problem_class", f"no study of problem class {unknown[0]!r} for target {target} in {storage_text} (classes: {have})")
        studies = [ev for ev in studies if ev.problem_class.name in classes]
    notes = []
    for name in leave_out or []:
        matched = [ev for ev in studies if f"{ev.direction}:{ev.problem_class.name}" == name]
        if not matched:
            have = ", ".join(f"{ev.direction}:{ev.problem_class.name}" for ev in studies)
            raise ConfigError("leave_out", f"--leave-out {name!r} names no study (DIRECTION:CLASS, one of {have})")
        studies = [ev for ev in studies if ev not in matched]
        notes.append(f"{name}: left out (--leave-out).")
    fp8 = [ev for ev in studies if ev.problem_class.dtype == FP8]
    for ev in fp8:  # upstream's SM120 tables are keyed without the dtype, and upstream has no FP8 path on SM120
        notes.append(f"{ev.direction}:{ev.problem_class.name}: left out: an opt-in FP8 class, which upstream's SM120 path "
                     "does not run.")
    studies = [ev for ev in studies if ev not in fp8]
    left = [ev for ev in studies if ev.problem_class.regime not in (("prefill", "decode") if decode else ("prefill",))]
    for ev in left:
        # upstream's SM120 tables key on head_dim, causal and qhead_per_kvhead, not on the query length: a decode
        # class's entry would also pick the config for every prefill of that shape
        notes.append(f"{ev.direction}:{ev.problem_class.name}: left out: a {ev.problem_class.regime} class, and "
                     "upstream's SM120 tables do not key on the query length.")
    winners = [_accept(ev, needed, allow_replay, upstream_only, split_kv=decode) for ev in studies if ev not in left]
    _check_no_conflict(winners)
    return winners, notes


def _accept(ev: StudyEvidence, needed: int, allow_replay: bool, upstream_only: bool = False, split_kv: bool = False) -> Winner:
    leave_out = "(export the other studies with --problem-class)"
    if not ev.search_trials:
        raise ConfigError("study_empty", f"{ev.name}: the study has no finished trials: run `python -m search run` first {leave_out}")
    refuted = [c for c in ev.history if c.confirmation_of is not None and c.state in FINISHED and not c.confirmed]
    why = "; ".join(f"#{c.confirmation_of} refuted by its confirmation #{c.number}: {c.status}" + (f" ({c.reason})" if c.reason else "")
                    for c in refuted[:2])
    w = ev.winner()
    if w is None and refuted:
        raise ConfigError("gate_failed", f"{ev.name}: every config that passed was refuted when measured again ({why}) {leave_out}")
    if w is None:
        raise ConfigError("no_winner", f"{ev.name}: no trial passed the correctness gate, so there is no winner {leave_out}")
    head = f"{ev.name}: winner #{w.number}"
    space = get_space(ev.direction)
    config = space.config(w.config)
    if not _is_upstream(config):
        if upstream_only:
            return _upstream_fallback(ev, w, allow_replay, f"the winner #{w.number} uses kernel {config.kernel!r}; "
                                      "--upstream-kernels-only exports the best trial of upstream's kernel instead")
        forward = isinstance(config, ForwardConfig)
        if not forward and config.kernel == mask_fix.KERNEL:
            pass  # upstream's backward once mask.py is fixed: the patch carries the fix (mask_fix.files)
        elif not forward or (carried(config.kernel) is None and not (split_kv and is_split_kv(config) and ev.problem_class.regime == "decode")):
            return _upstream_fallback(ev, w, allow_replay, f"the winner #{w.number} uses kernel {config.kernel!r} "
                                      f"({_where(config)}), fa4-tune's own class, which the patch cannot carry")
    if w.evaluator == "replay" and not allow_replay:
        raise ConfigError("replayed_winner", f"{head} was replayed from a table, not measured by the harness (--allow-replay to export it anyway)")
    confirmed = ev.confirmed(w.number)
    if len(confirmed) < needed:
        raise ConfigError("unconfirmed_winner", f"{head} is confirmed {len(confirmed)} of {needed} times"
                          + (f" ({why})" if why else "") + ": run the same `python -m search run` again to confirm it"
                          + f", or leave the study out with --leave-out {ev.direction}:{ev.problem_class.name}")
    _check_gate(ev, head, (w, *confirmed))
    _check_feasible(ev, head, config)
    return Winner(ev, w, config, tuple(confirmed), ev.default())


def is_split_kv(config) -> bool:
    """Whether a config runs our split-KV class (carried by the series' patch 2 for the decode classes only)."""
    return isinstance(config, ForwardConfig) and config.kernel == SPLITKV.kernel


def _kernel_of(config: ForwardConfig | BackwardConfig) -> type:
    return (backward_kernel if isinstance(config, BackwardConfig) else forward_kernel)(config.kernel)


def _is_upstream(config: ForwardConfig | BackwardConfig) -> bool:
    return upstream_class(_kernel_of(config)) is not None


def _where(config: ForwardConfig | BackwardConfig) -> str:
    cls = _kernel_of(config)
    return f"{cls.__module__}.{cls.__qualname__}"


def _upstream_fallback(ev: StudyEvidence, w: TrialRecord, allow_replay: bool, why: str) -> Winner:
    """The study's best trial of an upstream kernel, in place of its winner `w`: its gate must have passed on every
    problem, each time it was measured; it need not be confirmed (the commit message says how often it was)."""
    space = get_space(ev.direction)
    upstream = [r for r in ev.history if _is_upstream(space.config(r.config))]  # trials and their confirmations
    best = winner(upstream)
    if best is None:
        raise ConfigError("no_upstream_trial", f"{ev.name}: {why}, and no trial of an upstream kernel passed the gate "
                          "(export the other studies with --problem-class)")
    head = f"{ev.name}: best upstream-kernel trial #{best.number}"
    if best.evaluator == "replay" and not allow_replay:
        raise ConfigError("replayed_winner", f"{head} was replayed from a table, not measured by the harness (--allow-replay to export it anyway)")
    confirmed = ev.confirmed(best.number)
    _check_gate(ev, head, (best, *confirmed))
    config = space.config(best.config)
    _check_feasible(ev, head, config)
    return Winner(ev, best, config, tuple(confirmed), ev.default(), replaces=w, why=why)


def _check_gate(ev: StudyEvidence, head: str, records) -> None:
    for r in records:
        for result in r.results or [ProblemResult("(none)", ev.direction, "no results")]:
            if result.status != "ok":
                raise ConfigError("gate_failed", f"{head}: trial #{r.number} did not pass the correctness gate on {result.problem!r} ({result.status})")
            if not result.max_errors:
                raise ConfigError("gate_missing", f"{head}: trial #{r.number} has no correctness-gate record for {result.problem!r}")


def _check_feasible(ev: StudyEvidence, head: str, config) -> None:
    target = TARGETS.get(ev.target)
    verdict = get_space(ev.direction).check(config, ev.problem_class, target) if target else None
    if verdict is not None and not verdict:
        raise ConfigError("infeasible_winner", f"{head} breaks a static rule as of now: {verdict}")


def upstream_kernel(config: ForwardConfig, head: str = "the config uses", leave_out: str = "") -> type:
    """The upstream class a forward config's kernel class runs unchanged (its `upstream`, fa4tune.kernel_class);
    ConfigError kernel_not_upstream for a class of our own, which the patch cannot carry."""
    cls = forward_kernel(config.kernel)
    upstream = upstream_class(cls)
    if upstream is None:
        raise ConfigError("kernel_not_upstream", f"{head} kernel {config.kernel!r} ({cls.__module__}.{cls.__qualname__}), "
                          f"fa4-tune's own class, which upstream does not have {leave_out}".rstrip())
    return upstream


def _check_no_conflict(winners: list[Winner]) -> None:
    """Upstream's tables do not key on dtype: two dtypes of one shape must agree."""
    seen: dict[tuple, Winner] = {}
    for w in winners:
        pc = w.study.problem_class
        key = (w.direction, pc.head_dim, pc.head_dim_v, pc.causal, pc.qhead_per_kvhead, pc.regime)
        other = seen.setdefault(key, w)
        if other is not w and other.config != w.config:
            raise ConfigError("dtype_conflict", f"{other.study.name} and {w.study.name} have different winners, and upstream's "
                              f"SM120 tables do not key on dtype: export one of them with --problem-class")


# ------------------------------------------------------------------------------------------------
# The code, in interface.py's own style.
# ------------------------------------------------------------------------------------------------


def _entries(winners: list[Winner], direction: str, regime: str = "prefill") -> dict[tuple, list[tuple[bool, tuple[int, ...], object, str]]]:
    """{(head_dim, head_dim_v): [(causal, qhead_per_kvhead values, config, comment)]}, changed winners of the regime only.

    Classes of one shape and causality with the same winner share an entry (GQA only where it matters).
    """
    grouped: dict[tuple, dict] = {}
    for w in sorted((w for w in winners if w.direction == direction and w.changed and w.study.problem_class.regime == regime),
                    key=lambda w: (w.study.problem_class.causal, w.study.problem_class.qhead_per_kvhead)):
        pc = w.study.problem_class
        by_config = grouped.setdefault((pc.head_dim, pc.head_dim_v), {})
        qheads, comments = by_config.setdefault((pc.causal, w.config), ([], []))
        if pc.qhead_per_kvhead not in qheads:
            qheads.append(pc.qhead_per_kvhead)
        comments.append(_speedup_comment(w))
    return {
        shape: [(causal, tuple(q), config, "; ".join(comments)) for (causal, config), (q, comments) in by_config.items()]
        for shape, by_config in sorted(grouped.items())
    }


def _speedup_comment(w: Winner) -> str:
    name = w.study.problem_class.name
    if w.default is None:
        return f"{name}; the previous default was not measured"
    return f"{name}: {w.trial.value / w.default.value:.2f}x the previous default"


def _condition(causal_name: str, causal: bool, qheads: tuple[int, ...]) -> str:
    gqa = f"qhead_per_kvhead == {qheads[0]}" if len(qheads) == 1 else f"qhead_per_kvhead in {tuple(sorted(qheads))}"
    return f"{causal_name} and {gqa}" if causal else f"not {causal_name} and {gqa}"


def _table_function(signature: str, doc: str, local: str, causal: str, entries: dict, render, fallback: list[str]) -> str:
    """A `_tile_size_*_sm120` function: one `if` per tuned shape and causality, then the previous defaults."""
    lines = [
        f"def {signature}:",
        f'    """{doc}',
        "",
        "    Tuned per (head_dim, causal, qhead_per_kvhead); every config fits SM120's 99 KB of SMEM.",
        "    Other shapes, and local attention, keep the previous defaults.",
        '    """',
    ]
    for (hd, hdv), shape_entries in entries.items():
        lines.append(f"    if not {local} and head_dim == {hd} and head_dim_v == {hdv}:")
        for is_causal, qheads, config, comment in shape_entries:
            lines += [f"        if {_condition(causal, is_causal, qheads)}:", f"            # {comment}", *render(config)]
    return "\n".join(lines + fallback) + "\n"


def forward_function(winners: list[Winner]) -> str:
    """`_tile_size_fwd_sm120`: the forward winners, then the previous heuristic for every other shape."""
    return _table_function(
        "_tile_size_fwd_sm120(head_dim, head_dim_v, is_causal, is_local, qhead_per_kvhead)", "Return FwdConfig for SM120 forward.",
        "is_local", "is_causal", _entries(winners, "fwd"),
        lambda c: [f"            return FwdConfig({c.tile_m}, {c.tile_n}, True, True, num_threads={c.num_threads}, "
                   f"num_stages={c.num_stages}, Q_in_regs={c.Q_in_regs}"
                   + "".join(f", {k.flag}=True" for k in [carried(c.kernel)] if k) + ")"],
        [
            "    # D<=64:  128x128 → 48 KB (good occupancy)",
            "    # D>64:   128x64  → 64 KB (128x128 would use 96 KB, hurting occupancy)",
            "    if head_dim > 64:",
            "        return FwdConfig(128, 64, True, True)",
            "    return FwdConfig(128, 128, True, True)",
        ],
    )


def backward_config_class() -> str:
    """The `Sm120BwdConfig` dataclass for upstream: BackwardConfig's fields, names and defaults (one source)."""
    knobs = [f"    {f.name}: {f.type} = {f.default!r}" for f in fields(BackwardConfig)  # f.type: the annotation text
             if f.name not in ("kernel", "extra")]  # the kernel class is ours to choose, upstream has one
    return "\n".join([
        "@dataclass(frozen=True)",
        "class Sm120BwdConfig:",
        '    """FlashAttentionBackwardSm120 knobs (SM80 MMA, 99 KB SMEM); the defaults are the previous ones."""',
        "",
        *knobs,
    ]) + "\n"


def backward_function(winners: list[Winner]) -> str:
    """`_tile_size_bwd_sm120`: the backward winners, then the previous defaults."""
    return _table_function(
        "_tile_size_bwd_sm120(head_dim, head_dim_v, causal, local, qhead_per_kvhead)", "Return Sm120BwdConfig for SM120.",
        "local", "causal", _entries(winners, "bwd"),
        lambda c: [
            "            return Sm120BwdConfig(",
            f"                m_block_size={c.m_block_size}, n_block_size={c.n_block_size},",
            f"                num_stages_Q={c.num_stages_Q}, num_stages_dO={c.num_stages_dO}, num_threads={c.num_threads},",
            f"                SdP_swapAB={c.SdP_swapAB}, dKV_swapAB={c.dKV_swapAB}, dQ_swapAB={c.dQ_swapAB},",
            f"                AtomLayoutMSdP={c.AtomLayoutMSdP}, AtomLayoutNdKV={c.AtomLayoutNdKV}, AtomLayoutMdQ={c.AtomLayoutMdQ},",
            f"                V_in_regs={c.V_in_regs},",
            "            )",
        ],
        [
            "    # 64x64 blocks, 128 threads (4 warps); 2 stages of Q and dO fit for D<=64",
            "    num_stages = 2 if head_dim <= 64 else 1",
            "    return Sm120BwdConfig(num_stages_Q=num_stages, num_stages_dO=num_stages)",
        ],
    )


def _carried_edits(c: CarriedClass) -> list[tuple[str, str, str]]:
    """The replacements that let an SM120 table entry select the carried class `c` (FwdConfig.<flag>)."""
    module, name = c.module, c.upstream_class
    return [
        (
            "from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120\n",
            f"from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120\nfrom {module} import {name}\n",
            f"{name} import",
        ),
        (
            "    num_threads: int = 128\n    num_stages: int = 1\n    Q_in_regs: bool = False\n\n\ndef _tile_size_fwd_sm90(",
            "    num_threads: int = 128\n    num_stages: int = 1\n    Q_in_regs: bool = False\n"
            f"    {c.flag}: bool = False  # SM120: {name} (Q/K/V tiles loaded by TMA) instead of FlashAttentionForwardSm120\n"
            "\n\ndef _tile_size_fwd_sm90(",
            f"FwdConfig.{c.flag}",
        ),
        (
            "        num_threads=cfg.num_threads, num_stages=cfg.num_stages, Q_in_regs=cfg.Q_in_regs,\n",
            f"        num_threads=cfg.num_threads, num_stages=cfg.num_stages, Q_in_regs=cfg.Q_in_regs, {c.flag}=cfg.{c.flag},\n",
            f"_get_fwd_config {c.flag}",
        ),
        (
            "    if arch // 10 == 12:\n        num_threads = fwd_cfg.num_threads\n",
            "    if arch // 10 == 12:\n        num_threads = fwd_cfg.num_threads\n"
            f"    # {name} was tuned and checked on dense batches: varlen and learnable sinks keep the previous class\n"
            f"    {c.flag} = (\n"
            f"        arch // 10 == 12 and fwd_cfg.{c.flag} and learnable_sink is None\n"
            "        and cu_seqlens_q is None and cu_seqlens_k is None and seqused_q is None and seqused_k is None\n"
            "    )\n",
            f"forward {c.flag}",
        ),
        (
            "        num_stages,\n        Q_in_regs,\n        is_split_kv,\n",
            f"        num_stages,\n        Q_in_regs,\n        {c.flag},\n        is_split_kv,\n",
            f"forward compile key {c.flag}",
        ),
        (
            fwd_constructor("FlashAttentionForwardSm120", "num_stages", "Q_in_regs"),
            fwd_constructor(f"({name} if {c.flag} else FlashAttentionForwardSm120)", "num_stages", "Q_in_regs"),
            f"forward SM120 constructor {c.flag}",
        ),
    ]


def carried_classes(winners: list[Winner]) -> list[CarriedClass]:
    """The classes of ours the changed winners use, each once."""
    found: dict[str, CarriedClass] = {}
    for w in winners:
        if w.changed and w.carried is not None:
            found.setdefault(w.carried.kernel, w.carried)
    return list(found.values())


def _edits(winners: list[Winner]) -> list[tuple[str, str, str]]:
    """(old, new, what) replacements of interface.py, in order; each old text must occur exactly once."""
    return _upstream_edits(winners) + [e for c in carried_classes(winners) for e in _carried_edits(c)]


def _upstream_edits(winners: list[Winner]) -> list[tuple[str, str, str]]:
    return [
        (
            "    q_stage: int = 1\n    num_splits: int = 1\n\n\ndef _tile_size_fwd_sm90(",
            "    q_stage: int = 1\n    num_splits: int = 1\n"
            "    # SM120 (SM80 MMA): MMA threads, cp.async K/V stages, Q kept in registers\n"
            "    num_threads: int = 128\n    num_stages: int = 1\n    Q_in_regs: bool = False\n\n\ndef _tile_size_fwd_sm90(",
            "FwdConfig fields",
        ),
        (
            "    return FwdConfig(tile_m, tile_n, cfg.mma_pv_is_rs, cfg.intra_wg_overlap)\n\n@dataclass(frozen=True)\nclass BwdConfig:",
            "    return FwdConfig(tile_m, tile_n, cfg.mma_pv_is_rs, cfg.intra_wg_overlap)\n\n\n"
            + forward_function(winners) + "\n\n@dataclass(frozen=True)\nclass BwdConfig:",
            "SM120 forward table",
        ),
        (
            "            AtomLayoutMSdP=1, AtomLayoutNdKV=1, AtomLayoutMdQ=1,\n        )\n\n\n\ndef _validate_tensor(",
            "            AtomLayoutMSdP=1, AtomLayoutNdKV=1, AtomLayoutMdQ=1,\n        )\n\n\n"
            + backward_config_class() + "\n\n" + backward_function(winners) + "\n\n\ndef _validate_tensor(",
            "SM120 backward table",
        ),
        (
            "        if arch // 10 == 12:\n"
            "            # SM120 tile sizes tuned for 99 KB SMEM capacity:\n"
            "            # D<=64:  128x128 → 48 KB (good occupancy)\n"
            "            # D>64:   128x64  → 64 KB (128x128 would use 96 KB, hurting occupancy)\n"
            "            if head_dim > 64:\n"
            "                cfg = FwdConfig(128, 64, True, True)\n",
            "        if arch // 10 == 12:\n"
            "            cfg = _tile_size_fwd_sm120(head_dim, head_dim_v, causal, local, qhead_per_kvhead)\n",
            "_get_fwd_config SM120 tiles",
        ),
        (
            "    return FwdConfig(tile_m, tile_n, mma_pv_is_rs, intra_wg_overlap, q_stage, num_splits)\n",
            "    return FwdConfig(\n"
            "        tile_m, tile_n, mma_pv_is_rs, intra_wg_overlap, q_stage, num_splits,\n"
            "        num_threads=cfg.num_threads, num_stages=cfg.num_stages, Q_in_regs=cfg.Q_in_regs,\n"
            "    )\n",
            "_get_fwd_config result",
        ),
        (
            "    # SM80/SM120: uses SM80 MMA, 128 threads (4 warps)\n    if arch // 10 in [8, 12]:\n        num_threads = 128\n",
            "    # SM80: uses SM80 MMA, 128 threads (4 warps). SM120 takes num_threads from fwd_cfg below.\n"
            "    if arch // 10 == 8:\n        num_threads = 128\n",
            "forward num_threads",
        ),
        (
            "    mma_pv_is_rs = fwd_cfg.mma_pv_is_rs\n    intra_wg_overlap = fwd_cfg.intra_wg_overlap\n",
            "    mma_pv_is_rs = fwd_cfg.mma_pv_is_rs\n    intra_wg_overlap = fwd_cfg.intra_wg_overlap\n"
            "    num_stages = fwd_cfg.num_stages\n    Q_in_regs = fwd_cfg.Q_in_regs\n"
            "    if arch // 10 == 12:\n        num_threads = fwd_cfg.num_threads\n",
            "forward SM120 knobs from fwd_cfg",
        ),
        (
            "        q_stage,\n        num_threads,\n        is_split_kv,\n",
            "        q_stage,\n        num_threads,\n        num_stages,\n        Q_in_regs,\n        is_split_kv,\n",
            "forward compile key",
        ),
        (
            UPSTREAM_FWD_CONSTRUCTOR,
            fwd_constructor("FlashAttentionForwardSm120", "num_stages", "Q_in_regs"),
            "forward SM120 constructor",
        ),
        (
            "        # SM120: uses SM80 MMA with 99 KB SMEM, 128 threads (4 warps).\n" + UPSTREAM_BWD_KNOBS,
            "        # SM120: uses SM80 MMA with 99 KB SMEM.\n"
            "        cfg = _tile_size_bwd_sm120(head_dim, head_dim_v, causal, local, num_head // k.shape[-2])\n"
            + bwd_knobs_from("cfg"),
            "backward SM120 knobs",
        ),
        (
            "        num_threads = 128\n        assert not (block_sparse_tensors is not None), \"Block sparsity backward not supported on SM 12.0\"",
            "        num_threads = cfg.num_threads\n        assert not (block_sparse_tensors is not None), \"Block sparsity backward not supported on SM 12.0\"",
            "backward num_threads",
        ),
        (
            "    # num_threads: SM90 derives from BwdConfig.num_wg, SM120 is set to 128 above,\n",
            "    # num_threads: SM90 derives from BwdConfig.num_wg, SM120 from Sm120BwdConfig above,\n",
            "backward num_threads comment",
        ),
        (
            "            num_threads_post_dKV = cfg.num_wg * 128\n        else:\n",
            "            num_threads_post_dKV = cfg.num_wg * 128\n"
            "        elif arch // 10 == 12:\n"
            "            # the postprocess reads dQ/dK/dV accumulators in the main kernel's MMA layout\n"
            "            num_threads_post_dQ = num_threads\n            num_threads_post_dKV = num_threads\n"
            "        else:\n",
            "backward postprocess threads",
        ),
    ]


def pristine_interface() -> str:
    """The installed wheel's interface.py; a one-line error unless it is the pinned flash-attn-4 version."""
    installed = version("flash-attn-4")
    if installed != PINNED_FLASH_ATTN_VERSION:
        raise ConfigError("upstream_version", f"the export is written for flash-attn-4 {PINNED_FLASH_ATTN_VERSION}, "
                          f"{installed} is installed: run `uv sync` (uv.lock pins it)")
    from importlib.util import find_spec

    spec = find_spec("flash_attn.cute")  # its location only: importing it would load torch and the DSL
    return (Path(spec.origin).parent / "interface.py").read_text()


def patch_interface(source: str, winners: list[Winner]) -> str:
    """interface.py with every edit applied (each checked to match exactly once)."""
    return apply_edits(source, _edits(winners))


# ------------------------------------------------------------------------------------------------
# The commit message and the patch.
# ------------------------------------------------------------------------------------------------


def _knobs(config) -> str:
    return " ".join(f"{name}={value}" for name, value in config.to_dict().items() if name != "kernel")


def _wrap(text: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, break_long_words=False, break_on_hyphens=False)


def _gate_summary(winners: list[Winner]) -> list[str]:
    """What the correctness gate checked, from the winners' and their confirmations' results."""
    worst, cases, seeds, checks = None, set(), set(), 0
    for w in winners:
        for r in (w.trial, *w.confirmations):
            for result in r.results:
                errors = result.max_errors or {}
                checks += 1
                cases.add(errors.get("gate_cases"))
                seeds.add(errors.get("gate_seed"))
                for name in ("out", "lse", "dq", "dk", "dv"):
                    tolerance = errors.get(f"{name}_tolerance")
                    if name in errors and tolerance:
                        ratio = errors[name] / tolerance
                        if worst is None or ratio > worst[0]:
                            worst = (ratio, name, errors[name], tolerance, w.study.problem_class.name)
    cases, seeds = sorted(c for c in cases if c is not None), sorted(s for s in seeds if s is not None)
    text = (
        "Correctness gate: fa4-tune's prepare.py with upstream's rule from tests/cute/test_flash_attn.py: against an "
        "fp32 reference, max|out - ref| <= 2 * max|out_pt - ref| + atol, where out_pt is plain PyTorch attention in "
        "the input precision; the same for the LSE and for dQ, dK, dV. Outputs are NaN-poisoned before the kernel "
        "runs, so an element left unwritten fails. Cases per problem: normal inputs, inputs x8, a sequence length "
        "that is not a tile multiple, random problems. "
        f"Every winner and each of its confirmations passed: {checks} (config, problem) checks"
        + (f", {'/'.join(map(str, cases))} gate cases each" if cases else "")
        + (f", gate seeds {', '.join(map(str, seeds))}" if seeds else "") + "."
    )
    if worst is not None:
        text += f" Closest to its tolerance: {worst[1]} error {worst[2]:.3g} of {worst[3]:.3g} ({worst[4]})."
    return _wrap(text)


def _evidence_table(winners: list[Winner]) -> list[str]:
    header = ("dir", "problem class", "problem", "default", "tuned", "speedup")
    rows = []
    for w in winners:
        default = w.default.tflops if w.default else {}
        for problem, tuned in w.trial.tflops.items():
            base = default.get(problem)
            rows.append((w.direction, w.study.problem_class.name, problem, f"{base:.1f}" if base else "not measured",
                         f"{tuned:.1f}", f"{tuned / base:.2f}x" if base else "-"))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    fmt = lambda row: "  " + "  ".join(c.ljust(widths[i]) if i < 3 else c.rjust(widths[i]) for i, c in enumerate(row)).rstrip()  # noqa: E731
    return [fmt(header), *(fmt(r) for r in rows)]


def _reproduce(winners: list[Winner], storage_url: str, export_argv: list[str], table: str | None,
               table_meta: dict | None) -> list[str]:
    """The commands: the search run (rebuilt from the studies' attributes) and this export, as invoked."""
    commits = sorted({w.study.user_attrs(w.trial.number).get(schema.GIT_COMMIT, "") for w in winners} - {""})
    proposers = {r.proposer for w in winners for r in w.study.search_trials}
    samplers = sorted(proposers & {"tpe", "gp", "random"}) or ["tpe"]
    directions = sorted({w.direction for w in winners})
    run = ["uv", "run", "python", "-m", "search", "run", "--storage", storage_url,
           "--direction", directions[0] if len(directions) == 1 else "both"]
    for name in sorted({w.study.problem_class.name for w in winners}):
        run += ["--problem-class", name]
    run += ["--target", winners[0].study.target, "--sampler", samplers[0],
            "--proposer", "claude" if "claude" in proposers else "none",
            "--n-trials", str(max(sum(1 for r in w.study.search_trials if r.evaluated) for w in winners)),
            "--confirmations", str(min((len(w.confirmations) for w in winners if w.replaces is None), default=2))]
    if {w.trial.evaluator for w in winners} == {"replay"}:
        run += ["--evaluator", "replay", "--table", table or (table_meta or {}).get("name") or "TABLE"]
    return [
        f"Reproduce (fa4-tune commit {', '.join(commits) or 'unknown'}; the search options are rebuilt from the studies):",
        "  " + shlex.join(run),
        "  " + shlex.join(export_argv),
    ]


def _measured(w: Winner, needed: int) -> str:
    """How often the exported trial was measured, and whether that meets the confirmation rule."""
    times = 1 + len(w.confirmations)
    state = "confirmed" if len(w.confirmations) >= needed else f"UNCONFIRMED ({len(w.confirmations)} of {needed} confirmations)"
    if replayed(w):  # a table's answer read again is no measurement: say so wherever the count is given
        return f"replayed {times} time{'s' if times > 1 else ''} from a recorded table (not measured), {state}"
    return f"measured {times} time{'s' if times > 1 else ''}, {state}{_occupancy_note(w)}"


def replayed(w: Winner) -> bool:
    """Whether the exported trial's numbers were replayed from a recorded table (`--allow-replay`), not measured."""
    return w.trial.evaluator == "replay"


def evidence_source(winners: list[Winner], table_meta: dict | None = None) -> str:
    """Where the evidence's numbers come from, for the sentences that introduce them."""
    if any(replayed(w) for w in winners):
        name = (table_meta or {}).get("name")
        return (f"replayed from the recorded table{f' {name}' if name else ''}, not measured by the harness "
                "(exported with --allow-replay)")
    return "measured in the same study by the same harness"


def _occupancy_note(w: Winner) -> str:
    """Where an emulated winner ran at the emulating GPU's own CTAs per SM (not the target's), the rows say so."""
    if w.study.occupancy(w.trial.number) != emulated_occupancy.DEVICE:
        return ""
    return f", at {w.study.source()[0] or 'the GPU'}'s CTAs per SM"


def _class_of(w: Winner) -> str:
    if is_split_kv(w.config):
        return SPLITKV.upstream_class
    if w.carried is not None:
        return w.carried.upstream_class
    return "FlashAttentionForwardSm120" if w.direction == "fwd" else "FlashAttentionBackwardSm120"


def caveat(winners: list[Winner], table_meta: dict | None = None) -> str:
    """The emulation caveat when any winner was measured (or recorded) in emulation, else ''."""
    sources = {w.study.source() for w in winners} | {((table_meta or {}).get("device"), (table_meta or {}).get("mode"))}
    gpus = sorted({device for device, mode in sources if mode == "emulated" and device})
    if not any(mode == "emulated" for _, mode in sources):
        return ""
    text = EMULATION_CAVEAT.format(gpus=" and ".join(gpus) or "another GPU",
                                   that="that GPU" if len(gpus) < 2 else "those GPUs")
    return text + " " + OCCUPANCY_CAVEAT if any(_occupancy_note(w) for w in winners) else text


def commit_message(winners: list[Winner], storage_url: str, export_argv: list[str],
                   table_meta: dict | None = None, table: str | None = None, needed: int = 2,
                   notes: list[str] | None = None, intro: list[str] | None = None) -> str:
    """The commit message: what changes (`intro`, paragraphs, in place of the tables' own), why, and the evidence."""
    target = TARGETS.get(winners[0].study.target)
    unchanged = [w.study.problem_class.name for w in winners if not w.changed]
    dtypes = sorted({w.study.problem_class.dtype for w in winners})
    lines = [line for i, p in enumerate(intro) for line in ([""] if i else []) + _wrap(p)] if intro else _wrap(
        "SM120 picked its forward tiles by head_dim alone and hard-coded every backward knob. Both now come from "
        "per-shape tables, _tile_size_fwd_sm120 and _tile_size_bwd_sm120, keyed on head_dim, causal and "
        "qhead_per_kvhead; shapes that were not tuned, and local attention, keep the previous defaults."
    ) + [""] + _wrap(
        "The interface passes every SM120 knob instead of hard-coding it: num_threads, num_stages and Q_in_regs "
        "reach FlashAttentionForwardSm120 through FwdConfig, and num_stages and Q_in_regs join the forward compile "
        "key, where they were missing (two configs that differ only there would share a compiled kernel). All "
        "backward knobs come from Sm120BwdConfig, and the dQ/dK/dV postprocess runs with the main kernel's thread "
        "count, since it reads the accumulators in that kernel's MMA layout."
    )
    for c in carried_classes(winners):
        users = ", ".join(w.study.problem_class.name for w in winners if w.changed and w.carried == c)
        lines += [""] + _wrap(
            f"New: {c.upstream_path}, {c.upstream_class}, a subclass of FlashAttentionForwardSm120 whose Q, K and V "
            "tiles arrive by TMA (one elected thread issues a bulk tensor copy per tile and arms an mbarrier with its "
            "bytes; K and V have num_stages buffers each, in the previous class's load order). The math, masking and "
            f"epilogue are unchanged. FwdConfig.{c.flag} selects it; _flash_attn_fwd builds it for SM120 when the "
            f"tuned entry says so, for dense batches (varlen and learnable sinks keep the previous class), and "
            f"{c.flag} joins the compile key. Its can_implement adds the mbarriers (8 B each, the storage rounded "
            f"up to 1024 B) to the shared memory and states its rules. {c.test_path} checks can_implement anywhere "
            f"and the outputs against attention_ref on SM120. Entries that use it: {users}."
        )
    if mask_fix.needed(winners):
        users = ", ".join(w.study.problem_class.name for w in winners if w.changed and w.config.kernel == mask_fix.KERNEL)
        lines += [""] + _wrap(
            f"Fixed: {mask_fix.PATH}. AttentionMask.apply_mask masks a row with the R2P trick, whose bit index "
            "(sm90_col_to_r2p_idx) assumes a thread's accumulator columns at 0, 1, 8, 9, 16, 17, ...: true with one "
            f"warp of the MMA along n. The backward entries of {users} put the S/dP MMA's warps along n "
            "(AtomLayoutMSdP below the warp count), where the columns step by 8 x warps along n and the causal mask "
            "cut the wrong ones (every such causal config failed the gate on dQ: 187 of 187 in fa4-tune's sweep). "
            "R2P now applies only where thread 0's columns are in that order (r2p_columns_ordered, known when the "
            "kernel is traced), else the masks traverse the columns as the code beside it already did; every config "
            f"upstream ran before keeps R2P. {mask_fix.TEST_PATH} checks the order for tiled MMAs with warps along m "
            "and along n. (fa4-tune measured these entries with a coordinate mask of its own, the same rule.)"
        )
    lines += ["", "Base", ""] + _wrap(
        f"Made against flash-attn-4 {PINNED_FLASH_ATTN_VERSION} (tag {UPSTREAM_TAG}"
        + (f", commit {UPSTREAM_COMMIT}" if UPSTREAM_COMMIT else "")
        + f"; flash_attn/cute/interface.py blob {UPSTREAM_INTERFACE_BLOB})."
    )
    lines += ["", "Evidence", ""]
    text = caveat(winners, table_meta)
    if text:
        lines += _wrap("CAVEAT: " + text) + [""]
    for device, mode in sorted({w.study.source() for w in winners}):
        hint = " (export --table PATH names them here.)" if mode == "replay" and not table_meta else ""
        lines += _wrap(f"Device: {device}. Mode: {mode}. {mode_sentence(device, mode, table_meta)}{hint}")
    if target is not None:
        lines.append(f"Target rules: {target.name}, {target.description}.")
    searched = [w for w in winners if w.replaces is None]
    lines += _wrap(
        "Search: one Optuna study per (direction, problem class); the objective is the geometric mean of TFLOPS "
        "over the class's problems"
        + (("; each winner was "
            + ("replayed from the table (not measured by the harness) " if any(w.trial.evaluator == "replay" for w in winners) else "re-measured ")
            + " or ".join(sorted({str(len(w.confirmations)) for w in searched})) + " times and confirmed within tolerance")
           if searched else "")
        + f". Tuned on {', '.join(dtypes)}; the tables do not key on dtype."
    )
    for w in winners:
        if w.replaces is not None:
            lines += _wrap(
                f"{w.direction} {w.study.problem_class.name}: {w.why}. Exported instead: its best trial of upstream's "
                f"kernel, #{w.trial.number}, {w.trial.value:.1f} TFLOPS (geomean) against the winner's "
                f"{w.replaces.value:.1f}; {_measured(w, needed)}."
            )
    same = "same study, same harness" if not any(replayed(w) for w in winners) else evidence_source(winners, table_meta)
    lines += ["", f"TFLOPS per problem, upstream's previous SM120 default and the exported config ({same}):", "",
              *_evidence_table(winners), "", "Exported configs:"]
    lines += [f"  {w.direction} {w.study.problem_class.name}: {_knobs(w.config)} ({_class_of(w)}; trial #{w.trial.number}, "
              f"{_measured(w, needed)})" for w in winners]
    if unchanged:
        lines += _wrap("The previous default won for " + ", ".join(unchanged) + ": no table entry.")
    if notes:
        lines += ["", "Not exported:", *(f"  {n}" for n in notes)]
    lines += ["", *_gate_summary(winners), "", *_reproduce(winners, storage_url, export_argv, table, table_meta)]
    return "\n".join(lines) + "\n"


def _blob_id(text: str) -> str:
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _diffstat(changes: list[tuple[str, int, int, bool]]) -> list[str]:
    """git's diffstat: a line per file (path, insertions, deletions, new file), the totals, the created files."""
    width = max(len(path) for path, *_ in changes)
    lines = []
    for path, added, removed, _ in changes:
        total = added + removed
        scale = min(1.0, 60 / total) if total else 1.0
        bar = "+" * max(1 if added else 0, round(added * scale)) + "-" * max(1 if removed else 0, round(removed * scale))
        lines.append(f" {path.ljust(width)} | {total} {bar}")
    added, removed = sum(c[1] for c in changes), sum(c[2] for c in changes)
    files = f"{len(changes)} file{'s' if len(changes) > 1 else ''} changed"
    lines.append(f" {files}, {added} insertions(+), {removed} deletions(-)")
    lines += [f" create mode 100644 {path}" for path, _, _, new in changes if new]
    return lines


def _file_diff(path: str, old: str | None, new: str) -> tuple[str, int, int]:
    """(the `diff --git` section of one file, insertions, deletions); old None: a new file."""
    diff = list(difflib.unified_diff((old or "").splitlines(keepends=True), new.splitlines(keepends=True),
                                     "/dev/null" if old is None else f"a/{path}", f"b/{path}"))
    added = sum(1 for line in diff[2:] if line.startswith("+"))
    removed = sum(1 for line in diff[2:] if line.startswith("-"))
    head = f"diff --git a/{path} b/{path}\n"
    if old is None:
        head += f"new file mode 100644\nindex 0000000000000..{_blob_id(new)[:12]}\n"
    else:
        head += f"index {_blob_id(old)[:12]}..{_blob_id(new)[:12]} 100644\n"
    return head + "".join(diff), added, removed


def format_patch(files: list[tuple[str, str | None, str]], message: str, subject: str = SUBJECT,
                 date: datetime | None = None) -> str:
    """A `git format-patch` style email: header, message, diffstat, the diff of each (path, old or None, new) file."""
    sections, changes = [], []
    for path, old, new in files:
        section, added, removed = _file_diff(path, old, new)
        sections.append(section)
        changes.append((path, added, removed, old is None))
    date = date or datetime.now(timezone.utc)
    body = "".join(sections)
    commit = hashlib.sha1((message + body).encode()).hexdigest()
    return "".join([
        f"From {commit} Mon Sep 17 00:00:00 2001\n",
        f"From: {AUTHOR}\n",
        f"Date: {date.strftime('%a, %d %b %Y %H:%M:%S %z')}\n",
        f"Subject: [PATCH] {subject}\n\n",
        message,
        "---\n",
        "\n".join(_diffstat(changes)) + "\n\n",
        body,
        "-- \nfa4-tune\n",
    ])


def patch_files(winners: list[Winner], old_interface: str) -> list[tuple[str, str | None, str]]:
    """(path, old text or None for a new file, new text) of every file the patch touches."""
    files = [(UPSTREAM_PATH, old_interface, patch_interface(old_interface, winners))]
    for c in carried_classes(winners):
        files += [(c.upstream_path, None, upstream_source(c)), (c.test_path, None, upstream_test(c))]
    return files + mask_fix.files(winners)

