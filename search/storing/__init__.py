"""Storing: the Optuna storage and what it holds. The storage by URL (storage), the name of every attribute a
study or trial carries (schema), one study per direction and problem class (study), the trials read back as records
(history), several workers on one study (claims, heartbeat), and the results.tsv row of each trial (results_log)."""
