"""`python -m search export --series DIR`: the export as a series of reviewable patches, in this order:

  1. configs: the tuned SM120 forward/backward tables in config.py and the knobs plumbed through interface.py, for the classes
     won by upstream's own kernels (a class won by a TMA class keeps the previous default here);
  2. split-KV decode: flash_fwd_sm120_splitkv.py (our SplitKvForwardSm120, carried as search.reviewing.carry
     carries the TMA class), `select_sm120_decode_fwd_tile` (asked first when max_seqlen_q <= 16), the split count
     (`select_sm120_num_splits`: the entry's, or split_kv_heuristic's over SMs x CTAs per SM) and upstream's own
     partials + combine launch;
  3. TMA forward: flash_fwd_sm120_tma_elected.py and the entries of the classes it won.

Every stage is config.py and interface.py rebuilt from the pristine text with export's own edits (export.patch_upstream), the
split-KV edits below added for stages 2 and 3; a patch is the diff of one stage against the previous one, so each
applies on top of the ones before it. Patch 1 applies alone; 2 and 3 need 1 (they edit its tables and plumbing);
3 is made against 1+2 (git apply of 3 on 1 alone fails where 2's lines are its context). A patch with nothing to
change (no decode study won by split-KV, no class won by a TMA class) is not written, and the numbering closes up.
"""

from __future__ import annotations

from dataclasses import dataclass

from fa4tune.config import DECODE_MAX_SEQLEN_Q, ConfigError
from fa4tune.sm120_interface import fwd_constructor
from search.reviewing import export as exporter
from search.reviewing import entry_tests, upstream_lint
from search.reviewing.carry import SPLITKV, TMA, apply_edits, upstream_source, upstream_test
from search.reviewing.export import Winner, is_split_kv

SUBJECTS = {
    "configs": "cute: tune SM120 forward and backward defaults per head_dim, causal and GQA",
    "splitkv": "cute: split-KV decode on SM120 (FlashAttentionForwardSm120SplitKV + combine)",
    "tma": "cute: TMA-fed SM120 forward for the shapes it wins (FlashAttentionForwardSm120TmaElected)",
}


# The open upstream pull requests each patch meets, cited in its commit message and PR text (read 2026-12-07).
RELATED = {
    "configs": [
        "#2634 (sm_120 dispatch auto-tuned per arch, backward fixes, its own flash_fwd_sm120_tma.py) and #2771 "
        "(SM120 backward tuning): both carry the R2P mask gate and the varlen GQA dK/dV offset fix, which this "
        "series cites and does not duplicate. The causal d128 backward entry here is the best config that needs "
        "neither; a faster one (AtomLayoutMSdP below the warp count) needs the R2P gate and waits for it.",
        "#2599 (8 MMA warps / 256 threads against causal register spills) and #2499 (forward stages, Q_in_regs): "
        "the same knobs, which this patch moves into config.py's tables with per-shape values.",
    ],
    "splitkv": [
        "#2336 builds SM120 split-KV on flash_fwd.py's SM80 path (and #2348 paged KV); this patch carries its own "
        "class beside FlashAttentionForwardSm120 instead, for now. As of 4.0.0b40, #2336 does not apply (the SM120 "
        "config moved to config.py; flash_fwd.py's kernel body is under is_valid_tile), and on b40 its BlockInfo, "
        "built without num_splits=, gives split 0 every KV block and the other splits none (get_n_block_min_max "
        "reads self.num_splits). It also turns pack_gqa off when splitting (a GQA decode then reads each K/V tile "
        "once per query head of the group), prefetches K/V below the split's first block, and pre-fills the partials "
        "(torch.zeros / torch.full). Once #2336 is on b40 with those addressed, the decode table and the split count "
        "here should drive its kernel, and flash_fwd_sm120_splitkv.py be dropped.",
        "#2758 changes the same num_splits check in _select_fwd_config; the two must be merged by hand.",
    ],
    "tma": [
        "#2634 adds FlashAttentionForwardSm120Tma in flash_attn/cute/flash_fwd_sm120_tma.py: warp-specialized (one "
        "DMA warp + MMA warps, PipelineTmaAsync). The class here, FlashAttentionForwardSm120TmaElected in its own "
        "file, has no producer warp: one elected thread of the MMA warps issues each copy and arms its mbarrier, "
        "the schedule is FlashAttentionForwardSm120's. Neither name collides; the entries here were measured "
        "against FlashAttentionForwardSm120 only, not against #2634's class.",
        "#2349 and #2406 (TMA forwards for SM120; #2406 reports TMA 2-5% ahead under the 99 KB limit).",
    ],
}


