"""Sliding window and soft-cap as problem-class dimensions (issue 69): names round-trip, a problem's window and
softcap give its class, only a kernel class that declares the feature serves such a class, and the fallback rule
never hands a window or softcap class an entry of a class without it."""

from __future__ import annotations

import pytest

import experiment
from fa4tune import api, fallback
from fa4tune.config import ConfigError, ForwardConfig, Problem, ProblemClass, is_local
from fa4tune.feasibility import check_backward, check_forward_entry
from fa4tune.targets import get_target


@pytest.mark.parametrize("name", ["d128-causal-gqa4-window-bf16", "d256-causal-gqa2-window-softcap-bf16",
                                  "d128-causal-gqa4-window-decode-bf16", "d64-noncausal-softcap-fp16"])
def test_a_window_or_softcap_class_name_round_trips(name):
    assert ProblemClass.parse(name).name == name


def test_a_plain_class_keeps_its_name():
    assert ProblemClass(128, 128, True, 4).name == "d128-causal-gqa4-bf16"


@pytest.mark.parametrize("causal, left, right, local", [
    (True, -1, -1, False), (True, -1, 0, False), (True, 4096, 0, True), (True, 4096, -1, True),
    (False, -1, -1, False), (False, 128, 128, True), (False, -1, 0, True), (True, None, None, False)])
def test_local_is_upstream_s_rule(causal, left, right, local):
    assert is_local(causal, left, right) is local


def test_a_problem_s_window_and_softcap_give_its_class():
    gemma2 = Problem(1, 8192, 8192, 16, 8, 256, 256, True, window_size_left=4096, window_size_right=0, softcap=50.0)
    assert gemma2.problem_class.name == "d256-causal-gqa2-window-softcap-bf16"
    assert "window (4096, 0) softcap 50" in gemma2.label
    with pytest.raises(ConfigError, match="window_size"):
        Problem(1, 128, 128, 4, 4, 64, 64, True, window_size_left=-2)


def test_only_a_class_that_declares_the_feature_serves_a_window_or_softcap_class():
    """The split-KV class runs windows and soft-caps (since 2026-12-07 s15: Gemma 2's decodes); the FP8 forward runs
    neither, and the coordinate-mask backward no soft-cap."""
    split = ForwardConfig(tile_m=64, tile_n=64, num_threads=128, kernel="sm120_splitkv", extra={"num_splits": 0})
    for pc in (ProblemClass(64, 64, True, window=True, regime="decode"), ProblemClass(64, 64, True, softcap=True, regime="decode"),
               ProblemClass(128, 128, True, 2, window=True, softcap=True, regime="decode")):
        assert check_forward_entry(split, pc, get_target()), pc.name
    fp8 = ForwardConfig(tile_m=64, tile_n=64, num_threads=128, kernel="sm120_fp8", extra={"pv_fp8": False})
    verdict = check_forward_entry(fp8, ProblemClass(128, 128, True, dtype="fp8", softcap=True), get_target())
    assert not verdict and verdict.rule == "kernel_softcap"
    softcap = ProblemClass(64, 64, True, softcap=True)
    assert check_backward(experiment.BACKWARD_DISPATCH["d64-causal-bf16"], softcap, get_target()).rule == "kernel_softcap"


@pytest.mark.parametrize("kernel", ["sm120", "sm120_tma", "sm120_tma_lpt", "sm120_tma_paired", "sm120_tma_trimmed"])
def test_the_prefill_classes_run_a_window_and_a_softcap(kernel):
    """The TMA classes bound a window's key blocks in their own mainloop (upstream's SM80 one, kernel sm120, masks
    every block down to 0) and take the soft-cap as upstream's score_mod."""
    config = ForwardConfig(tile_m=64, tile_n=64, num_threads=128, kernel=kernel)
    for pc in (ProblemClass(64, 64, True, window=True), ProblemClass(64, 64, True, softcap=True),
               ProblemClass(128, 128, True, 4, window=True, softcap=True)):
        assert check_forward_entry(config, pc, get_target()), (kernel, pc.name)


def test_the_static_shape_of_a_window_or_softcap_class_compiles_its_own_kernel():
    """Until 2026-12-07 s13 the static check and the search's compile stage compiled a window or soft-cap class
    with neither: the plain kernel's registers stood for the local one's."""
    from fa4tune.fake_compile import static_shape

    for name in ("d64-causal-gqa8-window-bf16", "d256-causal-gqa2-window-softcap-bf16", "d128-causal-softcap-bf16"):
        pc = ProblemClass.parse(name)
        shape = static_shape(pc)
        assert shape.problem_class == pc, name
        assert 0 < shape.window_size_left < shape.seqlen_k if pc.window else shape.window_size_left == -1
        assert (shape.softcap > 0) == pc.softcap


