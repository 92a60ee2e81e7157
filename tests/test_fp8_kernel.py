"""The FP8 forward as a kernel class (kernels/fp8_forward_sm120.py, "sm120_fp8"; issue 45) on the CPU: its rules,
its opt-in (it runs the "fp8" classes and no other, and no other class runs those), the fallback and the call path
for fp8 classes, the host path's one-line errors, and its sm_120a facts from real compiles through the host path's
own compile and through the harness's static check (registers, the shared storage equal to its formula, S on QMMA)."""

import json
import re
import struct
from collections import Counter
from dataclasses import replace
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fa4tune import fp8
from fa4tune.config import ConfigError, ProblemClass
import experiment
from fa4tune.api import DispatchTables, attention
from fa4tune.feasibility import check_backward, check_forward
from fa4tune.kernel_class import forward_kernels
from fa4tune.targets import get_target
from kernels.fp8_forward_sm120 import Fp8ForwardSm120

ROOT = Path(__file__).resolve().parent.parent
TARGET = get_target("sm120")
D128 = ProblemClass(128, 128, True, 4, "fp8")


def test_fp8_is_opt_in_both_ways_and_has_no_backward():
    assert forward_kernels()["sm120_fp8"] is Fp8ForwardSm120 and Fp8ForwardSm120.quantizes
    config = fp8.default_config(128)
    assert check_forward(config, D128, TARGET)
    for pc in (replace(D128, dtype="bf16"), ProblemClass(64, 64, False, 1, "fp16")):
        verdict = check_forward(config, pc, TARGET)
        assert not verdict and verdict.rule == "fp8_opt_in" and "fa4tune.fp8.attention_fp8" in verdict.message
    verdict = check_forward(replace(config, kernel="sm120_tma", extra=()), D128, TARGET)
    assert not verdict and verdict.rule == "fp8_kernel" and "sm120_tma" in verdict.message
    verdict = check_backward(experiment.backward_config(D128), D128, TARGET)
    assert not verdict and verdict.rule == "fp8_forward_only"


def test_an_fp8_class_runs_fp8_entries_or_the_fp8_default_and_no_other_class_runs_them():
    bf16 = replace(D128, dtype="bf16")
    table = {bf16.name: fp8.default_config(64), "d128-causal-gqa8-fp8": replace(fp8.default_config(128), tile_m=64)}
    tables = DispatchTables(table, {})
    assert tables.resolution("fwd", D128).source == "d128-causal-gqa8-fp8"  # the nearest fp8 class, not bf16's own
    assert tables.resolution("fwd", replace(D128, qhead_per_kvhead=8, dtype="bf16")).rule == "upstream"  # no fp8 entry
    alone = DispatchTables({bf16.name: experiment.FORWARD_DISPATCH["d128-causal-gqa4-bf16"]}, {})
    found = alone.resolution("fwd", D128)
    assert (found.rule, found.config) == ("fp8", fp8.default_config(128))
    assert found.describe() == "d128-causal-gqa4-fp8 runs the FP8 default (no fp8 entry of its own or of a neighbour)"
    none = alone.resolution("bwd", D128)
    assert none.rule == "none" and "fp8_forward_only" in none.describe()


def test_the_call_path_routes_fp8_to_the_host_path_and_refuses_gradients_and_packed_batches(monkeypatch):
    calls = []
    monkeypatch.setattr(fp8, "attention_fp8", lambda q, k, v, causal, scale, config, return_lse: calls.append(config) or (q, None))
    q = torch.zeros(1, 64, 4, 128, dtype=torch.bfloat16)
    k = v = torch.zeros(1, 64, 1, 128, dtype=torch.bfloat16)
    experiment.attention(q, k, v, causal=True, fp8=True)  # the fp8 class's config: here the FP8 default
    given = replace(fp8.default_config(128), tile_m=128, num_stages=1)
    experiment.attention(q, k, v, causal=True, fwd_config=given)  # a quantizing kernel
    assert calls == [fp8.default_config(128), given] and given != fp8.default_config(128)
    with pytest.raises(ConfigError, match="fp8_forward_only"):
        experiment.attention(q.requires_grad_(), k, v, causal=True, fp8=True)
    cu = torch.tensor([0, 32, 64], dtype=torch.int32)
    with pytest.raises(ConfigError, match="fp8_varlen"):
        experiment.attention(q[0].detach(), k[0], v[0], causal=True, fp8=True, cu_seqlens_q=cu, cu_seqlens_k=cu)