@dataclass
class SeriesPatch:
    """One patch of the series: its file name stem, subject, winners (its evidence), files and PR text."""

    stem: str
    subject: str
    winners: list[Winner]
    files: list[tuple[str, str | None, str]]
    intro: list[str]
    changes: list[str]
    patch: str = ""
    pr: str = ""


def decode_function(winners: list[Winner]) -> str:
    """`select_sm120_decode_fwd_tile`: the decode winners, None for every other shape (the prefill table's entry)."""
    return exporter._table_function(
        "select_sm120_decode_fwd_tile(inputs: FwdHeuristicInputs) -> Sm120FwdTile | None",
        f"Return the SM120 forward tile and knobs of a decode (max_seqlen_q <= {DECODE_MAX_SEQLEN_Q}), or None.",
        exporter._entries(winners, "fwd", regime="decode"),
        lambda c: [exporter.forward_entry(c, f"num_splits={c.extra_knobs.get('num_splits', 0)}, " if is_split_kv(c) else "")
                   .replace(")", ", use_split_kv=True)" if is_split_kv(c) else ")")],
        ["    return None"],
    )


SPLIT_HELPERS = f"""

def sm120_can_split_kv(inputs: FwdHeuristicInputs) -> bool:
    \"\"\"Whether {SPLITKV.upstream_class} runs the call: it was tuned and checked on dense batches without
    score/mask mods, learnable sinks, paged KV or local windows.\"\"\"
    return not (
        inputs.is_varlen or inputs.local or inputs.page_size is not None or inputs.has_learnable_sink
        or inputs.has_score_mod or inputs.has_mask_mod
    )


def select_sm120_num_splits(
    inputs: FwdHeuristicInputs, *, tile_m: int, tile_n: int, total_mblocks: int, num_n_blocks: int
) -> int:
    \"\"\"The split count of an SM120 split-KV decode entry: its own, or (0) split_kv_heuristic's; else 1.\"\"\"
    if not sm120_fwd_fields(inputs, tile_m=tile_m, tile_n=tile_n).get("use_split_kv"):
        return 1
    tile = select_sm120_fwd_tile(inputs)
    if tile.num_splits >= 1:
        return tile.num_splits
    # One wave of CTAs over SMs x CTAs per SM, at least 2 KV blocks per split, none of them empty. The kernel's
    # occupancy is host arithmetic (no DSL call), imported here as routes_dynamic_varlen imports its scheduler.
    from {SPLITKV.module} import {SPLITKV.upstream_class}, split_kv_heuristic

    ctas_per_sm = {SPLITKV.upstream_class}.ctas_per_sm(
        inputs.head_dim, inputs.head_dim_v, tile_m, tile_n, tile.num_stages, tile.num_threads, tile.Q_in_regs
    )
    return split_kv_heuristic(total_mblocks, num_n_blocks, inputs.num_sms * ctas_per_sm)
"""


