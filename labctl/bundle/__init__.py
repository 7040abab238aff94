"""The report bundle of a run: where each file goes, writing it, its summary, reading it back, packing it.

Owns: the bundle's file names (:mod:`.layout`), its directory and manifest
(:mod:`.write`), summary.json (:mod:`.summary`, one computation for ``run``
and ``report``), reading its figures (:mod:`.figures`, :mod:`.read`) and the
archive (:mod:`.archive`). Must not import the report, the CLI, the steps
runner or any backend but through the lab state it is handed.

Imports never: labctl.report, labctl.cli, labctl.steps, labctl.backends.qemu, labctl.backends.libvirt
"""
