"""suites/models.json (issue #42): real models' attention shapes, each row citing the config.json its figures come from."""

import json
import re

import pytest

from fa4tune.config import ConfigError
from fa4tune.harness.flops import problem_flops
from fa4tune.suites import CITATION_KEYS, SUITES_DIR, load_suite, problem_classes

HF = "https://huggingface.co/"
# The cited figures, stated once: model -> (its config.json, num_attention_heads, num_key_value_heads, head_dim). A row's
# name starts with its model; head_dim is the config's head_dim key, or hidden_size / num_attention_heads where it has none.
MODELS = {
    "llama3-8b": (HF + "meta-llama/Meta-Llama-3-8B/blob/main/config.json", 32, 8, 128),
    "llama3-70b": (HF + "meta-llama/Meta-Llama-3-70B/blob/main/config.json", 64, 8, 128),
    "mistral-7b": (HF + "mistralai/Mistral-7B-v0.1/blob/main/config.json", 32, 8, 128),
    "qwen2.5-7b": (HF + "Qwen/Qwen2.5-7B/blob/main/config.json", 28, 4, 128),
    "qwen2.5-14b": (HF + "Qwen/Qwen2.5-14B/blob/main/config.json", 40, 8, 128),
    "qwen2.5-32b": (HF + "Qwen/Qwen2.5-32B/blob/main/config.json", 40, 8, 128),
    "gemma2-9b": (HF + "google/gemma-2-9b/blob/main/config.json", 16, 8, 256),
    "gemma2-27b": (HF + "google/gemma-2-27b/blob/main/config.json", 32, 16, 128),
    "gemma3-27b": (HF + "google/gemma-3-27b-it/blob/main/config.json", 32, 16, 128),
    "phi3-mini": (HF + "microsoft/Phi-3-mini-4k-instruct/blob/main/config.json", 32, 32, 96),
    "phi4": (HF + "microsoft/phi-4/blob/main/config.json", 40, 10, 128),
    "flux.1-dev": (HF + "black-forest-labs/FLUX.1-dev/blob/main/transformer/config.json", 24, 24, 128),
    "wan2.1-1.3b": (HF + "Wan-AI/Wan2.1-T2V-1.3B/blob/main/config.json", 12, 12, 128),
    "wan2.1-14b": (HF + "Wan-AI/Wan2.1-T2V-14B/blob/main/config.json", 40, 40, 128),
    "sd3-medium": (HF + "stabilityai/stable-diffusion-3-medium-diffusers/blob/main/transformer/config.json", 24, 24, 64),
    "clip-vit-l/14": (HF + "openai/clip-vit-large-patch14/blob/main/config.json", 16, 16, 64),
    "clip-vit-l/14-336": (HF + "openai/clip-vit-large-patch14-336/blob/main/config.json", 16, 16, 64),
    "gpt-oss-20b": (HF + "openai/gpt-oss-20b/blob/main/config.json", 64, 8, 64),
}
LLMS = {"llama3-8b", "llama3-70b", "mistral-7b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "gemma2-9b", "gemma2-27b", "gemma3-27b",
        "phi3-mini", "phi4", "gpt-oss-20b"}
