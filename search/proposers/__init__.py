"""Proposers other than the Optuna sampler: they suggest whole configs, which are validated, then enqueued."""
