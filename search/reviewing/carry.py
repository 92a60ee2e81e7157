"""Our kernel classes that export can carry into upstream's tree, rewritten from their own source.

A carried class becomes a new file under flash_attn/cute/ with upstream-only imports. The file is derived
from our module at export time, never kept as a copy: the class's methods are our source lines unchanged;
what is ours only (the kernel-class protocol: `name`, `limits`, `smem_bytes`, and the imports of fa4tune and
kernels/) is cut out, the base becomes upstream's FlashAttentionForwardSm120, and an upstream-style
`can_implement` (a static method returning bool, as upstream's classes have) is written from the same rules
our feasibility applies (tests/test_search_export.py checks both agree on every config of the search space).
A source that references anything else of ours is refused (carry_source), so the two cannot drift apart.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from fa4tune.config import ConfigError
from fa4tune.sm120_interface import UpstreamMismatch, _replace_once
from fa4tune.kernel_class import ROOT

TEMPLATES = Path(__file__).resolve().parent / "upstream_files"
# members of fa4tune.kernel_class.ForwardKernel: the registry's and feasibility's, not the kernel's
PROTOCOL_MEMBERS = {"name", "knobs", "limits", "upstream", "smem_bytes", "can_implement", "can_implement_problem",
                    "num_splits_for", "static_problem", "features", "regimes", "call_knobs", "searched"}
OURS = ("fa4tune", "kernels")  # packages upstream does not have
# what a carried file must not name: our packages, our records, our project (an upstream file stands on its own)
LEAKS = ("fa4tune", "fa4-tune", "kernels/", "tests/test_", "docs/measurements", "experiment.py", "SPLITS_DOMAIN",
         "num_splits_for", "trim_masked", "visible_keys", "inline_asm")
# and what cites our tracker or records by number or section ("issue 68", "the split-KV record, section 4")
LEAK_PATTERNS = (re.compile(r"\bissues? #?\d+", re.I), re.compile(r"\brecords?, sections?\b", re.I))


@dataclass(frozen=True)
class CarriedClass:
    """One of our kernel classes as a new upstream file, its dispatch flag and its upstream test."""

    kernel: str  # the `kernel` knob's value (the class's `name`)
    source: str  # our module, relative to the project root
    our_class: str
    our_base: str  # the base of ours it subclasses, which upstream's class replaces
    upstream_path: str
    upstream_class: str
    upstream_base: str  # module and class the new file subclasses
    flag: str  # the FwdConfig field that selects it in interface.py
    test_path: str  # the upstream test the patch adds
    test_template: str  # its text, in upstream's test style (ours, under search/reviewing/upstream_files/)
    can_implement: str  # the upstream-style can_implement method (source, indented for the class body)
    header: str = ""  # the new file's opening comment (format fields: flag, source, our_class); "" for HEADER
    module_cut: tuple[str, ...] = ()  # top-level names of our module that only our protocol uses, cut with it
    member_cut: tuple[str, ...] = ()  # class members the upstream file does not carry (ours only, or off in it),
    # each with the comment lines right above it
    # (old, new, what) edits of the carried text, each matching once: the uses of what was cut, comments citing ours
    source_edits: tuple[tuple[str, str, str], ...] = ()

    @property
    def module(self) -> str:
        """The new file as an import path (flash_attn.cute....)."""
        return self.upstream_path.removesuffix(".py").replace("/", ".")


TMA_CAN_IMPLEMENT = '''
    @staticmethod
    def can_implement(
        dtype,
        head_dim,
        head_dim_v,
        tile_m,
        tile_n,
        num_stages,
        num_threads,
        is_causal,
        Q_in_regs=False,
        qhead_per_kvhead=1,
    ) -> bool:
        """Check if the kernel can be implemented on SM120.

        FlashAttentionForwardSm120's rules, with this class's shared storage: each tile (head_dim padded to
        16) aligned to 1024 B, as the 128-byte TMA swizzle needs, plus an 8-byte mbarrier for Q and one per K
        stage and per V stage, the whole rounded up to 1024 B. Q_in_regs shares Q's buffer with V, which
        needs one stage; with GQA packing, tile_m must be a power of two no larger than num_threads.
        """
        if dtype not in [cutlass.Float16, cutlass.BFloat16]:
            return False
        if head_dim % 8 != 0 or head_dim_v % 8 != 0:
            return False
        if tile_n % 16 != 0:
            return False
        if num_threads % 32 != 0:
            return False
        if (tile_m * 2) % num_threads != 0:
            return False
        if Q_in_regs and num_stages > 1:
            return False
        if qhead_per_kvhead > 1 and (tile_m & (tile_m - 1) != 0 or tile_m > num_threads):
            return False

        def tile_bytes(rows, hdim, stages=1):
            return -(-rows * (-(-hdim // 16) * 16) * stages * 2 // 1024) * 1024

        smem_usage_Q = tile_bytes(tile_m, head_dim)
        smem_usage_K = tile_bytes(tile_n, head_dim, num_stages)
        smem_usage_V = tile_bytes(tile_n, head_dim_v, num_stages)
        smem_usage_QV = (
            (smem_usage_Q + smem_usage_V) if not Q_in_regs else max(smem_usage_Q, smem_usage_V)
        )
        smem_usage_mbar = MBARRIER_BYTES * FlashAttentionForwardSm120TmaElected.num_mbarriers(num_stages)
        smem_usage = -(-(smem_usage_QV + smem_usage_K + smem_usage_mbar) // 1024) * 1024
        return smem_usage <= utils_basic.get_smem_capacity_in_bytes("sm_120")
'''

GEMM_PV_OLD = (  # gemm_PV with its `n_valid` branch (the trimmed variant's)
    '    def gemm_PV(self, P: cute.Tensor, stage: Int32, mma_params: SimpleNamespace, smem_copy_params: SimpleNamespace,\n'
    '                n_valid: Optional[Int32] = None):\n'
    '        """O += P V from V\'s buffer `stage` (P: the softmax\'s probabilities in the input dtype, S\'s layout). With\n'
    '        `n_valid`, only the k steps (keys) that start before it: one branch per count of steps, each branch\n'
    '        upstream\'s pipelined loop over its first steps (no branch between a load and its MMA)."""\n'
    '        tOrP = layout_utils.reshape_acc_to_frgA(P)\n'
    '        tOsVt = smem_copy_params.tOsVt[None, None, None, stage]\n'
    '        if const_expr(n_valid is None):\n'
    '            sm80_utils.gemm_rs(mma_params.thr_mma_pv, mma_params.acc_O, tOrP, mma_params.tOrVt, tOsVt,\n'
    '                               smem_copy_params.smem_thr_copy_V)\n'
    '        else:\n'
    '            num_k = const_expr(cute.size(tOrP.shape[2]))\n'
    '            k_width = const_expr(self.tile_n // num_k)  # keys per k step\n'
    '            steps = Int32(0)\n'
    '            for k in cutlass.range_constexpr(num_k):\n'
    '                steps += Int32(k * k_width < n_valid)\n'
    '            smem_thr_copy_V = smem_copy_params.smem_thr_copy_V\n'
    '            tOrVt_copy_view = smem_thr_copy_V.retile(mma_params.tOrVt)\n'
    '            for count in cutlass.range_constexpr(1, num_k + 1):\n'
    '                if steps == count:  # gemm_rs over the first `count` k steps\n'
    '                    cute.copy(smem_thr_copy_V, tOsVt[None, None, 0], tOrVt_copy_view[None, None, 0])\n'
    '                    for k in cutlass.range_constexpr(count):\n'
    '                        if const_expr(k + 1 < count):\n'
    '                            cute.copy(smem_thr_copy_V, tOsVt[None, None, k + 1], tOrVt_copy_view[None, None, k + 1])\n'
    '                        cute.gemm(mma_params.thr_mma_pv, mma_params.acc_O, tOrP[None, None, k],\n'
    '                                  mma_params.tOrVt[None, None, k], mma_params.acc_O)\n'
    '\n'
)

