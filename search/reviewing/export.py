"""`python -m search export`: the confirmed winners as a `git format-patch` patch for upstream flash-attention.

The patch is made against the pinned flash-attn-4 wheel's `flash_attn/cute/config.py` and `interface.py`
(upstream's files at that version): a pristine copy of the installed text is edited with exact replacements,
each of which must match once, and diffed. Written in config.py's own way (b40 keeps every per-arch choice there):
  - config.py: FwdConfig gains num_threads, num_stages and Q_in_regs (neutral elsewhere, validate_fwd_config
    says so); `select_sm120_fwd_tile` (an `Sm120FwdTile` per tuned shape) feeds select_initial_fwd_tile and
    `sm120_fwd_fields` the selected FwdConfig; `sm120_bwd_fields` becomes the per-shape backward table, which
    validate_bwd_config checks against; both tables key on head_dim, causal, qhead_per_kvhead and dtype (an entry
    applies to the dtype its study was tuned and gated on), and shapes and dtypes that were not tuned keep the
    previous defaults;
  - interface.py: FlashAttentionForwardSm120 takes num_threads, num_stages and Q_in_regs from the config (in the
    compile key through fwd_codegen_config), and the SM120 backward postprocess runs with the main kernel's threads.
The commit message carries the evidence: device, mode, per-problem TFLOPS of the default and the winner, the
correctness gate, and the commands that reproduce the patch. A winner without the confirmations, or whose
gate record is missing or failed, is refused before anything is written.
"""

from __future__ import annotations

import difflib
import hashlib
import shlex
import textwrap
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

from fa4tune import emulated_occupancy
from fa4tune.config import FP8, BackwardConfig, ConfigError, ForwardConfig
from fa4tune.harness.measurement import ProblemResult
from fa4tune.kernel_class import backward_kernel, forward_kernel, upstream_class
from fa4tune.sm120_interface import (PINNED_FLASH_ATTN_VERSION, TORCH_DTYPE_NAMES, UPSTREAM_FWD_CONSTRUCTOR,
                                     fwd_constructor)
from fa4tune.targets import TARGETS
from search.reviewing import mask_fix
from search.reviewing.carry import SPLITKV, CarriedClass, apply_edits, carried, upstream_source, upstream_test
from search.reviewing.evidence import StudyEvidence, load_studies, mode_sentence
from search.space import get_space
from search.storing import schema
from search.storing.history import FINISHED, TrialRecord, winner

UPSTREAM_PATH = "flash_attn/cute/interface.py"
CONFIG_PATH = "flash_attn/cute/config.py"
SUBJECT = "cute: tune SM120 forward and backward defaults per head_dim, causal and GQA"
AUTHOR_PLACEHOLDER = "Your Name <you@example.com>"  # replaced by `git config user.name` / `user.email` where set
# Upstream fixes that open pull requests already carry: the series cites them and does not duplicate them.
OPEN_FIXES = {
    "r2p_mask": "#2771 and #2634",  # R2P mask only where a thread's columns are in sm90_col_to_r2p_idx's order
    "varlen_dkv_offset": "#2771 and #2634",  # the varlen GQA dK/dV accumulator offset in the SM80/SM120 backward
}
WIDTH = 100  # commit message prose; tables and commands may be longer
# What the patch applies to. flash-attn-4 4.0.0b40 is the tag fa4-v4.0.0.beta40 (upstream's publish-fa4 workflow
# builds each fa4-v* tag with setuptools-scm, tag_regex "^fa4-v(?P<version>.+)$"). Its commit is not recorded here
# (for b36 the stored snapshot of github:Dao-AILab/flash-attention held no commit with the wheel's files,
# docs/measurements/2026-12-01-export-upstream-check.md; b40 was not looked up): UPSTREAM_COMMIT stays empty until
# it is. The blobs (`git hash-object` of the installed wheel's files) identify the files the patch edits exactly.
UPSTREAM_TAG = "fa4-v4.0.0.beta40"
UPSTREAM_COMMIT = ""
UPSTREAM_INTERFACE_BLOB = "490780d235334a1d9238bbc008e04207e43f8785"  # git hash-object flash_attn/cute/interface.py
UPSTREAM_CONFIG_BLOB = "9953eb97b7e8f54daa3c519da7cbc93fbf1ff07f"  # git hash-object flash_attn/cute/config.py
EMULATION_CAVEAT = ("Measured with SM120 kernels emulated on {gpus} (SM80 mma.sync code with SM120's 99 KB "
                    "shared-memory rule, timed on {that}), not on SM120 hardware: the winners are to be confirmed "
                    "on an RTX 5090 / RTX PRO 6000 before this is merged.")
