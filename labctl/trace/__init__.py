"""Tracing artifacts of a lab step: snapshot commands, parsers and per-guest figures.

* :mod:`labctl.trace.stats`: network statistics snapshot commands, their
  parsers and before/after deltas (``stats/delta.json``);
* :mod:`labctl.trace.parsers`: perf, trace-cmd, mpstat, iperf3 and wget output;
* :mod:`labctl.trace.analyze`: :func:`~labctl.trace.analyze.guest_figures`.

Only the standard library is used; nothing here raises on odd input.
"""