# The sliding-window loop (2026-12-07 s13: key blocks from a window's first, loads ahead bounded there) is not in the
# shipped entries' measurements yet: the carried class keeps the loop they were measured with (every block to 0).
LOCAL_WINDOW_EDITS = (
    ("            # no load below the first block this tile reads (a sliding window's n_block_min; 0 otherwise): a copy\n"
     "            # nobody waits for would still be landing when the CTA exits (with Q_in_regs, in the buffer O reuses)\n"
     "            n_block_floor = n_block_min if const_expr(self.is_local) else 0\n", "", "prologue floor"),
    ("load_K(n_block, 0)\n                    elif n_block - stage >= n_block_floor:\n",
     "load_K(n_block, 0)\n                    elif n_block - stage >= 0:\n", "prologue K floor"),
    ("load_V(n_block, 0)\n                    elif n_block - stage >= n_block_floor:\n",
     "load_V(n_block, 0)\n                    elif n_block - stage >= 0:\n", "prologue V floor"),
    ("the rest not. With a sliding window\n"
     "        (`is_local` with a left side) the blocks stop at n_block_min, those its left edge cuts masked, as upstream's\n"
     "        SM90 loop has it; upstream's SM80 loop (kernel \"sm120\") runs every block down to 0 through the mask.\"\"\"\n",
     "the rest not.\"\"\"\n", "mainloop docstring"),
    ("            n_block_floor=n_block_min if const_expr(self.is_local) else 0,\n", "", "mainloop floor"),
    ("        if const_expr(self.is_local and block_info.window_size_left is not None):\n"
     "            # inside the window: no mask (but a mask_mod's); then the blocks the window's left edge cuts, masked\n"
     "            n_block_left = block_info.get_n_block_min_before_local_mask(seqlen, m_block, n_block_min)\n"
     "            for n_tile in cutlass.range(cutlass.max(n_block - n_block_left, 0), unroll=1):\n"
     "                compute_one_n_block(\n"
     "                    n_block - n_tile - 1, iteration, seqlen=seqlen, is_first_n_block=False,\n"
     "                    mask_fn=partial(mask_fn, mask_mod=self.mask_mod, mask_seqlen=False)\n"
     "                    if const_expr(self.mask_mod is not None) else None,\n"
     "                )\n"
     "                iteration += 1\n"
     "            n_block_left = cutlass.min(n_block, n_block_left)\n"
     "            for n_tile in cutlass.range(n_block_left - n_block_min, unroll=1):\n"
     "                compute_one_n_block(\n"
     "                    n_block_left - n_tile - 1, iteration, seqlen=seqlen, is_first_n_block=False,\n"
     "                    mask_fn=partial(mask_fn, mask_mod=self.mask_mod, mask_seqlen=False),\n"
     "                )\n"
     "                iteration += 1\n"
     "        else:\n"
     "            for n_tile in cutlass.range(n_block, unroll=1):\n"
     "                compute_one_n_block(\n"
     "                    n_block - n_tile - 1, iteration, seqlen=seqlen, is_first_n_block=False,\n"
     "                    mask_fn=partial(mask_fn, mask_mod=self.mask_mod, mask_seqlen=False),\n"
     "                )\n"
     "                iteration += 1\n",
     "        for n_tile in cutlass.range(n_block, unroll=1):\n"
     "            compute_one_n_block(\n"
     "                n_block - n_tile - 1, iteration, seqlen=seqlen, is_first_n_block=False,\n"
     "                mask_fn=partial(mask_fn, mask_mod=self.mask_mod, mask_seqlen=False),\n"
     "            )\n"
     "            iteration += 1\n", "window loop"),
    ("        n_block_floor=0,\n", "", "compute_one_n_block floor"),
    (" column. Loads ahead stop at\n        `n_block_floor`, the tile's first block (0 but under a sliding window).\"\"\"\n",
     " column.\"\"\"\n", "compute_one_n_block docstring"),
    ("elif n_block - num_stages + 1 >= n_block_floor:", "elif n_block - num_stages + 1 >= 0:", "V floor"),
    ("if n_block - 1 >= n_block_floor:", "if n_block - 1 >= 0:", "K floor, one stage"),
    ("if n_block - num_stages >= n_block_floor:", "if n_block - num_stages >= 0:", "K floor"),
)