OCCUPANCY_CAVEAT = ("Winners marked \"at <GPU>'s CTAs per SM\" were measured before the tuner reproduced SM120's occupancy "
                    "under emulation: that GPU then ran up to 3 CTAs per SM where SM120 runs one, which favours configs "
                    "with more shared memory (the others ran with each launch padded to SM120's CTAs per SM).")

# What the patch changes in each upstream file, for the pull request's text.
CONFIG_CHANGE = (f"`{CONFIG_PATH}`: SM120 forward and backward configs per (head_dim, causal, qhead_per_kvhead, dtype) "
                 "(`select_sm120_fwd_tile` / `Sm120FwdTile`, `sm120_bwd_fields`); FwdConfig gains num_threads, num_stages "
                 "and Q_in_regs, neutral on other architectures (`validate_fwd_config`).")
INTERFACE_CHANGE = (f"`{UPSTREAM_PATH}`: FlashAttentionForwardSm120 takes num_threads, num_stages and Q_in_regs from the "
                    "config (in the compile key through `fwd_codegen_config`); the SM120 backward postprocess uses the main "
                    "kernel's threads.")

# The tables' docstrings: what an entry is keyed on, and what every other call keeps.
TABLE_DOC = ("    Tuned per (head_dim, causal, qhead_per_kvhead, dtype); every entry fits SM120's 99 KB of SMEM.\n"
             "    Other shapes and dtypes, and local attention, keep the previous defaults.\n")
TORCH_DTYPES = {name: torch_name for torch_name, name in TORCH_DTYPE_NAMES.items()}  # "bf16": inputs.dtype's text


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
           decode: bool = False, open_fixes: bool = False) -> tuple[list[Winner], list[str]]:
    """(the winner of every chosen study, notes on the studies left out); a one-line ConfigError for the first
    study that cannot be exported. `decode`: the decode classes too, a split-KV winner kept as it is (the series'
    patch 2 gives them a table of their own, chosen by the query length). `open_fixes`: a winner that needs a fix an
    open upstream pull request carries (OPEN_FIXES) exports its study's best trial of upstream's kernel instead."""
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
    for ev in fp8:  # upstream has no FP8 path on SM120
        notes.append(f"{ev.direction}:{ev.problem_class.name}: left out: an opt-in FP8 class, which upstream's SM120 path "
                     "does not run.")
    studies = [ev for ev in studies if ev not in fp8]
    left = [ev for ev in studies if ev.problem_class.regime not in (("prefill", "decode") if decode else ("prefill",))]
    for ev in left:
        # upstream's SM120 tables key on head_dim, causal, qhead_per_kvhead and dtype, not on the query length: a decode
        # class's entry would also pick the config for every prefill of that shape
        notes.append(f"{ev.direction}:{ev.problem_class.name}: left out: a {ev.problem_class.regime} class, and "
                     "upstream's SM120 tables do not key on the query length.")
    winners = [_accept(ev, needed, allow_replay, upstream_only, split_kv=decode, open_fixes=open_fixes)
               for ev in studies if ev not in left]
    return winners, notes