# What the suite yields, in first-seen order: a change here is a change of what a run of the suite tunes or times.
CLASSES = [
    "d128-causal-gqa4-bf16", "d128-causal-gqa4-fp16", "d128-causal-gqa4-chunked-bf16", "d128-causal-gqa4-decode-bf16",
    "d128-causal-gqa8-bf16", "d128-causal-gqa8-chunked-bf16", "d128-causal-gqa8-decode-bf16", "d128-causal-gqa8-decode-fp16",
    "d128-causal-gqa7-bf16", "d128-causal-gqa7-fp16", "d128-causal-gqa7-chunked-bf16", "d128-causal-gqa7-decode-bf16",
    "d128-causal-gqa5-bf16", "d128-causal-gqa5-fp16", "d128-causal-gqa5-chunked-bf16", "d128-causal-gqa5-decode-bf16",
    "d128-causal-gqa5-decode-fp16", "d128-causal-gqa2-bf16", "d128-causal-gqa2-decode-bf16", "d256-causal-gqa2-bf16",
    "d256-causal-gqa2-decode-bf16", "d128-causal-gqa2-chunked-bf16",
    "d96-causal-bf16", "d96-causal-fp16", "d96-causal-decode-bf16", "d128-noncausal-bf16", "d64-noncausal-fp16",
    "d64-noncausal-bf16",
    # issue 69: the models' sliding windows and soft-caps
    "d128-causal-gqa4-window-bf16", "d128-causal-gqa4-window-decode-bf16", "d128-causal-gqa2-window-softcap-bf16",
    "d128-causal-gqa2-softcap-bf16", "d128-causal-gqa2-window-bf16", "d128-causal-gqa2-window-decode-bf16",
    # 2026-12-07 s13: the TMA classes run windows and soft-caps (Gemma 2 9B at d256), and gpt-oss's 128-key window
    "d64-causal-gqa8-window-bf16", "d256-causal-gqa2-window-softcap-bf16", "d256-causal-gqa2-softcap-bf16",
    # 2026-12-07 s15: Gemma 2 27B's decodes with its soft-cap, which the split-KV class runs
    "d128-causal-gqa2-softcap-decode-bf16", "d128-causal-gqa2-window-softcap-decode-bf16", "d64-causal-gqa8-window-decode-bf16",
]
# The models' own settings (their config.json, cited in each row): sliding_window (window_size (w, 0)) and
# attn_logit_softcapping; a row of such a model without them is a global layer or a sequence the window does not reach.
WINDOWS = {"mistral-7b": 4096, "gemma2-27b": 4096, "gemma3-27b": 1024, "gemma2-9b": 4096, "gpt-oss-20b": 128}
SOFTCAPS = {"gemma2-27b": 50.0, "gemma2-9b": 50.0}


def _rows():
    """The suite file's rows as written (with their citations) and the problems the loader makes of them, in order."""
    rows = json.loads((SUITES_DIR / "models.json").read_text())["problems"]
    problems = load_suite("models")
    assert len(rows) == len(problems)
    return list(zip(rows, problems))


def _model(name):
    """The model a row's name starts with (the longest match: clip-vit-l/14-336 before clip-vit-l/14)."""
    return max((m for m in MODELS if name.startswith(m + " ")), key=len)


def test_every_row_loads_and_names_are_unique_and_readable():
    pairs = _rows()
    assert 40 <= len(pairs) <= 73
    names = [p.name for _, p in pairs]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[a-z0-9./-]+ [a-z0-9 -]+ (bf16|fp16)", n) and n.endswith(p.dtype) for n, (_, p) in zip(names, pairs))


def test_every_row_cites_its_model_s_config_json_and_matches_the_cited_figures():
    for row, p in _rows():
        url, heads, kv_heads, head_dim = MODELS[_model(p.name)]
        assert row["source"].startswith(url + ":"), (p.name, row["source"][:120])
        assert re.match(r"https://huggingface\.co/\S+/config\.json", row["source"])
        assert (p.num_heads, p.num_heads_kv, p.head_dim, p.head_dim_v) == (heads, kv_heads, head_dim, head_dim), p.name
        assert p.problem_class.qhead_per_kvhead == heads // kv_heads
    assert {_model(p.name) for _, p in _rows()} == set(MODELS)  # every model of the table has rows


def test_head_dims_masks_and_directions():
    for row, p in _rows():
        assert p.head_dim in (64, 96, 128, 256)
        assert not (p.head_dim == 256 and p.causal and p.backward), p.name  # no causal backward fits 99 KB at d256
        assert p.causal == (_model(p.name) in LLMS), p.name  # LLMs causal; DiTs and ViTs not
        assert p.backward == ("train" in p.name), p.name  # backward only on training shapes
        assert "backward" in row  # stated on every row: the loader's default is True


