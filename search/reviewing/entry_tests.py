"""The upstream test the series adds for its tuned entries (tests/cute/test_flash_attn_sm120_configs.py): the template
under upstream_files/ with FWD_ENTRIES and BWD_ENTRIES written from a stage's winners, so each patch's test lists the
entries its config.py has, each with the FwdConfig / BwdConfig fields it sets."""

from __future__ import annotations

from search.reviewing.carry import SPLITKV, TEMPLATES, TMA
from search.reviewing.export import Winner, is_split_kv

PATH = "tests/cute/test_flash_attn_sm120_configs.py"
TEMPLATE = "test_flash_attn_sm120_configs.py.txt"
MARKER = "# {entries}\n"
FWD_KNOBS = ("tile_m", "tile_n", "num_threads", "num_stages", "Q_in_regs")
BWD_KNOBS = {"tile_m": "m_block_size", "tile_n": "n_block_size", "num_stages_Q": "num_stages_Q",
             "num_stages_dO": "num_stages_dO", "num_threads": "num_threads", "SdP_swapAB": "SdP_swapAB",
             "dKV_swapAB": "dKV_swapAB", "dQ_swapAB": "dQ_swapAB", "AtomLayoutMSdP": "AtomLayoutMSdP",
             "AtomLayoutNdKV": "AtomLayoutNdKV", "AtomLayoutMdQ": "AtomLayoutMdQ", "V_in_regs": "V_in_regs"}


def fwd_fields(w: Winner, split_kv: bool, tma: bool) -> dict:
    """The FwdConfig fields a forward entry sets; the split-KV and TMA flags where the stage's FwdConfig has them."""
    c = w.config
    fields = {name: getattr(c, name) for name in FWD_KNOBS}
    if split_kv:
        fields[SPLITKV.flag] = is_split_kv(c)
    if tma:
        fields[TMA.flag] = w.carried is TMA
    return fields


def bwd_fields(w: Winner) -> dict:
    """The BwdConfig fields a backward entry sets (sm120_bwd_fields' names)."""
    return {name: getattr(w.config, ours) for name, ours in BWD_KNOBS.items()}


def _row(w: Winner, fields: dict) -> str:
    pc = w.study.problem_class
    knobs = ", ".join(f"{name}={value!r}" for name, value in fields.items())
    return (f'    ("{pc.name}", {pc.head_dim}, {pc.causal}, {pc.qhead_per_kvhead}, {pc.regime == "decode"}, '
            f"dict({knobs})),")


def entries(winners: list[Winner]) -> str:
    """FWD_ENTRIES and BWD_ENTRIES as Python: one row per changed winner (an entry shared by classes has one per class)."""
    changed = [w for w in winners if w.changed]
    split_kv = any(w.study.problem_class.regime == "decode" for w in winners)  # the stage has FwdConfig.use_split_kv
    tma = any(w.carried is TMA for w in changed)
    order = lambda w: (w.study.problem_class.regime, w.study.problem_class.head_dim, w.study.problem_class.causal,
                       w.study.problem_class.qhead_per_kvhead)
    fwd = [_row(w, fwd_fields(w, split_kv, tma)) for w in sorted(changed, key=order) if w.direction == "fwd"]
    bwd = [_row(w, bwd_fields(w)) for w in sorted(changed, key=order) if w.direction == "bwd"]
    head = ("# (class, head_dim, causal, qhead_per_kvhead, decode, the config fields its entry sets): one row per tuned\n"
            "# class; {direction} entries.\n")
    return ("# fmt: off\n" + head.format(direction="forward") + "FWD_ENTRIES = [\n" + "".join(f"{r}\n" for r in fwd) + "]\n"
            + head.format(direction="backward") + "BWD_ENTRIES = [\n" + "".join(f"{r}\n" for r in bwd) + "]\n# fmt: on\n")


def entry_test(winners: list[Winner]) -> str:
    """The test file for a stage whose tables hold `winners`' entries (before upstream's formatting)."""
    template = (TEMPLATES / TEMPLATE).read_text()
    if template.count(MARKER) != 1:
        raise ValueError(f"{TEMPLATE} must hold the line {MARKER.strip()!r} once, where the entries go")
    return template.replace(MARKER, entries(winners))
