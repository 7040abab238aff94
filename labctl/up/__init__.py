"""Bringing a lab up and down: the accelerator (:mod:`.accel`), keys
(:mod:`.keys`), each guest's configuration (:mod:`.guestconf`) and kernel
command line (:mod:`.bootargs`), starting guests on a backend and waiting
for them (:mod:`.lifecycle`, :mod:`.console`), and the lab's run directory
and state (:mod:`.runstate`).

Must not import steps, bundles, reports or the CLI.
"""
