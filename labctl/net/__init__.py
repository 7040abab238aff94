"""Lab networks: how each network is wired (:mod:`.plan`), labctl's L2 switch
(:mod:`.switch`), free ports on 127.0.0.1 (:mod:`.ports`), impairments as
netem commands (:mod:`.netem`), capture files (:mod:`.pcap`) and the guest's
virtual clock that dates them (:mod:`.vmclock`), and pictures of the
topology (:mod:`.graph`).

Pure or nearly: nothing here starts a guest or talks to QEMU. Must not
import backends, the ``up`` stage, steps or the CLI.

Imports never: labctl.backends, labctl.up, labctl.steps, labctl.cli, labctl.state, labctl.live, labctl.training
"""
