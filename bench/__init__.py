"""The tool's own benchmarks and GPU tools: scripts that print tables, run as files (`python3 bench/NAME.py`).

bench/ is a package so that its scripts and the tests import one another plainly: each script puts the repository
root on sys.path (its first lines) and imports the shared parts as `from bench.common import ...`; a test imports a
script as `from bench import NAME`. bench/common.py holds what several scripts share.
"""
