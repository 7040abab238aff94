"""The libvirt backend: transient domains on any libvirt URI, on this machine or remote ``qemu+ssh://`` hosts.

:mod:`.domains` (the Backend), :mod:`.starter` (a guest started: volumes,
directory, domain, console relay), :mod:`.host_checks` (what a host needs,
``labctl doctor``, and its free memory), :mod:`.api` (connections and the mapping of
libvirt's errors, hosts' facts, commands on hosts), :mod:`.binding` (the
Python binding, imported on first use), :mod:`.xml` (domain XML, pure
functions), :mod:`.storage` (the ``labctl`` pool: images, overlays, fw_cfg
volumes), :mod:`.host` (QEMU's user and directories on a host),
:mod:`.relay` (the console relay process), :mod:`.saved` (a guest's states
saved and restored by libvirt, for reset, checkpoints and a class's shared
post-boot state), :mod:`.saveimage` (libvirt's save-file header, rewritten so
that one instance's state starts another's domain).
"""

__all__: list[str] = []  # no face: other packages reach this backend through labctl.backends.get_backend
