"""Looking inside a guest's kernel with drgn: live, while the guest runs, and in vmcores.

Owns: a running guest's physical memory read from its QEMU process (:mod:`.memory`:
the RAM layout from the monitor, ``/proc/PID/mem``), the kernel's VMCOREINFO note
(:mod:`.vmcoreinfo`), which guest can be read where (:mod:`.guest_target`), the debug files
of a guest's kernel and modules as :mod:`labctl.kernel` prepared them
(:mod:`.debuginfo`), drgn programs with that debug info (:mod:`.program`), drgn on a
live guest or a vmcore (:mod:`.attach`), running drgn code and pausing the guest
around it (:mod:`.drgn_session`), vmcores on demand (:mod:`.dump`; QEMU's kdump stream
made readable by drgn and crash in :mod:`.kdump`), drgn's summary of a vmcore
for reports (:mod:`.summary`), a drgn check's expression evaluated on a kernel
(:mod:`.evaluate`), and a vmcore of every crash while labctl watches a lab
(:mod:`.crashwatch`: the consoles read, a panicked guest paused by QEMU dumped before it goes).

drgn is imported only inside functions (a missing drgn is a :class:`HostError`
when used, nothing else needs it). Reads what a lab's state records through a
protocol (:class:`labctl.backends.LabState`), never the state, up or steps stages, so
that ``up``, steps and bisect can take a vmcore and summarise it on a crash::

    from labctl.inspect import take_guest_vmcore, vmcore_summary, format_summary
    core = take_guest_vmcore(state, "b", bundle / "b.vmcore")
    print(format_summary(vmcore_summary(core.path, nics=["eth1"])))

Imports never: labctl.cli, labctl.steps, labctl.bundle, labctl.report, labctl.up, labctl.state, labctl.live, labctl.training, labctl.pipeline, labctl.bisect, labctl.web
"""

from __future__ import annotations

from labctl.inspect.attach import KernelView, open_core, open_live
from labctl.inspect.crashwatch import CrashWatch, VmcoreRecord, capture_crash
from labctl.inspect.drgn_session import Outcome, Pause, interactive, paused, run_code, run_script
from labctl.inspect.dump import FORMATS, Vmcore, take_guest_vmcore, take_vmcore
from labctl.inspect.evaluate import ExprError, evaluate, left_side
from labctl.inspect.summary import format_summary, summarize, vmcore_summary

__all__ = [
    "FORMATS",
    "CrashWatch",
    "ExprError",
    "KernelView",
    "Outcome",
    "Pause",
    "Vmcore",
    "VmcoreRecord",
    "capture_crash",
    "evaluate",
    "format_summary",
    "interactive",
    "left_side",
    "open_core",
    "open_live",
    "paused",
    "run_code",
    "run_script",
    "summarize",
    "take_guest_vmcore",
    "take_vmcore",
    "vmcore_summary",
]
