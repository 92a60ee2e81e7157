"""Our kernel classes, one per file. Each declares a `name` by which fa4tune.kernel_class finds it (and
experiment.py's own): the forward ones, and backward_sm120.BackwardSm120 ("sm120": upstream's SM120 backward, packed
GQA gradients fixed), the base of every backward class. A coding agent reads them and subclasses them in
experiment.py; it does not edit them."""