# The TMA class as measured: the trimmed-PV variant's switch (`trim_masked`, off in this class, on in a subclass of
# ours) and the fp16 opaque thread index (added 2026-12-06, after the shipped TMA entries were measured) stay ours.
TMA_SOURCE_EDITS = LOCAL_WINDOW_EDITS + (
    (" (tests/test_tma_kernel.py checks every coordinate)", "", "_tma_layout test reference"),
    ("        # fp16 always; bf16 where a warp owns at most 16 rows, where it costs no registers on sm_120a and the sm_90a\n"
     "        # build keeps its ldmatrix prefetch (at 32 rows a warp it spills more on sm_120a: bf16 traced as before)\n"
     "        if const_expr(self.dtype == cutlass.Float16 or self.tile_m // (self.num_threads // 32) <= 16):\n"
     "            tidx = opaque_i32(tidx)\n", "", "opaque thread index"),
    ("tOrVt=tOrVt, acc_O=acc_O,\n"
     "                                         warp_last_row=self.warp_last_row(thr_mma_qk) if const_expr(self.trim_masked) else None)\n",
     "tOrVt=tOrVt, acc_O=acc_O)\n", "mma_params warp_last_row"),
    ("        trim = {\"trim\": True} if const_expr(self.trim_masked) else {}  # the masked blocks' (a subclass's own\n"
     "        # compute_one_n_block need not take it)\n", "", "mainloop trim"),
    ("\n            mask_fn=partial(mask_fn, mask_mod=self.mask_mod, mask_seqlen=True), **trim,\n",
     "\n            mask_fn=partial(mask_fn, mask_mod=self.mask_mod, mask_seqlen=True),\n", "first block trim"),
    ("\n                    mask_fn=partial(mask_fn, mask_mod=self.mask_mod, mask_seqlen=True), **trim,\n",
     "\n                    mask_fn=partial(mask_fn, mask_mod=self.mask_mod, mask_seqlen=True),\n", "masked blocks trim"),
    ("        check_inf: cutlass.Constexpr = True,\n        trim: cutlass.Constexpr = False,\n    ):\n"
     "        \"\"\"One n_block of S = QK^T and O += PV: upstream's order of loads and gemms, mbarrier waits. `trim` (a masked\n"
     "        block of a `trim_masked` class): the PV gemm stops at the warp's last visible key column.\"\"\"\n"
     "        n_valid = self.warp_visible_cols(n_block, m_block, seqlen, mma_params.warp_last_row) if const_expr(trim) else None\n",
     "        check_inf: cutlass.Constexpr = True,\n    ):\n"
     "        \"\"\"One n_block of S = QK^T and O += PV: upstream's order of loads and gemms, mbarrier waits.\"\"\"\n",
     "compute_one_n_block trim"),
    ("        self.gemm_PV(rP, stage, mma_params, smem_copy_params, n_valid=n_valid)\n",
     "        self.gemm_PV(rP, stage, mma_params, smem_copy_params)\n", "gemm_PV call"),
    (GEMM_PV_OLD,
     "    def gemm_PV(self, P: cute.Tensor, stage: Int32, mma_params: SimpleNamespace, smem_copy_params: SimpleNamespace):\n"
     "        \"\"\"O += P V from V's buffer `stage` (P: the softmax's probabilities in the input dtype, S's layout).\"\"\"\n"
     "        tOrP = layout_utils.reshape_acc_to_frgA(P)\n"
     "        tOsVt = smem_copy_params.tOsVt[None, None, None, stage]\n"
     "        sm80_utils.gemm_rs(mma_params.thr_mma_pv, mma_params.acc_O, tOrP, mma_params.tOrVt, tOsVt,\n"
     "                           smem_copy_params.smem_thr_copy_V)\n",
     "gemm_PV without trimming"),
)

