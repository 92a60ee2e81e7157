"""Compile probe (a subprocess of tests/test_bench_peers.py): #2634's kernels and an autotuner candidate for sm_120a
with fake tensors, one shape each, from the assembled .peers/. Prints one JSON line: each compile's status and the
kernel #2634's dispatch built, and the decode kernel's cubin facts."""

import probe_env  # noqa: F401  (first: the DSL reads its arch at import)
import json  # noqa: E402
import os  # noqa: E402

os.environ["CUTE_DSL_KEEP"] = "ptx,cubin"  # the decode kernel's facts are read from its cubin

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from bench import peer_candidates, peer_configs  # noqa: E402
from fa4tune.config import Problem  # noqa: E402

prefill = Problem(1, 1024, 1024, 4, 4, 128, 128, True, name="mha prefill")
gqa_decode = Problem(2, 1, 4096, 8, 2, 128, 128, False, backward=False, name="gqa decode")
out = {
    "dispatch_fwd": peer_candidates.compile_job(peer_candidates.pr2634_job("pr2634", "fwd", [prefill])),
    "dispatch_bwd": peer_candidates.compile_job(peer_candidates.pr2634_job("pr2634", "bwd", [prefill])),
}
from flash_attn.cute import config as config_module  # noqa: E402

picked = peer_configs.fwd_config(config_module, prefill, 170, 128, 128)
out["autotune"] = peer_candidates.compile_job(peer_candidates.autotune_job(picked, [prefill]))

# the decode kernel: its dispatch leaves it out of fake-tensor calls, so it is built as its interface builds it
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402

from fa4tune.cubin import read_cubin  # noqa: E402

interface = peer_candidates.load_pr2634()
to_cute_tensor = interface.to_cute_tensor
b, hkv, group, d, splits = 2, 2, 4, 128, 4
with FakeTensorMode():
    q = torch.empty(b, 1, hkv * group, d, dtype=torch.bfloat16, device="cuda")
    k = torch.empty(b, 4096, hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.empty_like(k)
    out_partial = torch.empty(splits, b, 1, hkv * group, d, dtype=torch.float32, device="cuda")
    lse_partial = torch.empty(splits, b, hkv * group, 1, dtype=torch.float32, device="cuda")
    kernel = interface.FlashAttentionDecodeSm120(cutlass.BFloat16, d, d, group, splits, tile_n=64, num_threads=128)
    compiled = cute.compile(kernel, to_cute_tensor(q), to_cute_tensor(k), to_cute_tensor(v), to_cute_tensor(out_partial, assumed_align=4),
                            to_cute_tensor(lse_partial, assumed_align=4), cutlass.Float32(d ** -0.5), None, None,
                            cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
facts = read_cubin(compiled.__cubin__)
out["decode"] = {"built": interface._fa4tune_recorder.last_built, "registers": facts.registers,
                 "spill_store_bytes": facts.spill_store_bytes}
print(json.dumps(out))
