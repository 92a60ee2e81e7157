"""`python -m search export --series DIR`: the export as a series of reviewable patches, in this order:

  1. configs: the tuned SM120 forward/backward tables and the knobs plumbed through interface.py, for the classes
     won by upstream's own kernels (a class won by a TMA class keeps the previous default here);
  2. split-KV decode: flash_fwd_sm120_splitkv.py (our SplitKvForwardSm120, carried as search.reviewing.carry
     carries the TMA class), `_tile_size_fwd_sm120_decode` (chosen when max_seqlen_q <= 16), the split count
     (the entry's, or split_kv_heuristic's over SMs x CTAs per SM) and upstream's own partials + combine launch;
  3. TMA forward: flash_fwd_sm120_tma.py and the entries of the classes it won.

Every stage is interface.py rebuilt from the pristine text with export's own edits (export.patch_interface), the
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
from search.reviewing import mask_fix
from search.reviewing.carry import SPLITKV, TMA, apply_edits, upstream_source, upstream_test
from search.reviewing.export import Winner, is_split_kv

SUBJECTS = {
    "configs": "cute: tune SM120 forward and backward defaults per head_dim, causal and GQA",
    "splitkv": "cute: split-KV decode on SM120 (FlashAttentionForwardSm120SplitKV + combine)",
    "tma": "cute: TMA-fed SM120 forward for the shapes it wins (FlashAttentionForwardSm120Tma)",
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
    """`_tile_size_fwd_sm120_decode`: the decode winners, None for every other shape (the prefill table's config)."""
    return exporter._table_function(
        "_tile_size_fwd_sm120_decode(head_dim, head_dim_v, is_causal, is_local, qhead_per_kvhead)",
        f"Return FwdConfig for an SM120 decode (max_seqlen_q <= {DECODE_MAX_SEQLEN_Q}), or None.",
        "is_local", "is_causal", exporter._entries(winners, "fwd", regime="decode"),
        lambda c: [f"            return FwdConfig({c.tile_m}, {c.tile_n}, True, True, "
                   + (f"num_splits={c.extra_knobs.get('num_splits', 0)}, " if is_split_kv(c) else "")
                   + f"num_threads={c.num_threads}, num_stages={c.num_stages}, Q_in_regs={c.Q_in_regs}"
                   + (", use_split_kv=True" if is_split_kv(c) else "") + ")"],
        ["    return None"],
    )


def split_kv_edits(decode: list[Winner], tma: bool) -> list[tuple[str, str, str]]:
    """The replacements of interface.py (after export's, with or without the TMA class's) that carry split-KV."""
    name = SPLITKV.upstream_class
    sm120 = "(FlashAttentionForwardSm120Tma if use_tma else FlashAttentionForwardSm120)" if tma else "FlashAttentionForwardSm120"
    return [
        ("from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120\n",
         "from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120\n"
         f"from {SPLITKV.module} import {name}, split_kv_heuristic\n", "split-KV import"),
        ("    num_splits: int = 1\n    # SM120 (SM80 MMA)",
         "    num_splits: int = 1\n"
         f"    # SM120 decode: {name} (num_splits < 1: split_kv_heuristic's count)\n"
         "    use_split_kv: bool = False\n    # SM120 (SM80 MMA)", "FwdConfig.use_split_kv"),
        ("\n\n@dataclass(frozen=True)\nclass BwdConfig:",
         "\n\n" + decode_function(decode) + "\n\n@dataclass(frozen=True)\nclass BwdConfig:", "SM120 decode table"),
        ("            cfg = _tile_size_fwd_sm120(head_dim, head_dim_v, causal, local, qhead_per_kvhead)\n",
         "            cfg = _tile_size_fwd_sm120(head_dim, head_dim_v, causal, local, qhead_per_kvhead)\n"
         f"            if max_seqlen_q <= {DECODE_MAX_SEQLEN_Q}:  # a decode: one query token (or a draft's few) over the KV\n"
         "                cfg = _tile_size_fwd_sm120_decode(head_dim, head_dim_v, causal, local, qhead_per_kvhead) or cfg\n",
         "_get_fwd_config SM120 decode dispatch"),
        ('        assert num_splits <= 1, "SM120 forward only supports num_splits=1"\n        num_splits = 1\n',
         '        assert num_splits <= 1, "SM120 forward only supports num_splits=1"\n'
         "        # a split-KV entry's count; below 1, _flash_attn_fwd takes split_kv_heuristic's\n"
         "        num_splits = cfg.num_splits if cfg.use_split_kv else 1\n", "_get_fwd_config SM120 num_splits"),
        ("        num_threads=cfg.num_threads, num_stages=cfg.num_stages, Q_in_regs=cfg.Q_in_regs,",
         "        num_threads=cfg.num_threads, num_stages=cfg.num_stages, Q_in_regs=cfg.Q_in_regs, use_split_kv=cfg.use_split_kv,",
         "_get_fwd_config use_split_kv"),
        ("    num_splits = fwd_cfg.num_splits\n    mma_pv_is_rs = fwd_cfg.mma_pv_is_rs\n",
         "    num_splits = fwd_cfg.num_splits\n    mma_pv_is_rs = fwd_cfg.mma_pv_is_rs\n"
         f"    # {name} was tuned and checked on dense batches without mods, sinks or local windows\n"
         "    use_split_kv = (\n"
         "        arch // 10 == 12 and fwd_cfg.use_split_kv and not local and learnable_sink is None\n"
         "        and score_mod is None and mask_mod is None and page_table is None\n"
         "        and cu_seqlens_q is None and cu_seqlens_k is None and seqused_q is None and seqused_k is None\n"
         "    )\n"
         "    if use_split_kv and num_splits < 1:\n"
         "        # one wave of CTAs over SMs x CTAs per SM, at least 2 KV blocks per split, none of them empty\n"
         "        rows = max_seqlen_q * (qhead_per_kvhead if pack_gqa else 1)\n"
         "        num_splits = split_kv_heuristic(\n"
         "            batch_size * num_head_kv * (1 if pack_gqa else qhead_per_kvhead) * ((rows + tile_m - 1) // tile_m),\n"
         "            (max_seqlen_k + tile_n - 1) // tile_n,\n"
         f"            num_sms * {name}.ctas_per_sm(\n"
         "                head_dim, head_dim_v, tile_m, tile_n, fwd_cfg.num_stages, fwd_cfg.num_threads, fwd_cfg.Q_in_regs\n"
         "            ),\n"
         "        )\n"
         "    elif arch // 10 == 12 and not use_split_kv:\n"
         "        num_splits = 1\n", "forward split count"),
        ("        is_split_kv,\n        pack_gqa,\n", "        use_split_kv,\n        is_split_kv,\n        pack_gqa,\n",
         "forward compile key use_split_kv"),
        ('            assert not is_split_kv, "SplitKV not supported on SM 12.0 in this PR"\n',
         f'            assert not is_split_kv or use_split_kv, "SplitKV on SM 12.0 runs {name} only"\n',
         "forward SM120 split-KV assertion"),
        (fwd_constructor(sm120, "num_stages", "Q_in_regs"),
         fwd_constructor(f"({name} if use_split_kv else {sm120})", "num_stages", "Q_in_regs"), "forward SM120 constructor split-KV"),
    ]


def _carried_files(c) -> list[tuple[str, None, str]]:
    return [(c.upstream_path, None, upstream_source(c)), (c.test_path, None, upstream_test(c))]


def plan(winners: list[Winner], pristine: str) -> list[SeriesPatch]:
    """The patches, in order: each one's files are the diff of its stage against the previous stage."""
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
    stage1 = exporter.patch_interface(pristine, configs)
    stage2 = apply_edits(stage1, split_kv_edits(decode, tma=False)) if decode else stage1
    stage3 = exporter.patch_interface(pristine, prefill)
    if decode:
        stage3 = apply_edits(stage3, split_kv_edits(decode, tma=bool(tma)))
    path = exporter.UPSTREAM_PATH
    patches = [SeriesPatch(
        "sm120-configs", SUBJECTS["configs"], configs, [(path, pristine, stage1)] + mask_fix.files(configs), [], [
            f"`{path}`: SM120 forward and backward configs per (head_dim, causal, qhead_per_kvhead) (`_tile_size_fwd_sm120`, "
            "`Sm120BwdConfig` / `_tile_size_bwd_sm120`); every SM120 knob passed to the kernels and into the compile key; "
            "the backward postprocess uses the main kernel's threads."]
        + ([mask_fix.CHANGE, mask_fix.TEST_CHANGE] if mask_fix.needed(configs) else []))]
    if decode:
        patches.append(SeriesPatch(
            "sm120-splitkv-decode", SUBJECTS["splitkv"], decode,
            [(path, stage1, stage2)] + (_carried_files(SPLITKV) if has_split else []), [
                f"SM120 decodes (max_seqlen_q <= {DECODE_MAX_SEQLEN_Q}) now take their config from _tile_size_fwd_sm120_decode, "
                "keyed on head_dim, causal and qhead_per_kvhead; other shapes keep the prefill table's. An entry with "
                f"use_split_kv runs {SPLITKV.upstream_class} ({SPLITKV.upstream_path}, new): FlashAttentionForwardSm120 with "
                "the KV sequence split across CTAs, each split writing fp32 partial O and LSE from its accumulators, an empty "
                "split LSE = -inf. The split count is the entry's num_splits, or (0) split_kv_heuristic's: one wave over SMs x "
                "the class's ctas_per_sm, at least 2 KV blocks per split, the fewest splits of that length. The interface "
                "then runs its own split path unchanged: out_partial / lse_partial and _flash_attn_fwd_combine. Varlen, "
                "paged KV, learnable sinks, score/mask mods and local windows keep the previous unsplit path; use_split_kv "
                "joins the compile key.",
                "The measurements launched the combine as a programmatic dependent launch (PDL); this patch launches it as "
                "upstream does (plain stream order), which is correct and may cost a few microseconds per call."],
            [f"`{path}`: `_tile_size_fwd_sm120_decode` (chosen when max_seqlen_q <= {DECODE_MAX_SEQLEN_Q}), "
             "`FwdConfig.use_split_kv`, the split count and the combine through upstream's split path (launched as upstream "
             "launches it; the measurements launched it with PDL)."]
            + ([f"`{SPLITKV.upstream_path}` (new): `{SPLITKV.upstream_class}`, split-KV SM120 forward, `split_kv_heuristic`, "
                "`ctas_per_sm`.", f"`{SPLITKV.test_path}` (new): the heuristic and CTAs per SM anywhere, outputs against "
                "`attention_ref` on SM120."] if has_split else [])))
    if tma:
        c = TMA
        patches.append(SeriesPatch(
            "sm120-tma-forward", SUBJECTS["tma"], tma, [(path, stage2, stage3)] + _carried_files(c),
            [f"The SM120 forward table gains the entries of the classes {c.upstream_class} won; they select it with "
             f"FwdConfig.{c.flag}."],
            [f"`{path}`: the TMA classes' entries in `_tile_size_fwd_sm120`, `FwdConfig.{c.flag}` and its dispatch.",
             f"`{c.upstream_path}` (new): `{c.upstream_class}`, SM120 forward with Q/K/V loaded by TMA on mbarriers.",
             f"`{c.test_path}` (new): `can_implement` cases anywhere, outputs against `attention_ref` on SM120."]))
    return patches


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
                                        leave_out=leave_out, decode=True)
    patches = plan(winners, exporter.pristine_interface())
    for i, p in enumerate(patches, 1):
        p.stem = f"{i:04d}-{p.stem}"
        later = [q.stem.split("-", 1)[-1] for q in patches[i:]]
        order = (f"Patch {i} of {len(patches)}" + (f"; applies on top of patch{'es 1-' if i > 2 else ' '}{i - 1}" if i > 1 else "; applies alone")
                 + (f"; followed by {', '.join(later)}." if later else "."))
        message = exporter.commit_message(p.winners, storage_url, export_argv, table_meta, table, needed,
                                          notes if i == 1 else None, [order] + (p.intro or []) if p.intro else None)
        if not p.intro:  # patch 1: export's own prose, after the order line
            message = "\n".join(exporter._wrap(order)) + "\n\n" + message
        p.patch = exporter.format_patch(p.files, message, p.subject).replace("Subject: [PATCH] ", f"Subject: [PATCH {i}/{len(patches)}] ", 1)
        star = featured(p.winners) if screenshot is not None else None
        shot = (star, screenshot(p.stem, star.study.name)) if star is not None else None
        decodes = any(w.study.problem_class.regime == "decode" for w in p.winners)
        p.pr = pr_text(p.winners, p.files, message, p.subject, needed, table_meta, changes=[order, *p.changes],
                       screenshot=shot, sections=decode if decodes else None)
    return patches
