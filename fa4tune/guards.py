"""`python -m fa4tune.guards`: the guardrails' command line. It checks experiment.py against the static rules and
the harness files against their pinned hashes, in a second, without a GPU or torch; `--pin` records the hashes.
The rules and the pin are fa4tune.harness.guards (pinned with the rest of the harness)."""

if __name__ == "__main__":
    import sys

    from fa4tune.harness.guards import main

    sys.exit(main())