def split_kv_edits(decode: list[Winner], tma: bool) -> dict[str, list[tuple[str, str, str]]]:
    """The replacements of config.py and interface.py (after export's, with or without the TMA class's) that carry
    split-KV, by upstream path."""
    name = SPLITKV.upstream_class
    sm120 = "(FlashAttentionForwardSm120TmaElected if config.use_tma else FlashAttentionForwardSm120)" if tma else "FlashAttentionForwardSm120"
    fwd_doc = ("def select_sm120_fwd_tile(inputs: FwdHeuristicInputs) -> Sm120FwdTile:\n"
               '    """Return the SM120 forward tile and knobs.\n\n' + exporter.TABLE_DOC + '    """\n')
    config = [
        ("    # select_sm120_fwd_tile; other architectures carry 128, 1 and False.\n"
         "    num_threads: int = 128\n    num_stages: int = 1\n    Q_in_regs: bool = False\n",
         "    # select_sm120_fwd_tile; other architectures carry 128, 1 and False.\n"
         "    num_threads: int = 128\n    num_stages: int = 1\n    Q_in_regs: bool = False\n"
         f"    # SM120 decode: {name}, whose split count is num_splits (select_sm120_num_splits)\n"
         "    use_split_kv: bool = False\n", "FwdConfig.use_split_kv"),
        ("    tile_m: int\n    tile_n: int\n    num_threads: int = 128\n    num_stages: int = 1\n    Q_in_regs: bool = False\n",
         "    tile_m: int\n    tile_n: int\n    num_threads: int = 128\n    num_stages: int = 1\n    Q_in_regs: bool = False\n"
         "    num_splits: int = 1  # of a split-KV entry; 0: split_kv_heuristic's count\n"
         f"    use_split_kv: bool = False  # {name}: the KV sequence split across CTAs\n", "Sm120FwdTile split-KV"),
        ("\n\n" + fwd_doc,
         "\n\n" + decode_function(decode) + SPLIT_HELPERS + "\n\n" + fwd_doc
         + f"    # a decode (one query token, or a draft's few, over the KV) of the kind its entries were measured on\n"
         + f"    if inputs.max_seqlen_q <= {DECODE_MAX_SEQLEN_Q} and sm120_can_split_kv(inputs):\n"
         "        tile = select_sm120_decode_fwd_tile(inputs)\n        if tile is not None:\n            return tile\n",
         "SM120 decode table"),
        ('    return {name: value for name, value in tile._asdict().items() if name not in ("tile_m", "tile_n")}\n',
         "    # num_splits is select_sm120_num_splits'\n"
         '    return {\n        name: value for name, value in tile._asdict().items()\n'
         '        if name not in ("tile_m", "tile_n", "num_splits")\n    }\n', "sm120_fwd_fields split-KV"),
        ("    elif not is_sm100_family or inputs.mxfp8_path is not None:\n"
         "        # Only SM100/SM110 implement SplitKV, and MXFP8 forward is unsplit.\n",
         "    elif device_capacity == 12:\n"
         "        num_splits = select_sm120_num_splits(\n"
         "            inputs, tile_m=tile_m, tile_n=tile_n, total_mblocks=total_mblocks, num_n_blocks=num_n_blocks\n"
         "        )\n"
         "    elif not is_sm100_family or inputs.mxfp8_path is not None:\n"
         "        # Only SM100/SM110 (and SM120's split-KV decode entries) implement SplitKV, and MXFP8 forward is unsplit.\n",
         "_select_fwd_config SM120 num_splits"),
        ("_FWD_SM120_ONLY_NEUTRAL_FIELDS = dict(num_threads=128, num_stages=1, Q_in_regs=False",
         "_FWD_SM120_ONLY_NEUTRAL_FIELDS = dict(num_threads=128, num_stages=1, Q_in_regs=False, use_split_kv=False",
         "SM120 neutral use_split_kv"),
        ('                raise ValueError("SM120 forward does not support paged KV or block sparsity")\n'
         "        neutral = _FWD_SM100_ONLY_NEUTRAL_FIELDS\n",
         '                raise ValueError("SM120 forward does not support paged KV or block sparsity")\n'
         "            case 12 if config.use_split_kv and not sm120_can_split_kv(inputs):\n"
         f'                raise ValueError("{name} needs a dense batch without local windows, learnable sinks, "\n'
         '                                 "or score/mask mods")\n'
         "        neutral = _FWD_SM100_ONLY_NEUTRAL_FIELDS\n"
         "        if config.use_split_kv:  # the SM120 split-KV decode chooses its split count\n"
         '            neutral = {n: value for n, value in neutral.items() if n != "num_splits"}\n',
         "validate_fwd_config SM120 split-KV"),
    ]
    interface = [
        ("from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120\n",
         "from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120\n"
         f"from {SPLITKV.module} import {name}\n", "split-KV import"),
        (fwd_constructor(sm120, *exporter.SM120_KNOBS),
         fwd_constructor(f"({name} if config.use_split_kv else {sm120})", *exporter.SM120_KNOBS), "forward SM120 constructor split-KV"),
    ]
    return {exporter.CONFIG_PATH: config, exporter.UPSTREAM_PATH: interface}


