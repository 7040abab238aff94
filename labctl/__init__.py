"""labctl: reproducible kernel-network debugging labs on QEMU guests.

The pipeline, one package per stage, each importing the others through their faces (their
``__init__``'s ``__all__``): lab files (:mod:`labctl.lab`), guest images (:mod:`labctl.image`),
guest kernels (:mod:`labctl.kernel`), backends (:mod:`labctl.backends`), networks
(:mod:`labctl.net`), bringing a lab up and down (:mod:`labctl.up`), a lab's state on disk
(:mod:`labctl.state`), a running lab's links and captures (:mod:`labctl.live`),
a guest's execution recorded and replayed (:mod:`labctl.replay`), graded checks
(:mod:`labctl.grading`), courses (:mod:`labctl.training`), steps (:mod:`labctl.steps`), the
analysis of their files (:mod:`labctl.trace`), the bundle (:mod:`labctl.bundle`), the report
(:mod:`labctl.report`), kernel debugging (:mod:`labctl.debug`), a guest's kernel seen with drgn
(:mod:`labctl.inspect`), packets followed through a lab that is up (:mod:`labctl.follow`), bisecting
a kernel (:mod:`labctl.bisect`), a lab packed with its kernels and image into one file
(:mod:`labctl.pack`), the browser (:mod:`labctl.web`) and the command line (:mod:`labctl.cli`).
:mod:`labctl.pipeline` chains the stages. Beside them: every exception (:mod:`labctl.errors`),
the one way to run a host process (:mod:`labctl.proc`), SSH (:mod:`labctl.ssh`; where a guest's
sshd is and the OpenSSH command lines to it, :mod:`labctl.endpoint`; the kept connection of
``exec`` and ``cp``, :mod:`labctl.mux`, spoken to by ``exec`` itself: :mod:`labctl.muxclient`), leaves the quick commands read a lab's state with (a
started guest's record, :mod:`labctl.guestrecord`; a lab's name, :mod:`labctl.names`; a crash on a
console, :mod:`labctl.crashcheck`), how the
library reports progress (:mod:`labctl.events`), paths and safe files (:mod:`labctl.paths`),
guest text shown safely (:mod:`labctl.textsafe`), the pcap-filter subset packets are followed by
(:mod:`labctl.pktfilter`), package faces that load each name at its first use
(:mod:`labctl.lazyface`).
"""

__version__ = "0.1.0"
