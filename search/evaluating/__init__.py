"""Evaluating: a feasible config in, a Measurement out. The interface and the factory (protocol), the replay of a
recorded table (replay, table), the GPU harness one config at a time (gpu) or compiling ahead in CPU processes
(gpu_pipeline on pipeline, compile_stage and precompile), and giving up on hopeless configs early (pruning)."""
