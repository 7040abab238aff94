"""Bringing a lab up and down: the accelerator (:mod:`.accel`), keys
(:mod:`.keys`), each guest's configuration (:mod:`.guestconf`) and kernel
command line (:mod:`.bootargs`), starting guests on a backend and waiting
for them (:mod:`.lifecycle`, :mod:`.console`), tap networks (:mod:`.taps`),
and the lab's run directory and state (:mod:`.runstate`); then, on a lab that
is up, its links: impairments and link state (:mod:`.netctl`, recorded in
:mod:`.netstate`) and packet captures (:mod:`.capture`).

Must not import steps, bundles, reports or the CLI.

Imports never: labctl.steps, labctl.bundle, labctl.report, labctl.cli
"""