def _accept(ev: StudyEvidence, needed: int, allow_replay: bool, upstream_only: bool = False, split_kv: bool = False,
            open_fixes: bool = False) -> Winner:
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
        if not forward and config.kernel == mask_fix.KERNEL and open_fixes:
            return _upstream_fallback(ev, w, allow_replay, f"the winner #{w.number} needs upstream's R2P mask gated for "
                                      f"MMAs with warps along n, which {OPEN_FIXES['r2p_mask']} carry (not duplicated here)")
        if not forward and config.kernel == mask_fix.KERNEL:
            pass  # upstream's backward once mask.py is fixed: the patch carries the fix (mask_fix.files)
        elif not forward or (carried(config.kernel) is None and not (split_kv and is_split_kv(config) and ev.problem_class.regime == "decode")):
            return _upstream_fallback(ev, w, allow_replay, f"the winner #{w.number} uses kernel {config.kernel!r} "
                                      "of the tuner's own, a class upstream does not have and this patch does not carry")
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


# ------------------------------------------------------------------------------------------------
# The code, in interface.py's own style.
# ------------------------------------------------------------------------------------------------


def _entries(winners: list[Winner], direction: str, regime: str = "prefill") -> dict[tuple, list[tuple[bool, str, tuple[int, ...], object, str]]]:
    """{(head_dim, head_dim_v): [(causal, dtype, qhead_per_kvhead values, config, comment)]}, changed winners of the
    regime only.

    Classes of one shape, causality and dtype with the same winner share an entry (GQA only where it matters); each
    dtype has entries of its own, since a winner is tuned and gated on its study's dtype only.
    """
    grouped: dict[tuple, dict] = {}
    for w in sorted((w for w in winners if w.direction == direction and w.changed and w.study.problem_class.regime == regime),
                    key=lambda w: (w.study.problem_class.causal, w.study.problem_class.qhead_per_kvhead,
                                   w.study.problem_class.dtype)):
        pc = w.study.problem_class
        by_config = grouped.setdefault((pc.head_dim, pc.head_dim_v), {})
        qheads, comments = by_config.setdefault((pc.causal, pc.dtype, w.config), ([], []))
        if pc.qhead_per_kvhead not in qheads:
            qheads.append(pc.qhead_per_kvhead)
        comments.append(_speedup_comment(w))
    return {
        shape: [(causal, dtype, tuple(q), config, "; ".join(comments))
                for (causal, dtype, config), (q, comments) in by_config.items()]
        for shape, by_config in sorted(grouped.items())
    }


def _speedup_comment(w: Winner) -> str:
    name = w.study.problem_class.name
    if w.default is None:
        return f"{name}; the previous default was not measured"
    return f"{name}: {w.trial.value / w.default.value:.2f}x the previous default"


def _table_function(signature: str, doc: str, entries: dict, render, fallback: list[str], preamble: list[str] = ()) -> str:
    """A config.py SM120 table: one `if` per tuned shape and causality (read from `inputs`), then `fallback`."""
    lines = [
        f"def {signature}:",
        f'    """{doc}',
        "",
        *TABLE_DOC.splitlines(),
        '    """',
        *preamble,
    ]
    for (hd, hdv), shape_entries in entries.items():
        lines.append(f"    if not inputs.local and inputs.head_dim == {hd} and inputs.head_dim_v == {hdv}:")
        for is_causal, dtype, qheads, config, comment in shape_entries:
            lines += [f"        if {_condition(is_causal, dtype, qheads)}:", f"            # {comment}", *render(config)]
    return "\n".join(lines + fallback) + "\n"


def _condition(causal: bool, dtype: str, qheads: tuple[int, ...]) -> str:
    gqa = (f"inputs.qhead_per_kvhead == {qheads[0]}" if len(qheads) == 1
           else f"inputs.qhead_per_kvhead in {tuple(sorted(qheads))}")
    return f'{"" if causal else "not "}inputs.causal and {gqa} and inputs.dtype == "{TORCH_DTYPES[dtype]}"'


def forward_entry(c: ForwardConfig, extra: str = "") -> str:
    """An Sm120FwdTile entry of the forward tables (`extra`: more keyword arguments, e.g. the split count)."""
    flags = "".join(f", {k.flag}=True" for k in [carried(c.kernel)] if k)
    return (f"            return Sm120FwdTile({c.tile_m}, {c.tile_n}, {extra}num_threads={c.num_threads}, "
            f"num_stages={c.num_stages}, Q_in_regs={c.Q_in_regs}{flags})")