TMA = CarriedClass(
    kernel="sm120_tma",
    source="kernels/tma_forward_sm120.py",
    our_class="TmaForwardSm120",
    our_base="TunedForwardSm120",
    upstream_path="flash_attn/cute/flash_fwd_sm120_tma_elected.py",
    upstream_class="FlashAttentionForwardSm120TmaElected",
    upstream_base="flash_attn.cute.flash_fwd_sm120.FlashAttentionForwardSm120",
    flag="use_tma",
    test_path="tests/cute/test_flash_attn_sm120_tma_elected.py",
    test_template="test_flash_attn_sm120_tma_elected.py.txt",
    can_implement=TMA_CAN_IMPLEMENT,
    module_cut=("visible_keys", "opaque_i32"),
    member_cut=("trim_masked", "warp_last_row", "warp_visible_cols"),
    source_edits=TMA_SOURCE_EDITS,
)
CARRIED = {c.kernel: c for c in (TMA,)}

HEADER = (
    "# SM120 forward pass with Q/K/V tiles loaded by TMA (bulk tensor copies completing on mbarriers).\n"
    "#\n"
    "# Same math as FlashAttentionForwardSm120 (SM80 mma.sync, ldmatrix, online softmax, epilogue); only the\n"
    "# loads differ. Selected per shape by config.select_sm120_fwd_tile (FwdConfig.{flag}).\n"
)
EXTRA_IMPORTS = "import cutlass.utils as utils_basic\n"


def carried(kernel: str) -> CarriedClass | None:
    """The carried class of a `kernel` knob value, or None when export cannot carry it."""
    return CARRIED.get(kernel)


def _segment(lines: list[str], node: ast.AST) -> tuple[int, int]:
    """0-based [start, end) lines of a statement, decorators included."""
    start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
    return start, node.end_lineno


def upstream_source(c: CarriedClass, root: Path = ROOT) -> str:
    """The new upstream file: our module with upstream-only imports, the protocol cut, upstream's base and can_implement."""
    path = root / c.source
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    tree = ast.parse(text)
    module_base, base_name = c.upstream_base.rsplit(".", 1)
    out: list[str] = [(c.header or HEADER).format(flag=c.flag, source=c.source, our_class=c.our_class)]
    dropped: set[str] = set()
    cls = None
    previous_end = 0
    for i, node in enumerate(tree.body):
        start, end = _segment(lines, node)
        between = "".join(lines[previous_end:start])  # comments and blank lines between statements, kept as they are
        previous_end = end
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # our module docstring: the header replaces it
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in OURS:
            dropped |= {a.asname or a.name for a in node.names}
            continue
        if _top_level_names(node) & set(c.module_cut):
            continue  # used by our protocol only (e.g. split-KV's ctas_per_sm, which reads our targets)
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] in OURS for a in node.names):
            raise ConfigError("carry_source", f"{c.source}:{node.lineno}: `import {node.names[0].name}` is fa4-tune's own; "
                              "a carried class may import only what upstream has")
        out.append(between)
        if isinstance(node, ast.ClassDef) and node.name == c.our_class:
            cls = node
            out.append(_upstream_class(c, lines, node))
            continue
        out.append("".join(lines[start:end]))
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node is _last_import(tree):
            out.append(EXTRA_IMPORTS + f"from {module_base} import {base_name}\n")
    if cls is None:
        raise ConfigError("carry_source", f"{c.source} defines no class {c.our_class}")
    source = apply_edits("".join(out).rstrip("\n") + "\n", c.source_edits)
    leaks = sorted({word for word in LEAKS if word in source}
                   | {m.group() for p in LEAK_PATTERNS for m in p.finditer(source)})
    if leaks:
        raise ConfigError("carry_source", f"{c.source}: the carried {c.upstream_path} names {', '.join(leaks)}, which is "
                          "fa4-tune's own (cut it with the CarriedClass's member_cut / source_edits)")
    used = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
    leftover = sorted(used & dropped)
    if leftover:
        raise ConfigError("carry_source", f"{c.source}: {c.our_class} uses {', '.join(leftover)} from fa4-tune's own modules, "
                          "which upstream does not have (move it into the class or use upstream's)")
    return source