def _with_split_kv(stage: dict[str, str], decode: list[Winner], tma: bool) -> dict[str, str]:
    edits = split_kv_edits(decode, tma)
    return {path: apply_edits(text, edits.get(path, [])) for path, text in stage.items()}


def _formatted(stage: dict[str, str]) -> dict[str, str]:
    """A stage's files as upstream's pre-commit hooks leave them (interface.py, which they skip, as it is)."""
    return {path: upstream_lint.format_source(path, text) for path, text in stage.items()}


def _changed(old: dict[str, str], new: dict[str, str]) -> list[tuple[str, str | None, str]]:
    """The (path, old, new) files of a stage that differ from the stage before it, config.py first, the entries' test
    last (old None: the stage adds it)."""
    return [(path, old.get(path), new[path]) for path in (exporter.CONFIG_PATH, exporter.UPSTREAM_PATH, entry_tests.PATH)
            if new[path] != old.get(path)]


def _with_entry_test(stage: dict[str, str], winners: list[Winner]) -> dict[str, str]:
    return {**stage, entry_tests.PATH: entry_tests.entry_test(winners)}


def _carried_files(c) -> list[tuple[str, None, str]]:
    return [(path, None, upstream_lint.format_source(path, text))
            for path, text in ((c.upstream_path, upstream_source(c)), (c.test_path, upstream_test(c)))]


def check_lint(patches: list[SeriesPatch]) -> None:
    """Refuse a series whose files upstream's hooks would refuse (what formatting cannot fix: an undefined name)."""
    for p in patches:
        for path, _, new in p.files:
            found = upstream_lint.problems(path, new)
            if found:
                raise ConfigError("upstream_lint", f"{p.stem}: upstream's ruff refuses {path}: {found[0]}"
                                  + (f" (and {len(found) - 1} more)" if len(found) > 1 else ""))


