"""The report bundle of a run: where each file goes, writing it, reading it back, packing it.

Owns: the bundle's file names (:mod:`.layout`), its directory and manifest
(:mod:`.write`), reading it back (:mod:`.read`) and summary.json's shape
(:mod:`.figures`: accessors, number formatting, the spread of repeated runs
and the noise rule), the JUnit file of a run (:mod:`.junit`) and the archive
(:mod:`.archive`). What summary.json holds is the report sections'
(:mod:`labctl.report.summary`). Must not import the report, the CLI, the steps
runner or any backend but through the lab state it is handed.

Imports never: labctl.report, labctl.cli, labctl.steps, labctl.backends.qemu, labctl.backends.libvirt
"""