def forward_function(winners: list[Winner]) -> str:
    """`select_sm120_fwd_tile`: the forward winners, then the previous heuristic for every other shape."""
    return _table_function(
        "select_sm120_fwd_tile(inputs: FwdHeuristicInputs) -> Sm120FwdTile", "Return the SM120 forward tile and knobs.",
        _entries(winners, "fwd"), lambda c: [forward_entry(c)],
        [
            "    # SM120 has 99 KB SMEM: 128×128 is preferred for D<=64, and 128×64",
            "    # avoids the occupancy loss from a 96 KB tile for larger head dimensions.",
            "    return Sm120FwdTile(128, 64 if inputs.head_dim > 64 else 128)",
        ],
    )


def forward_tile_class(tma: bool) -> str:
    """`Sm120FwdTile`, what an SM120 forward table entry chooses (the defaults are the previous ones)."""
    return "\n".join([
        "class Sm120FwdTile(NamedTuple):",
        '    """SM120 forward choices (SM80 MMA): tile, MMA threads, cp.async K/V stages, Q kept in registers."""',
        "",
        "    tile_m: int",
        "    tile_n: int",
        "    num_threads: int = 128",
        "    num_stages: int = 1",
        "    Q_in_regs: bool = False",
        *(["    use_tma: bool = False  # FlashAttentionForwardSm120TmaElected: Q/K/V tiles loaded by TMA"] if tma else []),
    ]) + "\n"


def forward_fields_function(tma: bool) -> str:
    """`sm120_fwd_fields`: FwdConfig's SM120 fields from the table, for the tile it chose."""
    return "\n".join([
        "def sm120_fwd_fields(inputs: FwdHeuristicInputs, *, tile_m: int, tile_n: int) -> dict:",
        '    """FwdConfig\'s SM120 fields: select_sm120_fwd_tile\'s for its own tile (a requested tile keeps the defaults)."""',
        "    if inputs.device_capacity != 12:",
        "        return {}",
        "    tile = select_sm120_fwd_tile(inputs)",
        "    if (tile.tile_m, tile.tile_n) != (tile_m, tile_n):",
        "        return {}",
        *(["    # FlashAttentionForwardSm120TmaElected was tuned and checked on dense batches without learnable sinks",
           "    tile = tile._replace(use_tma=tile.use_tma and not inputs.is_varlen and not inputs.has_learnable_sink)"]
          if tma else []),
        "    return {name: value for name, value in tile._asdict().items() if name not in (\"tile_m\", \"tile_n\")}",
    ]) + "\n"


def backward_entry(c: BackwardConfig) -> list[str]:
    """A `dict(neutral, ...)` entry of sm120_bwd_fields: every BwdConfig field the SM120 kernel reads."""
    return [
        "            return dict(",
        "                neutral,",
        f"                tile_m={c.m_block_size}, tile_n={c.n_block_size},",
        f"                num_stages_Q={c.num_stages_Q}, num_stages_dO={c.num_stages_dO}, num_threads={c.num_threads},",
        f"                SdP_swapAB={c.SdP_swapAB}, dKV_swapAB={c.dKV_swapAB}, dQ_swapAB={c.dQ_swapAB},",
        f"                AtomLayoutMSdP={c.AtomLayoutMSdP}, AtomLayoutNdKV={c.AtomLayoutNdKV}, AtomLayoutMdQ={c.AtomLayoutMdQ},",
        f"                V_in_regs={c.V_in_regs},",
        "            )",
    ]


def backward_function(winners: list[Winner]) -> str:
    """`sm120_bwd_fields`' head: the backward winners; upstream's one configuration stays below for the others."""
    return _table_function(
        "sm120_bwd_fields(inputs: BwdHeuristicInputs) -> dict", "The SM120 backward configuration: SM80 MMA, 99 KB SMEM.",
        _entries(winners, "bwd"), backward_entry, [],
        ["    neutral = {**_SM90_ONLY_NEUTRAL_FIELDS, **_SM100_ONLY_NEUTRAL_FIELDS, \"spt\": False}"],
    )