def _top_level_names(node: ast.AST) -> set[str]:
    """The names a module-level def, class or assignment binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _last_import(tree: ast.Module) -> ast.AST:
    return [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
            and not (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] in OURS)][-1]


def _upstream_class(c: CarriedClass, lines: list[str], node: ast.ClassDef) -> str:
    """The class with upstream's name and base, its protocol members cut, upstream-style can_implement added."""
    bases = [ast.unparse(b) for b in node.bases]
    if bases != [c.our_base]:
        raise ConfigError("carry_source", f"{c.source}: {c.our_class} subclasses {', '.join(bases)}, expected {c.our_base} "
                          f"(whose place upstream's {c.upstream_base.rsplit('.', 1)[1]} takes)")
    start, end = _segment(lines, node)
    header_end = node.body[0].lineno - 1  # the `class ...:` line(s)
    cut: set[int] = set()
    for member in node.body:
        targets = ([member.name] if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) else
                   [t.id for t in getattr(member, "targets", [getattr(member, "target", None)]) if isinstance(t, ast.Name)])
        if any(t in PROTOCOL_MEMBERS or t in c.member_cut for t in targets):
            s, e = _segment(lines, member)
            while s > header_end and lines[s - 1].lstrip().startswith("#"):  # the comment above it is about it
                s -= 1
            while e < end and not lines[e].strip():  # the blank line after a cut member
                e += 1
            cut |= set(range(s, e))
    body = "".join(line for i, line in enumerate(lines[header_end:end], header_end) if i not in cut)
    base_name = c.upstream_base.rsplit(".", 1)[1]
    last = body.rstrip("\n")
    return f"class {c.upstream_class}({base_name}):\n" + last + "\n" + c.can_implement


def upstream_test(c: CarriedClass) -> str:
    """The upstream test file the patch adds for a carried class."""
    return (TEMPLATES / c.test_template).read_text()


SPLITKV_CTAS_PER_SM = '''
    @staticmethod
    def ctas_per_sm(head_dim, head_dim_v, tile_m, tile_n, num_stages, num_threads, Q_in_regs=False) -> int:
        """CTAs of this kernel one SM120 SM holds at once: split_kv_heuristic's slots are SMs x this.

        By shared memory (Q, K and V tiles, each aligned to 1024 B; with Q_in_regs V shares Q's buffer; 1 KB
        reserved per CTA; 100 KB per SM), threads (1536 per SM), CTAs (32 per SM) and registers (65536 per SM,
        ASSUMED_REGISTERS per thread, since the count is not known before compiling).
        """

        def tile_bytes(rows, hdim, stages=1):
            return -(-rows * (-(-hdim // 16) * 16) * stages * 2 // 1024) * 1024

        smem_Q = tile_bytes(tile_m, head_dim)
        smem_K = tile_bytes(tile_n, head_dim, num_stages)
        smem_V = tile_bytes(tile_n, head_dim_v, num_stages)
        smem = (max(smem_Q, smem_V) if Q_in_regs else smem_Q + smem_V) + smem_K + 1024
        by_registers = 65536 // (num_threads * ASSUMED_REGISTERS)
        return max(1, min(102400 // smem, 1536 // num_threads, 32, by_registers))
'''

SPLITKV_HEADER = (
    "# SM120 split-KV forward (decode): FlashAttentionForwardSm120 with the KV sequence split across CTAs.\n"
    "#\n"
    "# Each split writes fp32 partial O and LSE; the interface merges them with the combine kernel\n"
    "# (flash_fwd_combine). Selected for decodes by config.select_sm120_decode_fwd_tile (FwdConfig.{flag}).\n"
)

# Split-KV: our search's split domain and the host wording of our interface stay ours; the comments cite upstream only.
SPLITKV_SOURCE_EDITS = (
    ("max_splits: int = SPLITS_DOMAIN[-1]) -> int:", "max_splits: int = 128) -> int:", "split_kv_heuristic max_splits"),
    ("    # CTA, a partial and a combine wider than 32 (docs/measurements/2026-12-03-h200-decode-split-rounding.md)\n",
     "    # CTA, a partial and a combine wider than 32\n", "split rounding comment"),
    ("The host (fa4tune.sm120_interface) allocates the partials when num_splits_for(...) > 1 and\n"
     "    runs upstream's combine after;",
     "The interface allocates the partials when FwdConfig.num_splits > 1 and runs\n"
     "    flash_fwd_combine after;", "class docstring host"),
)

