"""Proposing: who suggests the next configs. The Optuna samplers (samplers), Claude (claude, with what it is shown
in prompt), a scripted proposer for tests and the bench (scripted), the interface and the checks every proposal
passes before it is enqueued (proposer), whose turn it is (turns), and who found what (credit)."""