def _carried_edits(c: CarriedClass) -> dict[str, list[tuple[str, str, str]]]:
    """The replacements of interface.py that let an SM120 table entry select the carried class `c` (config.py's
    part, FwdConfig.<flag>, is written with the tables)."""
    module, name = c.module, c.upstream_class
    return {UPSTREAM_PATH: [
        (
            "from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120\n",
            f"from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120\nfrom {module} import {name}\n",
            f"{name} import",
        ),
        (
            fwd_constructor("FlashAttentionForwardSm120", *SM120_KNOBS),
            fwd_constructor(f"({name} if config.{c.flag} else FlashAttentionForwardSm120)", *SM120_KNOBS),
            f"forward SM120 constructor {c.flag}",
        ),
    ]}


def carried_classes(winners: list[Winner]) -> list[CarriedClass]:
    """The classes of ours the changed winners use, each once."""
    found: dict[str, CarriedClass] = {}
    for w in winners:
        if w.changed and w.carried is not None:
            found.setdefault(w.carried.kernel, w.carried)
    return list(found.values())


def _edits(winners: list[Winner]) -> dict[str, list[tuple[str, str, str]]]:
    """{upstream path: (old, new, what) replacements, in order}; each old text must occur exactly once."""
    edits = _upstream_edits(winners)
    for c in carried_classes(winners):
        for path, more in _carried_edits(c).items():
            edits[path] = edits[path] + more
    return edits


# What _flash_attn_fwd passes FlashAttentionForwardSm120 for num_stages, num_threads and Q_in_regs once patched.
SM120_KNOBS = ("config.num_stages", "config.num_threads", "config.Q_in_regs")