def test_the_suite_covers_prefill_in_both_dtypes_chunked_decode_at_batch_1_and_16_and_training():
    problems = [p for _, p in _rows()]
    regimes = {(p.problem_class.regime, p.dtype) for p in problems if not p.backward}
    assert {("prefill", "bf16"), ("prefill", "fp16"), ("chunked", "bf16"), ("decode", "bf16"), ("decode", "fp16")} <= regimes
    decodes = [p for p in problems if p.problem_class.regime == "decode"]
    assert all(p.seqlen_q == 1 and 2048 <= p.seqlen_k <= 32768 for p in decodes)  # phi3-mini's window: 2k keys
    assert any(p.batch == 1 for p in decodes) and any(p.batch >= 16 for p in decodes)
    assert any(p.problem_class.regime == "chunked" and p.seqlen_k >= 8 * p.seqlen_q for p in problems)
    assert {p.problem_class.causal for p in problems if p.backward} == {True, False}  # LLM and DiT/ViT training


def test_no_row_is_larger_than_the_standard_suite_s_largest():
    """each problem times well under a second: none does more work than the standard suite's largest"""
    largest = max(problem_flops(p, "fwd") for p in load_suite("standard"))
    for _, p in _rows():
        assert problem_flops(p, "fwd") <= largest, p.name
        assert not p.backward or problem_flops(p, "bwd") <= largest, p.name


def test_the_classes_the_suite_yields():
    assert [pc.name for pc in problem_classes(load_suite("models"))] == CLASSES


def test_the_loader_drops_a_citation_key_and_still_rejects_other_unknown_keys(tmp_path):
    row = {"name": "x", "batch": 1, "seqlen_q": 128, "seqlen_k": 128, "num_heads": 8, "num_heads_kv": 8, "head_dim": 128,
           "causal": True}
    cited, plain, bad = tmp_path / "cited.json", tmp_path / "plain.json", tmp_path / "bad.json"
    cited.write_text(json.dumps({"problems": [{**row, "source": HF + "org/model/blob/main/config.json"}]}))
    plain.write_text(json.dumps({"problems": [row]}))
    bad.write_text(json.dumps({"problems": [{**row, "sources": "typo"}]}))
    assert CITATION_KEYS == ("source",)
    assert load_suite(str(cited)) == load_suite(str(plain))
    with pytest.raises(ConfigError, match="sources"):
        load_suite(str(bad))


def test_windows_and_softcaps_are_the_models_own_settings_and_named():
    rows = _rows()
    for row, p in rows:
        model = _model(p.name)
        window, softcap = p.problem_class.window, p.problem_class.softcap
        assert window == ("window" in p.name) and softcap == ("softcap" in p.name), p.name
        if window:
            assert (p.window_size_left, p.window_size_right) == (WINDOWS[model], 0), p.name
            assert p.seqlen_k > WINDOWS[model], p.name  # the window masks some keys
            assert f"sliding_window {WINDOWS[model]}" in row["source"], p.name
        if softcap:
            assert p.softcap == SOFTCAPS[model] and f"attn_logit_softcapping {SOFTCAPS[model]}" in row["source"], p.name
        if model in SOFTCAPS and p.seqlen_q > 1 and (window or softcap):
            assert softcap, p.name  # Gemma 2 caps every layer's scores, local or global
    windowed = {_model(p.name) for _, p in rows if p.problem_class.window}
    assert windowed == set(WINDOWS)
    assert {_model(p.name) for _, p in rows if p.problem_class.softcap} == set(SOFTCAPS)
    assert any(p.backward and p.problem_class.window for _, p in rows)  # a windowed training row (Mistral)
    assert {p.problem_class.regime for _, p in rows if p.problem_class.window} == {"prefill", "decode"}
