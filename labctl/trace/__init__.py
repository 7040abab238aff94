"""Analysis of what tracers leave in a step's guest directory: pure functions of files.

* :mod:`.parsers`: perf, trace-cmd, mpstat, iperf3 and wget output;
* :mod:`.stats`: network statistics snapshots, their parsers and before/after deltas;
* :mod:`.analyze`: one guest's figures for one step (:func:`~.analyze.guest_figures`);
* :mod:`.skbevents`, :mod:`.skbpath`, :mod:`.skblatency`: per-packet latency.

The guest commands that produce these files are :mod:`labctl.steps`'.
Standard library only; functions return what they could compute and say
why in warnings rather than raise on odd input. Must not import steps,
bundles, reports, backends or the CLI.

Imports never: labctl.steps, labctl.bundle, labctl.report, labctl.backends, labctl.cli, labctl.state, labctl.live, labctl.training
"""