def _upstream_edits(winners: list[Winner]) -> dict[str, list[tuple[str, str, str]]]:
    tma = bool(carried_classes(winners))
    flag = [f"{c.flag}=False" for c in carried_classes(winners)]
    config = [
        (
            "    lpt_global: bool = False\n\n\nclass FwdHeuristicInputs(NamedTuple):",
            "    lpt_global: bool = False\n"
            "    # SM120 (SM80 MMA): MMA threads, cp.async K/V stages and Q kept in registers, chosen by\n"
            "    # select_sm120_fwd_tile; other architectures carry 128, 1 and False.\n"
            "    num_threads: int = 128\n    num_stages: int = 1\n    Q_in_regs: bool = False\n"
            + "".join(f"    # SM120: {c.upstream_class} (Q/K/V tiles loaded by TMA) instead of FlashAttentionForwardSm120\n"
                      f"    {c.flag}: bool = False\n" for c in carried_classes(winners))
            + "\n\nclass FwdHeuristicInputs(NamedTuple):",
            "FwdConfig SM120 fields",
        ),
        (
            "\n\ndef select_initial_fwd_tile(inputs: FwdHeuristicInputs) -> tuple[int, int, bool, bool]:\n",
            "\n\n" + forward_tile_class(tma) + "\n\n" + forward_function(winners) + "\n\n" + forward_fields_function(tma)
            + "\n\ndef select_initial_fwd_tile(inputs: FwdHeuristicInputs) -> tuple[int, int, bool, bool]:\n",
            "SM120 forward table",
        ),
        (
            "        case 12 if inputs.head_dim > 64:\n"
            "            # SM120 has 99 KB SMEM: 128×128 is preferred for D<=64, and 128×64\n"
            "            # avoids the occupancy loss from a 96 KB tile for larger head dimensions.\n"
            "            tile_n = 64\n",
            "        case 12:\n"
            "            tile = select_sm120_fwd_tile(inputs)\n"
            "            tile_m, tile_n = tile.tile_m, tile.tile_n\n",
            "select_initial_fwd_tile SM120",
        ),
        (
            "        sm_stats_cross_stage=select_sm_stats_cross_stage(inputs, use_s_ping_pong=use_s_ping_pong),\n"
            "    )\n    validate_fwd_config(config, inputs)\n",
            "        sm_stats_cross_stage=select_sm_stats_cross_stage(inputs, use_s_ping_pong=use_s_ping_pong),\n"
            "        **sm120_fwd_fields(inputs, tile_m=tile_m, tile_n=tile_n),\n"
            "    )\n    validate_fwd_config(config, inputs)\n",
            "_select_fwd_config SM120 fields",
        ),
        (
            "    sm_stats_cross_stage=False,\n)\n\n\n@lru_cache(maxsize=1024)\ndef validate_fwd_config(",
            "    sm_stats_cross_stage=False,\n)\n"
            f"_FWD_SM120_ONLY_NEUTRAL_FIELDS = dict({', '.join(['num_threads=128', 'num_stages=1', 'Q_in_regs=False', *flag])})\n"
            "\n\n@lru_cache(maxsize=1024)\ndef validate_fwd_config(",
            "SM120 neutral fields",
        ),
        (
            '        raise ValueError(f"SM{capacity} forward does not expose SM90 MMA flags")\n'
            "    if capacity not in (10, 11):\n",
            '        raise ValueError(f"SM{capacity} forward does not expose SM90 MMA flags")\n'
            "    if capacity != 12 and any(\n"
            "        getattr(config, name) != value for name, value in _FWD_SM120_ONLY_NEUTRAL_FIELDS.items()\n"
            "    ):\n"
            '        raise ValueError(f"SM{capacity} forward does not expose the SM120 options")\n'
            "    if capacity not in (10, 11):\n",
            "validate_fwd_config SM120 fields",
        ),
    ]
    backward = [
        (
            "def sm120_bwd_fields(inputs: BwdHeuristicInputs) -> dict:\n"
            '    """The one SM120 backward configuration: SM80 MMA, 99 KB SMEM, 128 threads (4 warps)."""\n',
            backward_function(winners)
            + "    # 64x64 tiles, 128 threads (4 warps); 2 stages of Q and dO fit for D<=64\n",
            "SM120 backward table",
        ),
        (
            'raise ValueError(f"SM120 backward supports one configuration; expected {mismatched}")',
            'raise ValueError(f"SM120 backward supports one configuration per shape; expected {mismatched}")',
            "validate_bwd_config SM120",
        ),
    ]
    if _entries(winners, "bwd"):  # upstream's one backward configuration stays as it is for a forward-only patch
        config += backward
    interface = [
        (
            UPSTREAM_FWD_CONSTRUCTOR,
            fwd_constructor("FlashAttentionForwardSm120", *SM120_KNOBS),
            "forward SM120 constructor",
        ),
        (
            "        num_threads_post_dKV = config.num_wg * 128\n    else:\n",
            "        num_threads_post_dKV = config.num_wg * 128\n"
            "    elif arch // 10 == 12:\n"
            "        # the postprocess reads dQ/dK/dV accumulators in the main kernel's MMA layout\n"
            "        num_threads_post_dQ = config.num_threads\n        num_threads_post_dKV = config.num_threads\n"
            "    else:\n",
            "backward postprocess threads",
        ),
    ]
    return {CONFIG_PATH: config, UPSTREAM_PATH: interface}


def pristine_sources() -> dict[str, str]:
    """The installed wheel's files the patch edits, by upstream path; a one-line error unless it is the pinned
    flash-attn-4 version."""
    installed = version("flash-attn-4")
    if installed != PINNED_FLASH_ATTN_VERSION:
        raise ConfigError("upstream_version", f"the export is written for flash-attn-4 {PINNED_FLASH_ATTN_VERSION}, "
                          f"{installed} is installed: run `uv sync` (uv.lock pins it)")
    from importlib.util import find_spec

    root = Path(find_spec("flash_attn.cute").origin).parent  # its location only: importing it would load torch and the DSL
    return {path: (root / Path(path).name).read_text() for path in (UPSTREAM_PATH, CONFIG_PATH)}