def test_the_fallback_never_crosses_a_window_or_softcap():
    pc = ProblemClass(128, 128, True, 4, window=True)
    assert all((n.window, n.softcap) == (True, False)
               for n in fallback.neighbours(pc, ["d128-causal-gqa4-bf16", "d128-causal-gqa2-window-bf16"]))
    assert experiment.TABLES.resolution("fwd", pc).rule == "own"  # Mistral's window class: its own study's entry
    # d96 causal has entries of its own and a window class of d96 has none: the windowed call runs upstream's config,
    # never the unwindowed entry (a local mask changes the work)
    d96 = ProblemClass(96, 96, True, window=True)
    assert "d96-causal-bf16" in experiment.FORWARD_DISPATCH
    found = experiment.TABLES.resolution("fwd", d96)
    assert found.rule == "upstream" and experiment.forward_config(d96).kernel == "sm120"
    assert experiment.backward_config(ProblemClass(128, 128, True, 4, softcap=True)).kernel == "sm120"


def test_attention_classes_a_windowed_call_by_its_window():
    import torch

    q = torch.zeros(1, 64, 4, 64, dtype=torch.bfloat16)
    extras = api.Extras(32, 0, 30.0)
    assert api.problem_class_of(q, q, q, True, extras=extras).name == "d64-causal-window-softcap-bf16"
    assert extras.forward_args()["window_size_left"] == 32 and extras.backward_args()["softcap"] == 30.0


def _dense(q, k, v, causal, window_size, softcap):
    """Attention written out whole (one row at a time, keys by their index), fp64."""
    import torch

    b, sq, h, d = q.shape
    sk, g = k.shape[1], h // k.shape[2]
    out = torch.zeros(b, sq, h, v.shape[-1], dtype=torch.float64)
    left, right = window_size
    for i in range(sq):
        diagonal = i + sk - sq
        keys = [j for j in range(sk) if (not causal or j <= diagonal) and (left < 0 or j >= diagonal - left)
                and (right < 0 or j <= diagonal + right)]
        if not keys:
            continue
        for head in range(h):
            s = (q[:, i, head].double()[:, None, :] * k[:, keys, head // g].double()).sum(-1) / d ** 0.5
            s = softcap * torch.tanh(s / softcap) if softcap else s
            out[:, i, head] = (torch.softmax(s, -1)[..., None] * v[:, keys, head // g].double()).sum(1)
    return out


@pytest.mark.parametrize("causal, window_size, softcap, sq, sk", [
    (True, (16, 0), 0.0, 40, 40), (True, (7, -1), 5.0, 24, 56), (False, (5, 3), 0.0, 33, 33),
    (False, (-1, -1), 2.0, 20, 20), (True, (-1, -1), 0.0, 30, 50), (False, (3, 0), 0.0, 40, 20)])
def test_the_gate_s_fp32_reference_applies_the_window_and_the_softcap(causal, window_size, softcap, sq, sk):
    import torch

    from fa4tune.harness import gate

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, h, 16, generator=g) for n, h in ((sq, 4), (sk, 2), (sk, 2)))
    ref = gate.reference_attention(q, k, v, causal, window_size=window_size, softcap=softcap, chunk_bytes=4096)
    torch.testing.assert_close(ref.out.double(), _dense(q, k, v, causal, window_size, softcap), atol=1e-5, rtol=1e-5)
    first, last = gate.key_range(torch.arange(sq), sq, sk, causal, window_size)
    assert torch.equal(ref.valid_rows[0, 0], first <= last)


@pytest.mark.compile
def test_the_window_and_softcap_tma_kernels_compile_for_sm120_like_their_plain_twins():
    """sm_120a, fake tensors: the TMA classes' window kernels (their own block bounds; with the soft-cap at d256)
    compile with no spills and the plain kernel's shared memory; Gemma 2 / 3's d256 classes, which upstream's SM120 config cannot
    run (131,072 B), run on the wide-head TMA config."""
    from fa4tune.static_check import StaticJob, run_static

    configs = {
        "d64-causal-gqa8": ForwardConfig(tile_m=128, tile_n=64, num_threads=128, num_stages=2, kernel="sm120_tma"),
        "d128-causal-gqa4": ForwardConfig(tile_m=64, tile_n=64, num_threads=128, Q_in_regs=True,
                                          kernel="sm120_tma_trimmed"),
        "d256-causal-gqa2": ForwardConfig(tile_m=64, tile_n=32, num_threads=128, kernel="sm120_tma"),
    }
    features = {"d64-causal-gqa8": ("-window",), "d128-causal-gqa4": ("-window",), "d256-causal-gqa2": ("-window-softcap",)}
    jobs = [StaticJob("fwd", config, ProblemClass.parse(f"{base}{feature}-bf16"))
            for base, config in configs.items() for feature in ("", *features[base])]  # 6 compiles: CI's minutes
    facts = run_static(jobs, get_target(), experiment.__file__, workers=1, cache_path=None)
    for plain, *featured in (facts[i:i + 2] for i in range(0, len(facts), 2)):
        assert plain.ok, (plain.problem_class, plain.reason)
        for fact in featured:
            assert fact.ok, (fact.problem_class, fact.reason)
            assert fact.spill_store_bytes == fact.spill_load_bytes == 0 and fact.registers <= 255, fact
            assert fact.dynamic_smem_bytes == plain.dynamic_smem_bytes <= get_target().smem_per_block, fact
    gemma = ProblemClass.parse("d256-causal-gqa2-window-softcap-bf16")
    assert experiment.forward_config(gemma).kernel.startswith("sm120_tma")
