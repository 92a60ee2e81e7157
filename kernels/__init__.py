"""Our kernel classes, one per file. The forward ones declare a `name` by which fa4tune.kernel_class finds them (and
experiment.py's own); backward_sm120.BackwardSm120 is the base of experiment.py's backward class (upstream's SM120
backward, packed GQA gradients fixed). A coding agent reads them and subclasses them in experiment.py; it does not
edit them."""
