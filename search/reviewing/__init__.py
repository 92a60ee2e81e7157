"""Reviewing: what the studies found, read back from the storage. The report, the evidence every view reads
(evidence), the optuna-dashboard notes and server (notes, dashboard), the figures (plots), the hand-off to
experiment.py (apply) and to upstream (export), and their command line (cli). Nothing here imports search.running."""