def pristine_interface() -> str:
    """The installed wheel's interface.py (pristine_sources' rule)."""
    return pristine_sources()[UPSTREAM_PATH]


def patch_upstream(sources: dict[str, str], winners: list[Winner]) -> dict[str, str]:
    """The edited files, by upstream path (each edit checked to match exactly once)."""
    edits = _edits(winners)
    return {path: apply_edits(text, edits.get(path, [])) for path, text in sources.items()}


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
        "Correctness gate, upstream's rule from tests/cute/test_flash_attn.py: against an "
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
    header = ("dir", "problem class", "problem", "speedup")  # ratios only: the TFLOPS are the emulating GPU's
    rows = []
    for w in winners:
        default = w.default.tflops if w.default else {}
        for problem, tuned in w.trial.tflops.items():
            base = default.get(problem)
            rows.append((w.direction, w.study.problem_class.name, problem, f"{tuned / base:.2f}x" if base else "not measured"))
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


def caveat(winners: list[Winner], table_meta: dict | None = None, emulation: bool = True) -> str:
    """The emulation caveat when any winner was measured (or recorded) in emulation, else ''; `emulation=False`: only
    what follows the emulation sentence (the occupancy note), for a text that states the emulation already."""
    sources = {w.study.source() for w in winners} | {((table_meta or {}).get("device"), (table_meta or {}).get("mode"))}
    gpus = sorted({device for device, mode in sources if mode == "emulated" and device})
    if not any(mode == "emulated" for _, mode in sources):
        return ""
    text = EMULATION_CAVEAT.format(gpus=" and ".join(gpus) or "another GPU",
                                   that="that GPU" if len(gpus) < 2 else "those GPUs")
    occupancy = OCCUPANCY_CAVEAT if any(_occupancy_note(w) for w in winners) else ""
    return " ".join(t for t in (text if emulation else "", occupancy) if t)


