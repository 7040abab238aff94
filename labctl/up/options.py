"""What ``labctl up`` (and ``run``, ``class up``, bisect) may be asked: :class:`UpOptions`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from labctl.state import LabState

DEFAULT_BOOT_TIMEOUT = 180.0


@dataclass
class UpOptions:
    accel: str = "auto"
    backend: str | None = None
    boot_timeout: float = DEFAULT_BOOT_TIMEOUT
    extra_kernel_args: tuple[str, ...] = ()
    no_verify_host_keys: bool = False  # --no-verify-host-keys: remote hosts' SSH keys are not checked
    unencrypted_links: bool = False  # --unencrypted-links: UDP tunnels across hosts are accepted
    cold: bool = False  # --cold: boot every guest, even where a post-boot snapshot exists
    prewarm: bool = False  # each guest's kept connection (labctl.mux) made in the background once it is ready
    snapshots: bool = True  # take post-boot snapshots of cold-booted guests (backends that keep them)
    saved_states: bool = False  # save each guest once up, for reset (class up; backends that save on hosts)
    # class up on a backend that saves states on its hosts: one post-boot state per host and guest,
    # saved with throwaway keys, that the next instances start from (``templates``: (guest, host
    # name) -> the backend's template, labctl.backends.Backend.template_of)
    shared_states: bool = False
    templates: dict[tuple[str, str], Any] = field(default_factory=dict)
    # a guest whose kernel panics or oopses while booting: told before up stops anything (its QEMU
    # paused on the panic, its memory still there), with the lab's state and the guest's name; what
    # it returns ends the error's message (labctl.pipeline.run_lab takes a vmcore into the bundle)
    on_boot_crash: Callable[[LabState, str], str] | None = None
