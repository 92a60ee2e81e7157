"""bench/dropin_gpu.py (issue 69's GPU checks): its models' rows are the window and softcap classes they claim, and a
bad step name is one line and exit 2 (the steps themselves need a GPU: docs/measurements/data/2026-12-07-gpu-issue69.sh)."""

from bench import dropin_gpu
from fa4tune.config import Problem


def test_the_models_rows_are_window_and_softcap_classes():
    names = []
    for label, batch, seqlen, heads, heads_kv, head_dim, left, softcap, source in dropin_gpu.MODELS:
        problem = Problem(batch, seqlen, seqlen, heads, heads_kv, head_dim, head_dim, True, window_size_left=left,
                          window_size_right=0 if left >= 0 else -1, softcap=softcap)
        names.append(problem.problem_class.name)
        assert "config.json" in source
    assert names == ["d128-causal-gqa4-window-bf16", "d256-causal-gqa2-window-softcap-bf16",
                     "d256-causal-gqa2-softcap-bf16", "d256-causal-gqa2-window-bf16"]


def test_a_bad_step_is_one_line_and_exit_2(capsys):
    assert dropin_gpu.main(["nope"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