# Patch 2's dispatch keeps varlen (seqused_k included), paged KV, learnable sinks, score/mask mods and sliding windows off
# split-KV: the carried class is the plain decode class its table was measured with, and refuses them as that one did.
SPLITKV_DECODE_ONLY_EDITS = (
    ("num_splits: int = 0, page_size: int = 0, **kwargs):\n"
     "        super().__init__(*args, **kwargs)\n"
     "        self.num_splits = num_splits  # the host's choice reaches the kernel as the partials' leading extent\n"
     "        self.page_size = page_size  # a paged call's tokens per page (0: a contiguous cache); the host passes it\n"
     "        self.V_ahead = not self.Q_in_regs  # the prologue sends the last stage's V too (see mainloop)\n"
     '        assert self.mask_mod is None, "sm120_splitkv has no mask_mod (its score_mod: the soft-cap\'s)"\n',
     "num_splits: int = 0, **kwargs):\n"
     "        super().__init__(*args, **kwargs)\n"
     "        self.num_splits = num_splits  # the host's choice reaches the kernel as the partials' leading extent\n"
     "        self.V_ahead = not self.Q_in_regs  # the prologue sends the last stage's V too (see mainloop)\n"
     "        assert self.score_mod is None and self.mask_mod is None and not self.is_local, \\\n"
     '            "sm120_splitkv has no score_mod / mask_mod / local window"\n', "__init__"),
    ("(num_splits, b, h, s);\n"
     "        mSeqUsedK (a KV cache's used lengths, one per sequence) bounds each sequence's KV blocks and so its splits.\n"
     "        With mPageTable (batch, pages per sequence) K and V are page pools (num_pages, page_size, h_kv, d).\"\"\"\n"
     '        assert (mPageTable is not None) == (self.page_size > 0), "sm120_splitkv: a page table needs its page_size"\n'
     "        assert mCuSeqlensQ is None and mCuSeqlensK is None and mSeqUsedQ is None, \\\n"
     '            "sm120_splitkv: no packed batches, no seqused_q (seqused_k only)"\n',
     "(num_splits, b, h, s).\"\"\"\n"
     '        assert learnable_sink is None and mPageTable is None, "sm120_splitkv: no learnable sink, no paged KV"\n'
     "        assert mCuSeqlensQ is None and mCuSeqlensK is None and mSeqUsedQ is None and mSeqUsedK is None, \\\n"
     '            "sm120_splitkv: no varlen"\n', "__call__ asserts"),
    ("(s, d, h, b) (page pools: (page_size, d, h, page)); the partials' split mode goes last\n",
     "(s, d, h, b); the partials' split mode goes last: (s, d, h, b, split)\n", "layout comment"),
    ("        if const_expr(window_size_left is not None):\n"
     "            window_size_left = Int32(window_size_left)\n"
     "        if const_expr(window_size_right is not None):\n"
     "            window_size_right = Int32(window_size_right)\n"
     "        self.kernel(\n"
     "            mQ, mK, mV, mO, mLSE, mSeqUsedK, mPageTable, softmax_scale_log2, softmax_scale, num_splits,\n"
     "            window_size_left, window_size_right,\n"
     "            self.sQ_layout, self.sK_layout, self.sV_layout, self.sO_layout,\n"
     "            self.gmem_tiled_copy_Q, self.gmem_tiled_copy_K, self.gmem_tiled_copy_V, self.gmem_tiled_copy_O,\n"
     "            tiled_mma_qk, tiled_mma_pv, SharedStorage, tile_sched_params, learnable_sink,\n",
     "        self.kernel(\n"
     "            mQ, mK, mV, mO, mLSE, softmax_scale_log2, softmax_scale, num_splits,\n"
     "            self.sQ_layout, self.sK_layout, self.sV_layout, self.sO_layout,\n"
     "            self.gmem_tiled_copy_Q, self.gmem_tiled_copy_K, self.gmem_tiled_copy_V, self.gmem_tiled_copy_O,\n"
     "            tiled_mma_qk, tiled_mma_pv, SharedStorage, tile_sched_params,\n", "kernel launch"),
    ("        mSeqUsedK: Optional[cute.Tensor],\n"
     "        mPageTable: Optional[cute.Tensor],\n"
     "        softmax_scale_log2: Float32,\n"
     "        softmax_scale: Optional[Float32],\n"
     "        num_splits: Int32,\n"
     "        window_size_left: Optional[Int32],\n"
     "        window_size_right: Optional[Int32],\n",
     "        softmax_scale_log2: Float32,\n"
     "        softmax_scale: Optional[Float32],\n"
     "        num_splits: Int32,\n", "kernel parameters"),
    ("        tile_sched_params,\n        learnable_sink: Optional[cute.Tensor] = None,\n",
     "        tile_sched_params,\n", "kernel sink parameter"),
    ("        # keys per sequence: a page-table row's pages, or the cache's rows\n"
     "        seqlen_k_static = mK.shape[0] if const_expr(mPageTable is None) else self.page_size * mPageTable.shape[1]\n"
     "        m_block, head_idx, batch_idx = self.order_tile(m_block, head_idx, batch_idx, seqlen_k_static)\n"
     "        qhead_packed = self.qhead_per_kvhead if const_expr(self.pack_gqa) else 1\n"
     "        block_info = BlockInfo(self.tile_m, self.tile_n, self.is_causal, self.is_local, self.is_split_kv,\n"
     "                               window_size_left, window_size_right, qhead_per_kvhead_packgqa=qhead_packed,\n"
     "                               num_splits=num_splits)\n"
     "        seqlen = SeqlenInfoQK.create(\n"
     "            batch_idx=batch_idx,\n"
     "            seqlen_q_static=mQ.shape[0] if const_expr(not self.pack_gqa) else mQ.shape[0][1],\n"
     "            seqlen_k_static=seqlen_k_static,\n"
     "            mSeqUsedK=mSeqUsedK,  # this sequence's used keys: its split ranges divide them, its masks stop at them\n",
     "        m_block, head_idx, batch_idx = self.order_tile(m_block, head_idx, batch_idx, mK.shape[0])\n"
     "        qhead_packed = self.qhead_per_kvhead if const_expr(self.pack_gqa) else 1\n"
     "        block_info = BlockInfo(self.tile_m, self.tile_n, self.is_causal, False, self.is_split_kv,\n"
     "                               qhead_per_kvhead_packgqa=qhead_packed,\n"
     "                               num_splits=num_splits)\n"
     "        seqlen = SeqlenInfoQK.create(\n"
     "            batch_idx=batch_idx,\n"
     "            seqlen_q_static=mQ.shape[0] if const_expr(not self.pack_gqa) else mQ.shape[0][1],\n"
     "            seqlen_k_static=mK.shape[0],\n", "block range"),
    ("n_block_max, tidx, mPageTable)\n"
     "            softmax.rescale_O(acc_O, softmax.finalize())\n"
     "        else:\n"
     "            # an empty split (or an empty KV): O stays 0 and the LSE -inf, so the combine gives it no weight\n"
     "            softmax.row_sum.fill(-Float32.inf)\n"
     "        if const_expr(learnable_sink is not None):\n"
     "            if split_idx == 0:  # once per row: the combine weighs split 0's folded partial by its LSE, the sink with it\n"
     "                self.fold_learnable_sink(acc_O, softmax.row_sum, learnable_sink, tiled_mma_pv, tidx, m_block, head_idx)\n",
     "n_block_max, tidx)\n"
     "            softmax.rescale_O(acc_O, softmax.finalize())\n"
     "        else:\n"
     "            # an empty split (or an empty KV): O stays 0 and the LSE -inf, so the combine gives it no weight\n"
     "            softmax.row_sum.fill(-Float32.inf)\n", "sink fold"),
    ("n_block_max, tidx, mPageTable=None):\n"
     "        \"\"\"Upstream's SM80 mainloop over KV blocks [n_block_min, n_block_max), last block first; K and V from a\n"
     "        contiguous cache, or gathered from their pages (load_paged).\"\"\"\n"
     "        num_head_kv = head_idx if const_expr(self.pack_gqa) else head_idx // self.qhead_per_kvhead\n"
     "        mQ_cur = mQ[None, None, head_idx, batch_idx]\n"
     "        paged = const_expr(mPageTable is not None)\n"
     "        # a page pool's (page_size, d, page) of this KV head, or this sequence's (s, d) tiled into KV blocks\n"
     "        mK_cur = mK[None, None, num_head_kv, None] if paged else mK[None, None, num_head_kv, batch_idx]\n"
     "        mV_cur = mV[None, None, num_head_kv, None] if paged else mV[None, None, num_head_kv, batch_idx]\n"
     "        if const_expr(not paged):\n"
     "            gK = cute.local_tile(mK_cur, (self.tile_n, self.tile_hdim), (None, 0))\n"
     "            gV = cute.local_tile(mV_cur, (self.tile_n, self.tile_hdimv), (None, 0))\n"
     "        else:  # the first tile of page 0: only its partition's layout is used (load_paged moves it to each row's page)\n"
     "            gK = cute.local_tile(mK_cur[None, None, 0], (self.tile_n, self.tile_hdim), (0, 0))\n"
     "            gV = cute.local_tile(mV_cur[None, None, 0], (self.tile_n, self.tile_hdimv), (0, 0))\n",
     "n_block_max, tidx):\n"
     "        \"\"\"Upstream's SM80 mainloop over KV blocks [n_block_min, n_block_max), last block first.\"\"\"\n"
     "        num_head_kv = head_idx if const_expr(self.pack_gqa) else head_idx // self.qhead_per_kvhead\n"
     "        mQ_cur = mQ[None, None, head_idx, batch_idx]\n"
     "        gK = cute.local_tile(mK[None, None, num_head_kv, batch_idx], (self.tile_n, self.tile_hdim), (None, 0))\n"
     "        gV = cute.local_tile(mV[None, None, num_head_kv, batch_idx], (self.tile_n, self.tile_hdimv), (None, 0))\n",
     "mainloop tiles"),
    ("        if const_expr(not paged):\n"
     "            load_K = partial(self.load_K, gmem_tiled_copy_K, tKgK, tKsK, tKcK, t0KcK, tKpK, seqlen=seqlen.seqlen_k)\n"
     "            load_V = partial(self.load_V, gmem_tiled_copy_V, tVgV, tVsV, tVcV, t0VcV, tVpV, seqlen=seqlen.seqlen_k)\n"
     "        else:\n"
     "            page_row = mPageTable[batch_idx, None]\n"
     "            load_K = partial(self.load_paged, gmem_tiled_copy_K, gmem_thr_copy_K, mK_cur, page_row, tKgK, tKsK, tKcK,\n"
     "                             t0KcK, tKpK, self.tile_hdim, self.check_hdim_oob, seqlen=seqlen.seqlen_k)\n"
     "            load_V = partial(self.load_paged, gmem_tiled_copy_V, gmem_thr_copy_V, mV_cur, page_row, tVgV, tVsV, tVcV,\n"
     "                             t0VcV, tVpV, self.tile_hdimv, self.check_hdim_v_oob, seqlen=seqlen.seqlen_k)\n",
     "        load_K = partial(self.load_K, gmem_tiled_copy_K, tKgK, tKsK, tKcK, t0KcK, tKpK, seqlen=seqlen.seqlen_k)\n"
     "        load_V = partial(self.load_V, gmem_tiled_copy_V, tVgV, tVsV, tVcV, t0VcV, tVpV, seqlen=seqlen.seqlen_k)\n",
     "mainloop loads"),
    ("            score_fn=partial(self.apply_score_mod, thr_mma_qk, batch_idx, head_idx, m_block, softmax_scale=softmax.softmax_scale,\n"
     "                             seqlen=seqlen) if const_expr(self.score_mod is not None) else None,\n", "", "score_fn"),
    ("        # a window masks every block as the causal mask does (upstream's SM80 loop masks each block causally); its\n"
     "        # splits divide the window's blocks alone (block_info), so no block wholly outside it is read\n"
     "        mask = AttentionMask(self.tile_m, self.tile_n, seqlen, block_info.window_size_left,\n"
     "                             block_info.window_size_right, qhead_packed_of(self))\n"
     "        mask_fn = partial(mask.apply_mask, batch_idx=batch_idx, head_idx=head_idx, m_block=m_block, thr_mma=thr_mma_qk,\n"
     "                          mask_causal=self.is_causal, mask_local=self.is_local, mask_mod=None)\n",
     "        mask = AttentionMask(self.tile_m, self.tile_n, seqlen, None, None, qhead_packed_of(self))\n"
     "        mask_fn = partial(mask.apply_mask, batch_idx=batch_idx, head_idx=head_idx, m_block=m_block, thr_mma=thr_mma_qk,\n"
     "                          mask_causal=self.is_causal, mask_local=False, mask_mod=None)\n", "mask"),
    ("mask_fn: Callable, score_fn: Optional[Callable] = None,\n"
     "                      is_first_n_block: cutlass.Constexpr = False):\n"
     "        \"\"\"One KV block: S = Q K^T, the score_mod (score_fn: a soft-cap), mask, online softmax, O += P V; upstream's\n"
     "        compute_one_n_block, except that the next K/V loads stop at the split's first block (n_block_min), not at 0.\"\"\"\n",
     "mask_fn: Callable,\n"
     "                      is_first_n_block: cutlass.Constexpr = False):\n"
     "        \"\"\"One KV block: S = Q K^T, mask, online softmax, O += P V; upstream's compute_one_n_block, except that\n"
     "        the next K/V loads stop at the split's first block (n_block_min), not at block 0.\"\"\"\n", "compute_block"),
    ("        if const_expr(score_fn is not None):\n            score_fn(acc_S, n_block)\n", "", "score_mod"),
)