@pytest.mark.parametrize("change, rule", [
    ({"Q_in_regs": True}, "fp8_no_Q_in_regs"),
    ({"num_stages": 3}, "num_stages_domain"),
    ({"tile_m": 256, "tile_n": 128, "num_stages": 2, "num_threads": 256}, "smem_capacity"),
])
def test_the_opted_in_rules_name_what_fails(change, rule):
    verdict = check_forward(replace(fp8.default_config(128), **change), D128, TARGET)
    assert not verdict and verdict.rule == rule, verdict


def test_the_head_dim_must_be_a_multiple_of_32():
    verdict = check_forward(fp8.default_config(80), ProblemClass(80, 80, False, dtype="fp8"), TARGET)
    assert not verdict and verdict.rule == "fp8_head_dim_multiple_of_32" and "80" in verdict.message


def test_the_host_path_refuses_bad_calls_with_one_error_before_any_compile():
    q, k, v = (torch.zeros(1, 64, 4, 128, dtype=torch.bfloat16) for _ in range(3))
    with pytest.raises(ConfigError, match="fp8_inputs_bf16.*float16"):
        fp8.attention_fp8(q.half(), k.half(), v.half())
    with pytest.raises(ConfigError, match="fp8_heads"):
        fp8.attention_fp8(q, k[:, :, :3], v[:, :, :3])
    with pytest.raises(ConfigError, match="fp8_shapes"):
        fp8.attention_fp8(q[0], k[0], v[0])
    with pytest.raises(ConfigError, match="fp8_no_Q_in_regs"):
        fp8.attention_fp8(q, k, v, config=replace(fp8.default_config(128), Q_in_regs=True))


def test_the_host_path_takes_the_config_s_class_from_the_registry_and_refuses_one_that_does_not_quantize():
    # fa4tune/ names no kernels/ module (the registry finds the class: no import cycle through the package)
    t = torch.zeros(1, 64, 4, 128)
    with pytest.raises(ConfigError, match="^fp8_kernel: .*'sm120' does not"):
        fp8.compile_fp8(replace(fp8.default_config(128), kernel="sm120"), t, t, t, t, t, t, t, True, 0.1)


def test_sm120a_facts_through_the_host_path_s_compile(tmp_path):
    """The d128 and d96 tiles the H100 run gated (128 x 64; causal with GQA 4 among them), and d64 at 128 x 64 with two
    stages. At tile_m 128 the d128 / d96 kernels spill as upstream's bf16 kernel does at the same tiles (255 registers;
    docs/measurements/data/2026-12-06-fp8/table.txt); at d64 they do not."""
    cases = [[128, 128, 64, 1, True, 4], [96, 128, 64, 1, False, 1], [64, 128, 64, 2, True, 1],
             [128, 64, 64, 2, True, 4, True], [96, 64, 96, 1, False, 1, True]]  # the last two: P V on e4m3 (pv_fp8)
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "fp8_probe.py"), str(tmp_path)], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["case"] for r in report] == cases
    for r in report:
        assert r["smem_traced"] == r["smem_formula"] <= TARGET.smem_per_block, r
        assert r["registers"] <= 255, r
        assert r["mma"].get("QMMA.16832", 0) > 0, r  # S on e4m3
        assert (r["mma"].get("HMMA.16816", 0) > 0) == (len(r["case"]) == 6), r  # P V on bf16, or on e4m3 with pv_fp8
    assert all(r["spill_bytes"] == 0 for r in report[2:]), report[2:]


