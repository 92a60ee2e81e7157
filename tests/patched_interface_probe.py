"""Compiles through a patched upstream interface (fake tensors, sm_120a) and prints what reached the kernels.

Run by tests/test_search_export.py in a subprocess whose PYTHONPATH starts with the patched copy of
flash_attn/cute, since the DSL reads its arch from the environment at import time. Reads a JSON list of
problem classes on stdin: {"kind": "fwd"|"bwd", "head_dim", "causal", "qhead_per_kvhead"}.
"""

import json
import os
import sys
import warnings

os.environ.update(FLASH_ATTENTION_ARCH="sm_120", CUTE_DSL_ARCH="sm_120a", FLASH_ATTENTION_NUM_SMS="170")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from flash_attn.cute import interface  # noqa: E402

from fa4tune.upstream import BWD_FIELD_NAMES  # noqa: E402  (our names for upstream's BwdConfig fields)

FWD_ATTRS = ("tile_m", "tile_n", "num_threads", "num_stages", "Q_in_regs")
BWD_ATTRS = ("m_block_size", "n_block_size", "num_stages_Q", "num_stages_dO", "num_threads", "SdP_swapAB", "dKV_swapAB",
             "dQ_swapAB", "AtomLayoutMSdP", "AtomLayoutNdKV", "AtomLayoutMdQ", "V_in_regs")
built, postprocess = [], []


def recording(base, into):
    """A subclass of a kernel class that remembers every object the interface builds."""
    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **kwargs)
        into.append(self)
    return type(base.__name__, (base,), {"__init__": __init__, "__module__": base.__module__})


interface.FlashAttentionForwardSm120 = recording(interface.FlashAttentionForwardSm120, built)
if hasattr(interface, "FlashAttentionForwardSm120TmaElected"):  # a patch that carries fa4-tune's TMA class
    interface.FlashAttentionForwardSm120TmaElected = recording(interface.FlashAttentionForwardSm120TmaElected, built)
interface.FlashAttentionBackwardSm120 = recording(interface.FlashAttentionBackwardSm120, built)
interface.FlashAttentionBackwardPostprocess = recording(interface.FlashAttentionBackwardPostprocess, postprocess)
compiled = []
_compile = interface.cute.compile


def counting_compile(*args, **kwargs):
    """cute.compile, counted: the kernels of a job really compile for sm_120a (fake tensors only skip the launch)."""
    fn = _compile(*args, **kwargs)
    compiled.append(type(args[0]).__name__)
    return fn


interface.cute.compile = counting_compile

from flash_attn.cute import mask as mask_module  # noqa: E402

r2p_verdicts = []  # what the fixed mask's column check answered while the kernels traced (a patch with the fix)
if hasattr(mask_module, "r2p_columns_ordered"):
    _ordered = mask_module.r2p_columns_ordered

    def recording_ordered(t0ScS_mn):
        r2p_verdicts.append(_ordered(t0ScS_mn))
        return r2p_verdicts[-1]

    mask_module.r2p_columns_ordered = recording_ordered

report = []
for job in json.loads(sys.stdin.read()):
    s, hd, gqa = 512, job["head_dim"], job["qhead_per_kvhead"]
    if job["kind"] == "fwd_config":  # what the interface selects, without compiling
        cfg = interface.select_fwd_config(interface.FwdHeuristicInputs(
            device_arch=120, num_sms=170, dtype=str(torch.bfloat16), head_dim=hd, head_dim_v=hd, num_heads=2 * gqa,
            num_heads_kv=2, batch_size=1, total_q=s, total_k=s, max_seqlen_q=s, max_seqlen_k=s, causal=job["causal"],
        ))
        report.append({"job": job, "config": {n: getattr(cfg, n) for n in FWD_ATTRS}})
        continue
    if job["kind"] == "bwd_config":
        cfg = interface.select_bwd_config(interface.BwdHeuristicInputs(
            device_arch=120, head_dim=hd, head_dim_v=hd, num_heads=2 * gqa, num_heads_kv=2, dtype=str(torch.bfloat16),
            causal=job["causal"],
        ))
        report.append({"job": job, "config": {n: getattr(cfg, BWD_FIELD_NAMES.get(n, n)) for n in BWD_ATTRS}})
        continue
    before, compiled_before, verdicts_before = len(postprocess), len(compiled), len(r2p_verdicts)
    with FakeTensorMode():
        q = torch.empty(1, s, 2 * gqa, hd, dtype=torch.bfloat16, device="cuda")
        kv = torch.empty(1, s, 2, hd, dtype=torch.bfloat16, device="cuda")
        if job["kind"] == "fwd":
            interface._flash_attn_fwd(q, kv, kv, causal=job["causal"], return_lse=True)
            names = FWD_ATTRS
        else:
            lse = torch.empty(1, q.shape[2], s, dtype=torch.float32, device="cuda")
            interface._flash_attn_bwd(q, kv, kv, q, q, lse, causal=job["causal"])
            names = BWD_ATTRS
    kernel = built[-1]
    entry = {"job": job, "kernel": {n: getattr(kernel, n) for n in names if hasattr(kernel, n)}, "compiled": compiled[compiled_before:],
             "r2p_columns_ordered": r2p_verdicts[verdicts_before:]}
    if job["kind"] == "bwd":
        entry["postprocess_threads"] = sorted({p.num_threads for p in postprocess[before:]})
    report.append(entry)
print("PROBE " + json.dumps({"jobs": report, "interface": interface.__file__}))