# Not in CARRIED: the single-patch export keeps falling back to upstream's kernel for a split-KV winner; the
# series (search.reviewing.series) carries it for the decode classes, whose table keys on the query length.
SPLITKV = CarriedClass(
    kernel="sm120_splitkv",
    source="kernels/splitkv_forward_sm120.py",
    our_class="SplitKvForwardSm120",
    our_base="TunedForwardSm120",
    upstream_path="flash_attn/cute/flash_fwd_sm120_splitkv.py",
    upstream_class="FlashAttentionForwardSm120SplitKV",
    upstream_base="flash_attn.cute.flash_fwd_sm120.FlashAttentionForwardSm120",
    flag="use_split_kv",
    test_path="tests/cute/test_flash_attn_sm120_splitkv.py",
    test_template="test_flash_attn_sm120_splitkv.py.txt",
    can_implement=SPLITKV_CTAS_PER_SM,
    header=SPLITKV_HEADER,
    module_cut=("ctas_per_sm", "STATIC_SHAPES", "SPLITS_DOMAIN"),
    member_cut=("num_n_blocks", "load_paged", "_copy_row"),
    source_edits=SPLITKV_SOURCE_EDITS + SPLITKV_DECODE_ONLY_EDITS,
)


def apply_edits(source: str, edits) -> str:
    """An upstream file's source with each (old, new, what) edit applied, each checked to match exactly once: a
    mismatch (another upstream version) is one `upstream_source` error naming the edit."""
    for old, new, what in edits:
        try:
            source = _replace_once(source, old, new, what)
        except UpstreamMismatch as err:
            raise ConfigError("upstream_source", str(err))
    return source