def commit_message(winners: list[Winner], storage_url: str, export_argv: list[str],
                   table_meta: dict | None = None, table: str | None = None, needed: int = 2,
                   notes: list[str] | None = None, intro: list[str] | None = None, reproduce: bool = True,
                   related: list[str] | None = None) -> str:
    """The commit message: what changes (`intro`, paragraphs, in place of the tables' own), why, and the evidence
    (speedups only); `reproduce`: the tuner's commands too (the series leaves them to the PR text); `related`: the
    related upstream pull requests, a line each."""
    target = TARGETS.get(winners[0].study.target)
    unchanged = [w.study.problem_class.name for w in winners if not w.changed]
    dtypes = sorted({w.study.problem_class.dtype for w in winners})
    untuned = sorted(set(TORCH_DTYPES) - set(dtypes))
    lines = [line for i, p in enumerate(intro) for line in ([""] if i else []) + _wrap(p)] if intro else _wrap(
        "SM120 picked its forward tile by head_dim alone and allowed one backward configuration. Both now come "
        "from per-shape tables in config.py, select_sm120_fwd_tile and sm120_bwd_fields, keyed on head_dim, causal, "
        "qhead_per_kvhead and dtype; shapes and dtypes that were not tuned, and local attention, keep the previous "
        "defaults, and validate_bwd_config checks a backward config against its shape's entry."
    ) + [""] + _wrap(
        "FwdConfig gains num_threads, num_stages and Q_in_regs (128, 1 and False, the only values other "
        "architectures accept), which select_fwd_config fills from the table for the tile it chose (a requested "
        "tile keeps the defaults) and _flash_attn_fwd passes to FlashAttentionForwardSm120 in place of its "
        "constants; they reach the compile key with the rest of the config (fwd_codegen_config). The SM120 "
        "dQ/dK/dV postprocess runs with the main kernel's thread count, since it reads the accumulators in that "
        "kernel's MMA layout."
    )
    for c in carried_classes(winners):
        users = ", ".join(w.study.problem_class.name for w in winners if w.changed and w.carried == c)
        lines += [""] + _wrap(
            f"New: {c.upstream_path}, {c.upstream_class}, a subclass of FlashAttentionForwardSm120 whose Q, K and V "
            "tiles arrive by TMA (one elected thread issues a bulk tensor copy per tile and arms an mbarrier with its "
            "bytes; K and V have num_stages buffers each, in the previous class's load order). The math, masking and "
            f"epilogue are unchanged. FwdConfig.{c.flag} selects it (config.py: set by the tuned entries for dense "
            f"batches; varlen and learnable sinks keep the previous class, and other architectures refuse it); "
            f"_flash_attn_fwd builds it for SM120 when set, and it is in the compile key. Its can_implement adds the mbarriers (8 B each, the storage rounded "
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
        + f"; flash_attn/cute/interface.py blob {UPSTREAM_INTERFACE_BLOB}, config.py blob {UPSTREAM_CONFIG_BLOB})."
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
        + f". Tuned on {' and '.join(dtypes)} inputs{' only' if untuned else ''}; the entries key on dtype, so "
        + (f"{' and '.join(untuned)} calls keep the previous defaults." if untuned
           else "each dtype takes the entries tuned on it, and the previous defaults elsewhere.")
    )
    for w in winners:
        if w.replaces is not None:
            lines += _wrap(
                f"{w.direction} {w.study.problem_class.name}: {w.why}. Exported instead: its best trial of upstream's "
                f"kernel, #{w.trial.number}, {w.trial.value / w.replaces.value:.2f}x the winner's speed; "
                f"{_measured(w, needed)}."
            )
    same = "same study, same harness" if not any(replayed(w) for w in winners) else evidence_source(winners, table_meta)
    lines += ["", f"Speedup per problem over upstream's previous SM120 default ({same}):", "",
              *_evidence_table(winners), "", "Exported configs:"]
    lines += [f"  {w.direction} {w.study.problem_class.name}: {_knobs(w.config)} ({_class_of(w)}; trial #{w.trial.number}, "
              f"{_measured(w, needed)})" for w in winners]
    if unchanged:
        lines += _wrap("The previous default won for " + ", ".join(unchanged) + ": no table entry.")
    if notes:
        lines += ["", "Not exported:", *(f"  {n}" for n in notes)]
    lines += ["", *_gate_summary(winners)]
    if reproduce:
        lines += ["", *_reproduce(winners, storage_url, export_argv, table, table_meta)]
    if related:
        lines += ["", "Related pull requests:", *(f"  {line}" for line in related)]
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


def author() -> str:
    """`Name <e-mail>` from `git config` (user.name, user.email), else AUTHOR_PLACEHOLDER for the user to replace."""
    import subprocess

    def get(key: str) -> str:
        try:
            return subprocess.run(["git", "config", key], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    name, email = get("user.name"), get("user.email")
    return f"{name} <{email}>" if name and email else AUTHOR_PLACEHOLDER


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
        f"From: {author()}\n",
        f"Date: {date.strftime('%a, %d %b %Y %H:%M:%S %z')}\n",
        f"Subject: [PATCH] {subject}\n\n",
        message,
        "---\n",
        "\n".join(_diffstat(changes)) + "\n\n",
        body,
        "-- \n",
    ])


def patch_files(winners: list[Winner], old: dict[str, str]) -> list[tuple[str, str | None, str]]:
    """(path, old text or None for a new file, new text) of every file the patch touches; `old`: pristine_sources()."""
    from search.reviewing.upstream_lint import format_source  # as upstream's pre-commit hooks leave each file

    new = {path: format_source(path, text) for path, text in patch_upstream(old, winners).items()}
    files = [(path, old[path], new[path]) for path in (CONFIG_PATH, UPSTREAM_PATH) if new[path] != old[path]]
    for c in carried_classes(winners):
        files += [(c.upstream_path, None, upstream_source(c)), (c.test_path, None, upstream_test(c))]
    return [(path, before, format_source(path, after)) for path, before, after in files + mask_fix.files(winners)]