@pytest.mark.compile
def test_the_static_check_compiles_an_fp8_class_through_the_call_path(tmp_path):
    """`experiment.py --static` on an fp8 suite: the harness's fake-tensor compile goes through fa4tune.api's routing to
    the FP8 host path, and reads the compiled struct against the class's formula (smem_understated otherwise)."""
    suite = tmp_path / "fp8.json"
    suite.write_text(json.dumps({"description": "one fp8 class", "problems": [
        {"name": "d64 causal fp8", "batch": 1, "seqlen_q": 1024, "seqlen_k": 1024, "num_heads": 4, "num_heads_kv": 4,
         "head_dim": 64, "head_dim_v": 64, "causal": True, "dtype": "fp8", "backward": False}]}))
    done = subprocess.run([sys.executable, "experiment.py", "--static", "--no-cache", "--jobs", "1", "--suite", str(suite)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "static_configs_ok: 1/1" in done.stdout
    row = next(line for line in done.stdout.splitlines() if "d64-causal-fp8" in line)
    default = fp8.default_config(64)  # 64 x 64 in two stages
    smem, _ = Fp8ForwardSm120.smem_bytes(default, ProblemClass(64, 64, True, 1, "fp8"))
    assert "│ ok" in row and f"tile_m={default.tile_m} tile_n={default.tile_n}" in row and f" {smem} " in row, row


def test_fa4tune_api_routes_a_quantizing_config_without_experiment_py_s_kernel_class(monkeypatch):
    calls = []
    monkeypatch.setattr(fp8, "attention_fp8", lambda q, k, v, causal, scale, config, return_lse: calls.append(config) or (q, None))
    q = k = v = torch.zeros(1, 64, 2, 64, dtype=torch.bfloat16)
    attention(q, k, v, True, fwd_config=fp8.default_config(64), tables=DispatchTables({}, {}))  # no kernel_class given
    assert calls == [fp8.default_config(64)]


def test_fp8_pv_keys_follow_the_registers_the_s_mma_leaves():
    """pv_fp8 multiplies P's e4m3 registers, as the S MMA's C fragments leave them, as m16n8k32's A fragment; V^T's
    keys follow fa4tune.fp8.pv_key_order. Emulated from PTX's fragment definitions (C of m16n8k16/k32: lane 4 g + t
    holds rows g and g + 8, columns 2 t and 2 t + 1 of each n8 tile; e4m3 A: a[i + 4 r + 8 h] is row g + 8 r, k
    16 h + 4 t + i) through the kernel's register map (pv_frgA_layout: A's value (c, j mod 2, r, h) is C's c + 2 r
    of tile 2 h + j mod 2) and the host's V^T (B[k, n] = V^T[n, k]): the MMA's A @ B is P V.

    This checks the map the kernel means, derived here again as pv_frgA_layout encodes it; not what the compiled
    kernel does with it: the first version viewed the e4m3 C-order registers through this layout and cute.gemm packed
    A's registers from their storage order instead (the GPU's rel L2 ~1). test_fp8_pv_ptx_pairs_each_p_with_its_v_key
    runs the PTX."""
    order = fp8.pv_key_order()
    assert sorted(order) == list(range(32))
    torch.manual_seed(0)
    p, v = torch.randn(16, 32, dtype=torch.float64), torch.randn(32, 8, dtype=torch.float64)  # one 32-key block, one n8
    vt = v.T[:, order]  # the host's V^T: position k holds key order[k]
    a = torch.full((16, 32), float("nan"), dtype=torch.float64)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        c_regs = [[p[g + 8 * r, 8 * j + 2 * t + c] for r in (0, 1) for c in (0, 1)] for j in range(4)]  # [tile][c + 2 r]
        regs = [c_regs[2 * h + jm][c + 2 * r] for h in (0, 1) for r in (0, 1) for jm in (0, 1) for c in (0, 1)]
        for h in (0, 1):
            for r in (0, 1):
                for i in range(4):
                    a[g + 8 * r, 16 * h + 4 * t + i] = regs[i + 4 * r + 8 * h]
    assert not a.isnan().any()  # every A element is some lane's register
    assert torch.allclose(a @ vt.T, p @ v)
    # the kernel's layout is that map: A's value (c, j mod 2, r, h) of k-block kb at C's compact register (value
    # c + 2 r, then m, then n8 tile 4 kb + 2 h + j mod 2), here for MMA_M 2 and two k-blocks
    import cutlass.cute as cute

    from kernels.fp8_forward_sm120 import pv_frgA_layout

    got, mma_m = [], 2
    cute.jit(lambda: got.extend(pv_frgA_layout(SimpleNamespace(shape=((2, 2), mma_m, 8)))((v, m, kb))
                                for kb in range(2) for m in range(mma_m) for v in range(16)))()
    want = [(c + 2 * r) + 4 * m + 4 * mma_m * (4 * kb + 2 * h + jm)
            for kb in range(2) for m in range(mma_m) for h in (0, 1) for r in (0, 1) for jm in (0, 1) for c in (0, 1)]
    assert got == want


def test_quantize_v_pads_whole_tiles_orders_the_keys_and_dequantizes_within_e4m3():
    torch.manual_seed(0)
    v = (torch.randn(2, 100, 3, 64) * torch.linspace(0.1, 8, 64)).bfloat16()  # channels of different scales
    vt, scale = fp8.quantize_v(v, 64)
    assert vt.dtype == torch.float8_e4m3fn and vt.shape == (2, 3, 64, 128) and scale.shape == (2, 3, 64)
    keys = fp8.vt_keys(128)  # the key at each position
    assert sorted(keys.tolist()) == list(range(128))
    assert (vt[..., keys >= 100].float() == 0).all() and (vt[..., keys < 100].float() != 0).any(dim=-1).all()
    back = fp8.dequantize_v(vt, scale, 100)
    assert back.shape == v.shape and torch.allclose(back, v.float(), rtol=2 ** -3, atol=scale.max().item() * 2 ** -9)
    assert (vt.float().abs().amax(dim=-1) == 448).all()  # each channel's largest value meets e4m3's


@pytest.mark.parametrize("tile_n, head_dim_v, rule", [(48, 64, "fp8_pv_multiple_of_32"), (96, 96, "fp8_pv_copy")])
def test_fp8_pv_rules_name_what_fails(tile_n, head_dim_v, rule):
    config = replace(fp8.default_config(head_dim_v), tile_n=tile_n, num_stages=1, extra={"pv_fp8": True})
    verdict = check_forward(config, ProblemClass(head_dim_v, head_dim_v, False, 1, "fp8"), TARGET)
    assert not verdict and verdict.rule == rule, verdict
    assert check_forward(replace(config, tile_n=64), ProblemClass(head_dim_v, head_dim_v, False, 1, "fp8"), TARGET)


# -- pv_fp8 in the PTX: the one-warp P V of tests/fp8_probe.py --pv-ptx, run lane by lane on labels --------------------

_GLOBAL = 1 << 40  # kernel parameter i's global buffer starts at (i + 1) << 40 here; shared memory at 0


def _operands(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch in "{[") - (ch in "}]")
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + [cur.strip()] if cur.strip() else out


def _regs(text: str) -> list[str]:
    return [r.strip() for r in text.strip("{}").split(",")]


def run_pv_ptx(ptx: str, keys: int, dim: int) -> dict:
    """O as the PTX of tests/fp8_probe.py --pv-ptx computes it, on labels: S's fp32 (row, key) elements, V^T's e4m3
    (dim, position) bytes. Lane by lane in lockstep (the kernel is straight-line): integer arithmetic on the lane's
    registers and %tid.x; cp.async of 16 bytes; mul.f32x2 scales the labels; cvt.rn.satfinite.e4m3x2.f32 d, a, b puts
    b in d's low byte (PTX); mov.b32 / mov.b64 {lo, hi} pack and unpack; ldmatrix.x4 gives lane l of matrix q the 4
    bytes at column 4 (l % 4) of the row whose address lane 8 q + l / 4 holds; mma.sync m16n8k32 by PTX's fragments:
    a[x] byte i is A (row g + 8 (x % 2), k 16 (x / 2) + 4 t + i), b[y] byte i is B (k 16 y + 4 t + i, column g), c/d[z]
    is (row g + 8 (z / 2), column 2 t + z % 2), lane 4 g + t. Returns {(row, dim): Counter of the products
    (P's row, P's key, its factor, V^T's dim, V^T's position)} as the stores write O (fp32, rows x dim, row-major).
    An instruction it does not know fails the test (a new code shape to look at, not a pass)."""
    body = re.sub(r"//[^\n]*", "", ptx[ptx.index("{", ptx.index(".entry")) + 1: ptx.rindex("}")])
    lanes = [dict() for _ in range(32)]
    shared, stores = {}, {}

    def val(lane, op):
        if op == "%tid.x":
            return lane
        if op.startswith("%"):
            return lanes[lane][op]
        if op.startswith("0f"):
            return ("const", struct.unpack(">f", bytes.fromhex(op[2:]))[0])
        return 0 if op.startswith("__dynamic_shmem__") else int(op, 0)

    def address(lane, op):
        m = re.fullmatch(r"\[(%\w+)(?:\+(-?\d+))?\]", op.replace(" ", ""))
        return val(lane, m[1]) + int(m[2] or 0)

    def load(at, nbytes):
        buffer, offset = divmod(at, _GLOBAL)
        if buffer == 1:  # S: fp32 (rows, keys)
            assert offset % 4 == 0 and nbytes % 4 == 0
            return [("f32", divmod(offset // 4 + j, keys), 1.0) for j in range(nbytes // 4)]
        assert buffer == 2, f"load from kernel parameter {buffer - 1}"  # V^T: e4m3 (dim, keys)
        return [("v",) + divmod(offset + j, keys) for j in range(nbytes)]

    for ins in (" ".join(i.split()) for i in body.split(";")):
        if not ins or ins.startswith("."):
            continue
        op, _, rest = ins.partition(" ")
        ops = _operands(rest)
        if op in ("cp.async.commit_group", "cp.async.wait_group", "bar.sync", "ret"):
            continue
        if op.startswith("ld.param"):
            index = int(re.search(r"_param_(\d+)\]", ops[1])[1])
            for regs in lanes:
                regs[ops[0]] = (index + 1) * _GLOBAL
        elif op == "shfl.sync.idx.b32":
            got = val(int(ops[2]), ops[1])
            for regs in lanes:
                regs[ops[0]] = got
        elif op == "cp.async.cg.shared.global":
            assert ops[2] == "16", ins
            for lane in range(32):
                dst = address(lane, ops[0])
                for j, byte in enumerate(load(address(lane, ops[1]), 16)):
                    shared[dst + j] = byte
        elif op == "ldmatrix.sync.aligned.m8n8.x4.shared.b16":
            rows_at = [address(lane, ops[1]) for lane in range(32)]
            for lane, regs in enumerate(lanes):
                for q, reg in enumerate(_regs(ops[0])):
                    regs[reg] = [shared[rows_at[8 * q + lane // 4] + 4 * (lane % 4) + j] for j in range(4)]
        elif op == "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32":
            d, a, b, c = (_regs(o) for o in ops)
            A, B, C = {}, {}, {}
            for lane, regs in enumerate(lanes):
                g, t = divmod(lane, 4)
                for x, reg in enumerate(a):
                    for i, byte in enumerate(regs[reg]):
                        A[g + 8 * (x % 2), 16 * (x // 2) + 4 * t + i] = byte
                for y, reg in enumerate(b):
                    for i, byte in enumerate(regs[reg]):
                        B[16 * y + 4 * t + i, g] = byte
                for z, reg in enumerate(c):
                    C[g + 8 * (z // 2), 2 * t + z % 2] = Counter() if regs[reg] == ("const", 0.0) else regs[reg]
            for lane, regs in enumerate(lanes):
                g, t = divmod(lane, 4)
                for z, reg in enumerate(d):
                    m, n = g + 8 * (z // 2), 2 * t + z % 2
                    acc = Counter(C[m, n])
                    for k in range(32):
                        assert A[m, k][0] == "p" and B[k, n][0] == "v", (A[m, k], B[k, n])
                        acc[A[m, k][1:] + B[k, n][1:]] += 1
                    regs[reg] = acc
        elif op == "st.global.v2.b32":
            for lane, regs in enumerate(lanes):
                buffer, offset = divmod(address(lane, ops[0]), _GLOBAL)
                assert buffer == 3, ins
                for j, reg in enumerate(_regs(ops[1])):
                    stores[divmod(offset // 4 + j, dim)] = regs[reg]
        elif op.startswith("ld.global."):  # .b32, .b64, .v2.b32, .v4.b32: S's fp32 one label, V^T's bytes a list
            dsts = _regs(ops[0])
            vector = int(op.split(".")[2][1:]) if op.split(".")[2].startswith("v") else 1
            for lane, regs in enumerate(lanes):
                loaded = load(address(lane, ops[1]), vector * int(op.split(".")[-1][1:]) // 8)
                step = len(loaded) // len(dsts)
                for j, reg in enumerate(dsts):
                    part = loaded[j * step:(j + 1) * step]
                    regs[reg] = part[0] if part == [part[0]] and part[0][0] == "f32" else part
        elif op.startswith("mov.b") and ops[0].startswith("{"):  # unpack
            dsts = _regs(ops[0])
            for regs in lanes:
                src = list(regs[ops[1]])
                step = len(src) // len(dsts)
                for j, reg in enumerate(dsts):
                    regs[reg] = src[j] if step == 1 else src[j * step:(j + 1) * step]
        else:
            for lane, regs in enumerate(lanes):
                regs[ops[0]] = _alu(op, ops, regs, [val(lane, o) if o[0] not in "{[" else None for o in ops[1:]])
    return stores


def _alu(op: str, ops: list[str], regs: dict, args: list):
    if op.startswith("mov.b") and ops[1].startswith("{"):  # pack: bytes concatenate, 32-bit values pair up
        parts = [regs[r] for r in _regs(ops[1])]
        return [x for p in parts for x in p] if all(isinstance(p, list) for p in parts) else tuple(parts)
    if op in ("mov.u32", "mov.b32", "cvt.u64.u32"):
        return args[0]
    if op == "mul.f32x2":
        (x, y), (cx, cy) = args
        assert cx[0] == cy[0] == "const", args
        return (x[:2] + (x[2] * cx[1],), y[:2] + (y[2] * cy[1],))
    if op == "cvt.rn.satfinite.e4m3x2.f32":
        hi, lo = args
        return [("p",) + lo[1] + (lo[2],), ("p",) + hi[1] + (hi[2],)]
    if op == "setp.eq.b32":
        return args[0] == args[1]
    if op == "selp.b32":
        return args[0] if args[2] else args[1]
    if op == "mad.lo.s32":
        return (args[0] * args[1] + args[2]) & 0xFFFFFFFF
    arith = {"shr": lambda a, b: a >> b, "shl": lambda a, b: a << b, "and": lambda a, b: a & b,
             "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b, "add": lambda a, b: a + b, "sub": lambda a, b: a - b,
             "mul": lambda a, b: a * b}
    name = op.split(".")[0]
    if name in arith and op in (f"{name}.{t}" for t in ("b32", "u32", "s32", "s64", "lo.s32", "lo.u32", "wide.u32")):
        result = arith[name](*args)
        return result if op.endswith(("64", "wide.u32")) else result & 0xFFFFFFFF
    raise AssertionError(f"PTX instruction not emulated: {op} {ops}")


PV_PTX_CASES = [[16, 64, 16], [32, 64, 16], [64, 64, 16], [16, 128, 32], [16, 96, 32],
                [16, 64, 16, True], [32, 64, 16, True]]  # [rows, keys, dim(, the first version's P: must fail)]


def test_fp8_pv_ptx_pairs_each_p_with_its_v_key(tmp_path):
    """pv_fp8 end to end in the compiled code (CPU, sm_120a PTX): a one-warp kernel of the kernel's own P V pieces
    (pv_p_fragment, fp8_tiled_mma, vt_gmem_tiled_copy / vt_smem_layout, fp8_ldmatrix_atom, sm80_utils.gemm_rs) run
    lane by lane on labels (run_pv_ptx) writes O[row, dim] = sum over the tile's keys c of P[row, c] x 448 x V^T[dim,
    position of c in fa4tune.fp8.vt_keys]: every key once, nothing from another row. 1, 2 and 4 m16 tiles (MMA_M), 2
    to 4 k-blocks, 64-, 128- and 32-byte V^T rows (the three swizzles). The negative control is the first version
    (P's e4m3 registers in the C fragment's order seen through pv_frgA_layout): cute.gemm packs A's registers from
    their storage, so a0 held row g + 8's weights too and every output is wrong (on an H100: rel L2 ~1, cosine ~0.6)."""
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "fp8_probe.py"), str(tmp_path), "--pv-ptx"],
                          input=json.dumps(PV_PTX_CASES), capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    ptxs = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(ptxs) == len(PV_PTX_CASES)
    for (rows, keys, dim, *first_version), ptx in zip(PV_PTX_CASES, ptxs):
        mmas = ptx.count("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32")
        assert mmas == (rows // 16) * (keys // 32) * (dim // 8), mmas
        stores = run_pv_ptx(ptx, keys, dim)
        assert len(stores) == rows * dim
        position = {key: p for p, key in enumerate(fp8.vt_keys(keys).tolist())}
        wrong = [(r, d) for r in range(rows) for d in range(dim)
                 if stores[r, d] != Counter({(r, c, fp8.FP8_MAX, d, position[c]): 1 for c in range(keys)})]
        if first_version:
            assert len(wrong) == rows * dim, (rows, keys, dim, len(wrong))
        else:
            assert not wrong, (rows, keys, dim, wrong[:3], sorted(stores[wrong[0]].items())[:8])
