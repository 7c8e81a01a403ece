"""The trace replay's parts (bench/trace.py, bench/fgd_model.py): the in-memory API stand-in,
the in-process cluster and the trace's CSV reading and pod mapping. Modules, not scripts."""