def plan(winners: list[Winner], pristine: dict[str, str]) -> list[SeriesPatch]:
    """The patches, in order: each one's files are the diff of its stage against the previous stage; `pristine`:
    export.pristine_sources()."""
    for w in winners:
        if w.study.problem_class.regime == "decode" and w.changed and w.carried is not None:
            raise ConfigError("series_decode_kernel", f"{w.study.name}: the decode winner #{w.trial.number} uses kernel "
                              f"{w.config.kernel!r}; the series' decode table (patch 2) carries split-KV or upstream's "
                              f"kernel only (leave the study out with --leave-out fwd:{w.study.problem_class.name})")
    prefill = [w for w in winners if w.study.problem_class.regime == "prefill"]
    decode = [w for w in winners if w.study.problem_class.regime == "decode"]
    configs = [w for w in prefill if not (w.changed and w.carried is not None)]
    tma = [w for w in prefill if w.changed and w.carried is not None]
    has_split = any(w.changed and is_split_kv(w.config) for w in decode)
    if not configs:
        raise ConfigError("series_no_configs", "the series' patch 1 (configs) needs a prefill study won by upstream's kernels "
                          f"(found {len(prefill)} prefill winners, {len(tma)} of them TMA): export with --problem-class instead")
    stage1 = exporter.patch_upstream(pristine, configs)
    stage2 = _with_entry_test(_with_split_kv(stage1, decode, tma=False) if decode else stage1, configs + decode)
    stage3 = exporter.patch_upstream(pristine, prefill)
    if decode:
        stage3 = _with_split_kv(stage3, decode, tma=bool(tma))
    stage1, stage3 = _with_entry_test(stage1, configs), _with_entry_test(stage3, prefill + decode)
    stage1, stage2, stage3 = (_formatted(stage) for stage in (stage1, stage2, stage3))
    path = exporter.UPSTREAM_PATH
    patches = [SeriesPatch(
        "sm120-configs", SUBJECTS["configs"], configs, _changed(pristine, stage1), [],
        [exporter.CONFIG_CHANGE, exporter.INTERFACE_CHANGE, ENTRY_TEST_CHANGE])]
    if decode:
        patches.append(SeriesPatch(
            "sm120-splitkv-decode", SUBJECTS["splitkv"], decode,
            _changed(stage1, stage2) + (_carried_files(SPLITKV) if has_split else []), [
                f"SM120 decodes (max_seqlen_q <= {DECODE_MAX_SEQLEN_Q}) now take their config from select_sm120_decode_fwd_tile "
                "(config.py), keyed on head_dim, causal, qhead_per_kvhead and dtype; other shapes and dtypes keep the prefill "
                f"table's. An entry with use_split_kv runs {SPLITKV.upstream_class} ({SPLITKV.upstream_path}, new): FlashAttentionForwardSm120 with "
                "the KV sequence split across CTAs, each split writing fp32 partial O and LSE from its accumulators, an empty "
                "split LSE = -inf. The split count (select_sm120_num_splits, so FwdConfig.num_splits is exact as everywhere) "
                "is the entry's num_splits, or (0) split_kv_heuristic's: one wave over SMs x the class's ctas_per_sm, at "
                "least 2 KV blocks per split, the fewest splits of that length. validate_fwd_config allows SM120 more than "
                "one split only with use_split_kv. The interface then runs its own split path unchanged: out_partial / "
                "lse_partial and _flash_attn_fwd_combine. Varlen, paged KV, learnable sinks, score/mask mods and local "
                "windows keep the previous unsplit path; use_split_kv is in the compile key with the rest of FwdConfig.",
                "The measurements launched the combine as a programmatic dependent launch (PDL); this patch launches it as "
                "upstream does (plain stream order), which is correct and may cost a few microseconds per call.",
                ENTRY_TEST_GROWS.format(which="decode")],
            [f"`{exporter.CONFIG_PATH}`: `select_sm120_decode_fwd_tile` (asked first when max_seqlen_q <= "
             f"{DECODE_MAX_SEQLEN_Q}), `FwdConfig.use_split_kv`, `select_sm120_num_splits` and `sm120_can_split_kv`, checked "
             "by `validate_fwd_config`.", f"`{path}`: {SPLITKV.upstream_class} for `config.use_split_kv`; the combine through "
             "upstream's split path (launched as upstream launches it; the measurements launched it with PDL)."]
            + [f"`{entry_tests.PATH}`: the decode entries' rows."]
            + ([f"`{SPLITKV.upstream_path}` (new): `{SPLITKV.upstream_class}`, split-KV SM120 forward, `split_kv_heuristic`, "
                "`ctas_per_sm`.", f"`{SPLITKV.test_path}` (new): the heuristic and CTAs per SM anywhere, outputs against "
                "`attention_ref` on SM120."] if has_split else [])))
    if tma:
        c = TMA
        patches.append(SeriesPatch(
            "sm120-tma-forward", SUBJECTS["tma"], tma, _changed(stage2, stage3) + _carried_files(c),
            [f"The SM120 forward table gains the entries of the classes {c.upstream_class} won; they select it with "
             f"FwdConfig.{c.flag}.", ENTRY_TEST_GROWS.format(which="TMA forward")],
            [f"`{exporter.CONFIG_PATH}`: the TMA classes' entries in `select_sm120_fwd_tile`, `FwdConfig.{c.flag}` "
             "(dense batches without learnable sinks).", f"`{path}`: {c.upstream_class} for `config.{c.flag}`.",
             f"`{c.upstream_path}` (new): `{c.upstream_class}`, SM120 forward with Q/K/V loaded by TMA on mbarriers.",
             f"`{c.test_path}` (new): `can_implement` cases anywhere, outputs against `attention_ref` on SM120.",
             f"`{entry_tests.PATH}`: the TMA entries' rows."]))
    return patches


