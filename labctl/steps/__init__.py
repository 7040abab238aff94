"""A lab's steps on a lab that is up: workloads wrapped in tracers, gdb alongside, files copied into the bundle.

Owns: running the steps (:mod:`.runner`), the guest commands that start,
stop and post-process tracers (:mod:`.tracers`, :mod:`.skbprobes`), the
scripted gdb session of a step (:mod:`.gdbstep`), a step's impairments,
captures and link changes (:mod:`.network`) and copying a guest's files
back without trusting it (:mod:`.copyback`). The analysis of what the
tracers leave is :mod:`labctl.trace`'s; the bundle's files are
:mod:`labctl.bundle`'s. Must not import the CLI, the report or a backend
module (backends are reached through the lab state's registry).

Imports never: labctl.cli, labctl.report, labctl.backends.qemu, labctl.backends.libvirt
"""
