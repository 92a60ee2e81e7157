"""The upstream test the series adds for its tuned entries (tests/cute/test_flash_attn_sm120_configs.py): the template
under upstream_files/ with FWD_ENTRIES and BWD_ENTRIES written from a stage's winners, so each patch's test lists the
entries its config.py has, each with the FwdConfig / BwdConfig fields it sets; and FWD_DEFAULTS / BWD_DEFAULTS, each
tuned shape in a dtype it was not tuned on, with the previous default's fields, which calls of that dtype keep."""

from __future__ import annotations

from dataclasses import replace

from fa4tune.config import ProblemClass
from search.reviewing.carry import SPLITKV, TEMPLATES, TMA, carried
from search.reviewing.export import TORCH_DTYPES, Winner, is_split_kv
from search.space import get_space

PATH = "tests/cute/test_flash_attn_sm120_configs.py"
TEMPLATE = "test_flash_attn_sm120_configs.py.txt"
MARKER = "# {entries}\n"
FWD_KNOBS = ("tile_m", "tile_n", "num_threads", "num_stages", "Q_in_regs")
BWD_KNOBS = {"tile_m": "m_block_size", "tile_n": "n_block_size", "num_stages_Q": "num_stages_Q",
             "num_stages_dO": "num_stages_dO", "num_threads": "num_threads", "SdP_swapAB": "SdP_swapAB",
             "dKV_swapAB": "dKV_swapAB", "dQ_swapAB": "dQ_swapAB", "AtomLayoutMSdP": "AtomLayoutMSdP",
             "AtomLayoutNdKV": "AtomLayoutNdKV", "AtomLayoutMdQ": "AtomLayoutMdQ", "V_in_regs": "V_in_regs"}


def fwd_fields(config, split_kv: bool, tma: bool) -> dict:
    """The FwdConfig fields a forward entry sets; the split-KV and TMA flags where the stage's FwdConfig has them."""
    fields = {name: getattr(config, name) for name in FWD_KNOBS}
    if split_kv:
        fields[SPLITKV.flag] = is_split_kv(config)
    if tma:
        fields[TMA.flag] = carried(config.kernel) is TMA
    return fields


def bwd_fields(config) -> dict:
    """The BwdConfig fields a backward entry sets (sm120_bwd_fields' names)."""
    return {name: getattr(config, ours) for name, ours in BWD_KNOBS.items()}


def _row(pc: ProblemClass, fields: dict) -> str:
    knobs = ", ".join(f"{name}={value!r}" for name, value in fields.items())
    return (f'    ("{pc.name}", {pc.head_dim}, {pc.causal}, {pc.qhead_per_kvhead}, {pc.regime == "decode"}, '
            f"{TORCH_DTYPES[pc.dtype]}, dict({knobs})),")


def _shape(direction: str, pc: ProblemClass) -> tuple:
    """What a table entry keys on (the decode and prefill tables of one shape and dtype count as one)."""
    return direction, pc.head_dim, pc.head_dim_v, pc.causal, pc.qhead_per_kvhead, pc.dtype


def entries(winners: list[Winner]) -> str:
    """FWD_ENTRIES and BWD_ENTRIES as Python, one row per changed winner (an entry shared by classes has one per class);
    FWD_DEFAULTS and BWD_DEFAULTS, a row per changed winner's class in each dtype no entry of its shape was tuned on."""
    changed = [w for w in winners if w.changed]
    split_kv = any(w.study.problem_class.regime == "decode" for w in winners)  # the stage has FwdConfig.use_split_kv
    tma = any(w.carried is TMA for w in changed)
    tuned = {_shape(w.direction, w.study.problem_class) for w in changed}
    rows = {name: [] for name in ("FWD_ENTRIES", "BWD_ENTRIES", "FWD_DEFAULTS", "BWD_DEFAULTS")}
    order = lambda w: (w.study.problem_class.regime, w.study.problem_class.head_dim, w.study.problem_class.causal,
                       w.study.problem_class.qhead_per_kvhead, w.study.problem_class.dtype)

    def fields(direction: str, config) -> dict:
        return fwd_fields(config, split_kv, tma) if direction == "fwd" else bwd_fields(config)

    for w in sorted(changed, key=order):
        rows[f"{w.direction.upper()}_ENTRIES"].append(_row(w.study.problem_class, fields(w.direction, w.config)))
        for other in (replace(w.study.problem_class, dtype=dtype) for dtype in TORCH_DTYPES):
            if _shape(w.direction, other) not in tuned:
                default = get_space(w.direction).upstream(other)
                rows[f"{w.direction.upper()}_DEFAULTS"].append(_row(other, fields(w.direction, default)))
    heads = ["# (class, head_dim, causal, qhead_per_kvhead, decode, dtype, the config fields its entry sets): one row per\n"
             "# tuned class; {direction} entries.\n",
             "# Each tuned class in a dtype no entry of its shape was tuned on, with the previous default's fields, which\n"
             "# that dtype keeps; {direction}.\n"]
    return "# fmt: off\n" + "".join(
        heads[name.endswith("DEFAULTS")].format(direction="forward" if name.startswith("FWD") else "backward")
        + f"{name} = [\n" + "".join(f"{r}\n" for r in found) + "]\n" for name, found in rows.items()) + "# fmt: on\n"


def entry_test(winners: list[Winner]) -> str:
    """The test file for a stage whose tables hold `winners`' entries (before upstream's formatting)."""
    template = (TEMPLATES / TEMPLATE).read_text()
    if template.count(MARKER) != 1:
        raise ValueError(f"{TEMPLATE} must hold the line {MARKER.strip()!r} once, where the entries go")
    return template.replace(MARKER, entries(winners))