ENTRY_TEST_CHANGE = (f"`{entry_tests.PATH}` (new): each tuned entry (GQA 4 and head_dim 96 included, which "
                     "test_flash_attn.py's parameters do not reach) selected by select_fwd_config / select_bwd_config on "
                     "the CPU, and its shape in an untuned dtype given the previous default; each entry compiled for "
                     "sm_120a under FakeTensorMode anywhere, its outputs and gradients against `attention_ref` on SM120.")
ENTRY_TEST_GROWS = f"{entry_tests.PATH} lists the {{which}} entries with the others."


WHY_NOT_WRITTEN = {
    "sm120-splitkv-decode": "split-KV decode: no decode study among the exported ones (the decode classes' studies, "
                            "e.g. `search run --problem-class d128-noncausal-decode-bf16`, feed it)",
    "sm120-tma-forward": "TMA forward: no prefill study won by the TMA class (a replayed table without kernel=sm120_tma "
                         "never proposes it)",
}


def not_written(patches: list[SeriesPatch]) -> list[str]:
    """A line per patch of the series that was not written, saying why (a patch with nothing to change)."""
    written = {p.stem.split("-", 1)[-1] for p in patches}
    return [why for stem, why in WHY_NOT_WRITTEN.items() if stem not in written]


def export_series(storage, storage_url: str, export_argv: list[str], target: str = "sm120", needed: int = 2,
                  allow_replay: bool = False, classes: list[str] | None = None, table: str | None = None,
                  leave_out: list[str] | None = None, screenshot=None, decode_table=None) -> list[SeriesPatch]:
    """The series, each patch with its format-patch text and PR text; a one-line ConfigError when refused.
    `screenshot(stem, study_name)`, when given, writes the dashboard page of the patch's featured study (the measured
    winner of largest speedup) and returns the PNG's file name, which the PR text shows. `decode_table` (a path of
    bench/gpu_splitkv.py --out) puts the decode table in the PR text of the patch that carries the decode entries."""
    from search.reviewing.pull_request import chosen, decode_table_lines, featured, pr_text

    decode = decode_table_lines(decode_table) if decode_table is not None else []  # refused before the studies are read
    winners, notes, table_meta = chosen(storage, storage_url, table, target, needed, allow_replay, classes,
                                        leave_out=leave_out, decode=True, open_fixes=True)
    patches = plan(winners, exporter.pristine_sources())
    check_lint(patches)
    for i, p in enumerate(patches, 1):
        p.stem = f"{i:04d}-{p.stem}"
        later = [q.stem.split("-", 1)[-1] for q in patches[i:]]
        order = (f"Patch {i} of {len(patches)}" + (f"; applies on top of patch{'es 1-' if i > 2 else ' '}{i - 1}" if i > 1 else "; applies alone")
                 + (f"; followed by {', '.join(later)}." if later else "."))
        kind = next(k for k, subject in SUBJECTS.items() if subject == p.subject)
        message = exporter.commit_message(p.winners, storage_url, export_argv, table_meta, table, needed,
                                          notes if i == 1 else None, [order] + (p.intro or []) if p.intro else None,
                                          reproduce=False, related=RELATED[kind])
        if not p.intro:  # patch 1: export's own prose, after the order line
            message = "\n".join(exporter._wrap(order)) + "\n\n" + message
        p.patch = exporter.format_patch(p.files, message, p.subject).replace("Subject: [PATCH] ", f"Subject: [PATCH {i}/{len(patches)}] ", 1)
        star = featured(p.winners) if screenshot is not None else None
        shot = (star, screenshot(p.stem, star.study.name)) if star is not None else None
        decodes = any(w.study.problem_class.regime == "decode" for w in p.winners)
        p.pr = pr_text(p.winners, p.files, message, p.subject, needed, table_meta, changes=[order, *p.changes],
                       screenshot=shot, sections=decode if decodes else None, related=RELATED[kind],
                       search=exporter._reproduce(p.winners, storage_url, export_argv, table, table_meta))
    return patches
