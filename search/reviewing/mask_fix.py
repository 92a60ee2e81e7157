"""The fix of upstream's attention mask for MMAs with warps along n, as edits of the pinned wheel's mask.py.

Upstream's AttentionMask.apply_mask (the SM80-family path that SM120 runs) masks a row with the R2P trick: it turns
the column limit into a bit index with `sm90_col_to_r2p_idx`, which assumes a thread's accumulator columns at 0, 1,
8, 9, 16, 17, ... (one warp of the MMA along n). With warps along n (an S/dP MMA whose AtomLayoutMSdP is below the
warp count) they step by 8 x warps along n, and the causal mask cuts the wrong columns. Upstream's own SM120
defaults keep every warp along m, so only tuned configs meet it. The fix: R2P only where thread 0's columns are in
that order (known when the kernel is traced), else the column traversal already written beside it.

Our class for the same configs is kernels/cmask_backward_sm120.py (kernel "sm120_cmask", a coordinate mask). Export
carries a backward winner of that class as upstream's class with these edits; the configs patch then holds mask.py.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from fa4tune.config import BackwardConfig
from search.reviewing.carry import apply_edits

KERNEL = "sm120_cmask"  # the class whose winners need the fix (its `name`)
PATH = "flash_attn/cute/mask.py"
TEST_PATH = "tests/cute/test_mask_r2p_columns.py"
TEST_TEMPLATE = Path(__file__).resolve().parent / "upstream_files" / "test_mask_r2p_columns.py.txt"
CHECK = "r2p_columns_ordered(t0ScS_mn)"

HELPER = '''

def r2p_columns_ordered(t0ScS_mn) -> bool:
    """Whether thread 0's accumulator columns run 0, 1, 8, 9, 16, 17, ..., the order sm90_col_to_r2p_idx assumes.

    True with one warp of the MMA along n. An SM80-style tiled MMA with warps along n (e.g. the SM120 backward's
    S/dP MMA with AtomLayoutMSdP < num_warps) steps them by 8 * warps along n: the R2P index would cut the wrong
    columns there, and the masks traverse the columns instead. The coordinates are known when the kernel is traced.
    """
    cols = [t0ScS_mn[0, c][1] for c in range(cute.size(t0ScS_mn.shape[1]))]
    return all(not isinstance(col, int) or col == c // 2 * 8 + c % 2 for c, col in enumerate(cols))
'''

EDITS = [
    ("    return col_limit // 8 * 2 + min(col_limit % 8, 2)\n",
     "    return col_limit // 8 * 2 + min(col_limit % 8, 2)\n" + HELPER, "r2p_columns_ordered"),
    ("                r2p = const_expr(not self.swap_AB)\n                if const_expr(not r2p):\n",
     f"                r2p = const_expr(not self.swap_AB and {CHECK})\n                if const_expr(not r2p):\n",
     "seqlen mask R2P"),
    ("                    r2p = const_expr(not self.swap_AB)  # R2P trick, see apply_mask_sm100\n",
     "                    # R2P trick, see apply_mask_sm100, where a thread's columns are in the order it assumes\n"
     f"                    r2p = const_expr(not self.swap_AB and {CHECK})\n", "causal mask R2P"),
    ("                    r2p_local = const_expr(not self.swap_AB)\n",
     f"                    r2p_local = const_expr(not self.swap_AB and {CHECK})\n", "local mask R2P"),
]

CHANGE = (f"`{PATH}`: the seqlen, causal and local masks use the R2P trick only where a thread's accumulator columns "
          "are in the order its bit index assumes (`r2p_columns_ordered`: one warp of the MMA along n), else the column "
          "traversal beside it. The SM120 backward entries whose S/dP MMA puts warps along n need it; upstream's own "
          "defaults never did.")
TEST_CHANGE = f"`{TEST_PATH}` (new): the column order of SM80 tiled MMAs with warps along m and along n, on the CPU."


def needed(winners) -> bool:
    """Whether a changed backward winner runs the class that needs the fix."""
    return any(isinstance(w.config, BackwardConfig) and w.config.kernel == KERNEL and w.changed for w in winners)


def pristine_mask() -> str:
    spec = find_spec("flash_attn.cute")  # its location only: importing it would load torch and the DSL
    return (Path(spec.origin).parent / "mask.py").read_text()


def patch_mask(source: str) -> str:
    """mask.py with the fix (each edit checked to match exactly once)."""
    return apply_edits(source, EDITS)


def files(winners) -> list[tuple[str, str | None, str]]:
    """(path, old text or None, new text) of the fix and its test, when a winner needs it; else none."""
    if not needed(winners):
        return []
    old = pristine_mask()
    return [(PATH, old, patch_mask(old)), (TEST_PATH, None, TEST_TEMPLATE.read_text())]
