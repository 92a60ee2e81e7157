"""Running: the search itself. The settings (run_config), a run of every study (runner) or of several workers
(launch, worker), the one study loop they share (loop), what a run shows on the terminal (view), and the search
efficiency bench on a recorded table (bench)."""
