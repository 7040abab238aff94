"""The embedded backend: labctl starts ``qemu-system-x86_64`` itself (:mod:`.machines`),
from a command line built by pure functions (:mod:`.argv`, a recorded guest's and its replay's :mod:`.rrargv`; the guest's RAM as a file and its VM
generation ID in :mod:`.clone`); whether its QEMU still runs, from ``/proc``: :mod:`.liveness`; what it needs on this machine is
:mod:`.local_checks` (``labctl doctor``)."""

__all__: list[str] = []  # no face: other packages reach this backend through labctl.backends.get_backend
