"""search/: tunes the SM120 configs per problem class with Optuna studies and a Claude proposer.

    uv run python -m search run      # sampler and proposer take turns; resumable; results in the storage
    uv run python -m search report   # best per study, credit per proposer
    uv run python -m search apply    # confirmed winners -> experiment.py's dispatch tables
    uv run python -m search bench    # search efficiency on a recorded table (CPU only)

Its packages follow the data flow: proposing (samplers, Claude) -> evaluating (replay, GPU) -> storing (the Optuna
storage and its schema), driven by running (the loop, workers) and read back by reviewing (report, notes, plots,
export, apply). space.py and optional.py are what every stage shares.
"""
