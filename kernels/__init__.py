"""Our forward kernel classes, one per file; fa4tune.kernel_class finds them (and experiment.py's own) by the `name`
each declares. A coding agent reads them and subclasses them in experiment.py; it does not edit them."""
