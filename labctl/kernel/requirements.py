"""What a lab needs from its guests' kernels: checked before any QEMU starts, and as a config fragment.

Everything here is pure (no files, no processes, no printing); a kernel's
configuration is read by :mod:`labctl.kernel.kconfig`.

* :func:`lab_requirements` lists what a lab needs from its guests' kernels,
  each need pointing at the lab-file line it comes from.
* :func:`check_requirements` (the preflight) checks those needs against each guest's configuration
  before any QEMU starts: refusals (the lab cannot run) and warnings (a lab
  feature will not work).
* :func:`config_fragment` is the fragment a kernel developer merges with
  ``scripts/kconfig/merge_config.sh`` so that the lab works on their build.

The rules (checked against Linux 6.1's Kconfig files)::

    option(s)                                   need                                  severity
    PVH                                         QEMU boots the ELF vmlinux (PVH)       refuse
    SERIAL_8250 + SERIAL_8250_CONSOLE (y)       console on ttyS0, READY line           refuse
    BLK_DEV_INITRD + BINFMT_SCRIPT (y)          labctl's initramfs, its #! /init       refuse
    DEVTMPFS                                    the initramfs mounts it on /dev        refuse
    PCI + VIRTIO_PCI + VIRTIO_BLK               root disk is virtio-blk-pci            refuse
    EXT4_FS                                     root file system is ext4               refuse
    ACPI + FW_CFG_SYSFS                         guest config from fw_cfg in sysfs      refuse
    UNIX, INET                                  sshd                                   refuse
    VIRTIO_NET                                  the management NIC (SSH)               refuse
    a lab NIC's driver (8139CP|8139TOO, E1000,  the NIC at its line                    refuse
      E1000E, VIRTIO_NET, E100, PCNET32,
      NE2K_PCI, VMXNET3)
    PVPANIC + PVPANIC_MMIO + ACPI               QEMU's ISA pvpanic device              warn
    KALLSYMS                                    oops backtraces, perf symbols          warn
    ACPI + ACPI_BUTTON + INPUT_EVDEV            clean power-off for labctl down        warn
      + MAGIC_SYSRQ
    PERF_EVENTS                                 perf_record, perf_stat                 warn
    EVENT_TRACING                               tracepoint events (perf, ftrace)       warn
    FUNCTION_TRACER / FUNCTION_GRAPH_TRACER     ftrace tracer function/function_graph  warn
    DYNAMIC_FTRACE                              ftrace functions (filters)             warn
    KPROBE_EVENTS                               kprobes                                warn
    KPROBE_EVENTS + EVENT_TRACING               skb_latency                            warn
    DEBUG_INFO, not _REDUCED/_SPLIT             gdb steps, skb_latency offsets         warn
    the NIC driver as a module (m)              a step's ``nic:`` driver share (perf)  warn
    MODULES / NET_SCH_NETEM / RPS               a step command's modprobe|insmod /     warn
                                                netem / rps_cpus
    NET_SCH_NETEM                               a NIC's or a step's impair             warn
    IPV6 / VLAN_8021Q / BONDING / BRIDGE        a guest's IPv6 addresses and routes,   refuse
                                                VLANs, bonds, bridges

A module (``m``) counts as present: labctl's initramfs loads the disk,
fw_cfg and NIC drivers, the guest's init modprobes the power-button and
pvpanic ones and the kernel auto-loads the rest. A rule may carry a
``module_note`` that :func:`check_requirements` adds when its option is a module. ``form`` says where a
module is not enough (a console must be built in) or where only a module
will do (the driver share counts samples of the driver's module).

Debug info: preflight warns about it only where the lab needs it (gdb steps,
``skb_latency``); the fragment always asks for it, because ``labctl gdb`` and
oops decoding to source lines work on every guest.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from labctl.errors import Problem
from labctl.lab import NIC_MODELS, Guest, Lab, LinkSpec, Nic, Step, TraceSpec, YamlMap, YamlSeq, parse_yaml, render

__all__ = [
    "DRIVER_OPTIONS",
    "RULES",
    "Preflight",
    "Requirement",
    "Rule",
    "check_requirements",
    "config_fragment",
    "lab_requirements",
]

Severity = Literal["refuse", "warn"]
Form = Literal["any", "builtin", "module"]

from labctl.kernel.kconfig import KConfig

# --------------------------------------------------------------------------
# What a lab needs
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One need of a lab from a guest kernel, before it is placed in a lab file.

    ``options``: every group must hold, any option of a group will do.
    ``what``: a noun phrase for messages ("kprobe events"); ``why``: one
    sentence saying what needs it ('' when ``what`` says it all).
    ``form``: ``any`` (y or m), ``builtin`` (y) or ``module`` (m).
    ``unset``: options that must not be enabled. ``module_note``: said when an
    option is only a module and nothing in the guest would load it. ``fragment_module``: the
    config fragment asks for a module although either will do (a built-in one would be
    dropped to a module by Kconfig on some configurations).
    """

    key: str
    options: tuple[tuple[str, ...], ...]
    what: str
    why: str
    severity: Severity
    form: Form = "any"
    unset: tuple[str, ...] = ()
    module_note: str = ""
    fragment_module: bool = False

    def at(self, guest: str, line: int, path: str) -> Requirement:
        """This rule for ``guest``, coming from ``line``/``path`` of the lab file."""
        values = {f.name: getattr(self, f.name) for f in fields(Rule)}
        return Requirement(guest=guest, line=line, path=path, **values)


@dataclass(frozen=True)
class Requirement(Rule):
    """A :class:`Rule` for one guest, placed at the lab-file line and data path it comes from."""

    guest: str = ""
    line: int = 0
    path: str = ""

    def missing(self, config: KConfig) -> list[str]:
        """What ``config`` lacks, e.g. ``["CONFIG_E1000 is not set"]``; empty when it meets this."""
        out = []
        for group in self.options:
            if any(_satisfies(config.state(o), self.form) for o in group):
                continue
            wrong = [o for o in group if config.state(o) in ("y", "m")]
            if wrong:
                need = "built in" if self.form == "builtin" else "a module"
                out.append(", ".join(f"CONFIG_{o}={config.state(o)}" for o in wrong) + f", not {need}")
            else:
                names = [f"CONFIG_{o}" for o in group]
                listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
                out.append(f"{listed} {'is' if len(names) == 1 else 'are'} not set")
        out += [f"CONFIG_{o}={config.state(o)}" for o in self.unset if config.enabled(o)]
        return out

    def comment(self) -> str:
        """The reason as one line: ``what`` and, when there is one, ``why``."""
        return f"{self.what}: {self.why}" if self.why else self.what


def _satisfies(value: str, form: Form) -> bool:
    if form == "builtin":
        return value == "y"
    if form == "module":
        return value == "m"
    return value in ("y", "m")


def _rule(key: str, options: str, what: str, why: str, severity: Severity, **kw: Any) -> Rule:
    """A Rule from ``options`` written as ``"A B|C"``: groups A and (B or C)."""
    groups = tuple(tuple(g.split("|")) for g in options.split())
    return Rule(key, groups, what, why, severity, **kw)


RULES: dict[str, Rule] = {r.key: r for r in (
    # Booting a labctl guest at all (every guest, at its line).
    _rule("pvh", "PVH", "PVH entry point", "QEMU boots the uncompressed vmlinux directly through it", "refuse"),
    _rule("serial_console", "SERIAL_8250 SERIAL_8250_CONSOLE", "8250 serial console",
          "labctl follows the boot and waits for the READY line on ttyS0", "refuse", form="builtin"),
    _rule("initramfs", "BLK_DEV_INITRD BINFMT_SCRIPT", "initramfs support",
          "labctl's initramfs, whose /init is a busybox #! script, loads the disk drivers and mounts the root",
          "refuse", form="builtin"),
    _rule("devtmpfs", "DEVTMPFS", "devtmpfs", "the initramfs mounts it on /dev to find the root disk /dev/vda",
          "refuse"),
    _rule("virtio_disk", "PCI VIRTIO_PCI VIRTIO_BLK", "virtio block driver",
          "the root file system is on a virtio-blk-pci disk", "refuse"),
    _rule("ext4", "EXT4_FS", "ext4 file system", "the root file system is ext4", "refuse"),
    _rule("fw_cfg", "ACPI FW_CFG_SYSFS", "QEMU fw_cfg sysfs interface",
          "the guest's init reads its configuration from /sys/firmware/qemu_fw_cfg (an ACPI device on x86)",
          "refuse"),
    _rule("unix", "UNIX", "unix domain sockets", "sshd needs them", "refuse"),
    _rule("inet", "INET", "TCP/IP networking", "labctl reaches every guest by SSH", "refuse"),
    _rule("mgmt_nic", "VIRTIO_NET", "virtio-net driver for the management NIC",
          "labctl's SSH reaches the guest through a virtio-net-pci NIC", "refuse"),
    # Lab features every guest has.
    _rule("pvpanic", "PVPANIC PVPANIC_MMIO ACPI", "driver for QEMU's ISA pvpanic device",
          "QEMU learns of a panic through it; without it only the panic=-1 reboot stops the guest", "warn"),
    _rule("virtio_console", "VIRTIO_CONSOLE", "virtio console (virtio-serial ports)",
          "labctl's guest agent uses one: without it no post-boot snapshot is kept, so no warm start and "
          "'labctl reset' boots the guest again", "warn"),
    _rule("kallsyms", "KALLSYMS", "kallsyms", "oops backtraces and perf name kernel functions through it", "warn"),
    _rule("power_button", "ACPI ACPI_BUTTON INPUT_EVDEV MAGIC_SYSRQ", "ACPI power button and sysrq",
          "labctl down presses the power button, init powers off through sysrq; else a hard stop after the timeout",
          "warn"),
    # Step features (at the step's line and path).
    _rule("perf_events", "PERF_EVENTS", "perf events", "perf record and perf stat need them", "warn"),
    _rule("tracepoints", "EVENT_TRACING", "event tracing",
          "the step records tracepoints (net:, napi:, irq: ...)", "warn"),
    _rule("function_tracer", "FUNCTION_TRACER", "function tracer", "ftrace's function tracer", "warn"),
    _rule("function_graph_tracer", "FUNCTION_GRAPH_TRACER", "function graph tracer",
          "ftrace's function_graph tracer", "warn"),
    _rule("dynamic_ftrace", "DYNAMIC_FTRACE", "dynamic ftrace",
          "the tracer is limited to the step's functions through set_ftrace_filter/set_graph_function", "warn"),
    _rule("kprobe_events", "KPROBE_EVENTS", "kprobe events", "perf probe adds the step's kprobes through them",
          "warn"),
    _rule("skb_latency", "KPROBE_EVENTS EVENT_TRACING", "kprobe events and event tracing for skb_latency",
          "skb_latency writes its kprobes to kprobe_events and records net, skb, napi and irq tracepoints", "warn"),
    _rule("debug_info", "DEBUG_INFO", "full DWARF debug info",
          "gdb, oops decoding to source lines and skb_latency's struct offsets read it from vmlinux", "warn",
          unset=("DEBUG_INFO_REDUCED", "DEBUG_INFO_SPLIT")),
    _rule("modules", "MODULES", "loadable module support", "the step loads a module", "warn"),
    _rule("netem", "NET_SCH_NETEM", "netem qdisc", "the lab impairs a link with netem", "warn"),
    _rule("rps", "RPS", "receive packet steering", "the step configures RPS (rps_cpus)", "warn"),
    # A guest's network settings (at the line that asks for them).
    _rule("ipv6", "IPV6", "IPv6", "the lab gives the guest IPv6 addresses or routes", "refuse"),
    _rule("vlan", "VLAN_8021Q", "802.1Q VLAN support", "the lab gives the guest VLANs", "refuse"),
    # BONDING depends on TLS || TLS_DEVICE=n: where TLS is a module (Debian's cloud kernel) it can
    # only be one too; the guest's init loads it (ip link add ... type bond).
    _rule("bonding", "BONDING", "bonding driver", "the lab bonds the guest's NICs", "refuse",
          fragment_module=True),
    _rule("bridge", "BRIDGE", "Linux bridge", "the lab bridges the guest's NICs", "refuse"),
)}
"""Every rule by key; NIC driver rules are made by :func:`_nic_rule` and :func:`_driver_module_rule`."""

_BOOT_RULES = ("pvh", "serial_console", "initramfs", "devtmpfs", "virtio_disk", "ext4", "fw_cfg", "unix", "inet",
               "mgmt_nic")
_GUEST_RULES = ("pvpanic", "virtio_console", "kallsyms", "power_button")

DRIVER_OPTIONS: dict[str, str] = {
    "8139cp": "8139CP",
    "8139too": "8139TOO",
    "e1000": "E1000",
    "e1000e": "E1000E",
    "virtio_net": "VIRTIO_NET",
    "e100": "E100",
    "pcnet32": "PCNET32",
    "ne2k-pci": "NE2K_PCI",
    "vmxnet3": "VMXNET3",
}
"""Kconfig option of each guest driver named in :data:`labctl.lab.nics.NIC_MODELS`."""


def _driver_group(model: str) -> tuple[str, ...]:
    return tuple(DRIVER_OPTIONS[d] for d in NIC_MODELS[model].drivers)


def _nic_rule(model: str) -> Rule:
    """A lab NIC of ``model`` needs one of its drivers."""
    return Rule(f"nic:{model}", (_driver_group(model),), f"driver for NIC model {model}", "", "refuse")


def _driver_module_rule(model: str) -> Rule:
    """A step's driver share of a ``model`` NIC needs the driver as a module."""
    return Rule(f"driver_module:{model}", (_driver_group(model),), f"{model} driver as a module",
                "the step's driver share counts perf samples in the driver's module", "warn", form="module")


_MODULE_COMMAND = re.compile(r"\b(modprobe|insmod|rmmod)\b")
_NETEM_COMMAND = re.compile(r"\bnetem\b")
_RPS_COMMAND = re.compile(r"\brps_cpus\b")


class _Lines:
    """Lines of lab-file data paths, from the lab's text (the model keeps only some)."""

    def __init__(self, lab: Lab) -> None:
        data, _ = parse_yaml(lab.text, lab.source) if lab.text else (None, [])
        self._data = data

    def of(self, fallback: int, *path: str | int) -> int:
        """Line of the key (or item) at ``path``; ``fallback`` when the text does not have it."""
        node: Any = self._data
        line = fallback
        for part in path:
            if isinstance(node, YamlMap) and isinstance(part, str) and part in node:
                line, node = node.key_line(part), node[part]
            elif isinstance(node, YamlSeq) and isinstance(part, int) and 0 <= part < len(node):
                line, node = node.item_line(part), node[part]
            else:
                return fallback
        return line


def lab_requirements(lab: Lab) -> list[Requirement]:
    """Everything ``lab`` needs from its guests' kernels, each at the line it comes from.

    Per guest, in lab order: the boot path (refuse, at the guest's line),
    pvpanic/kallsyms/power button (warn, at the guest's line), a driver for
    each lab NIC (refuse, at the NIC's model); then, step by step, what the
    step's tracing, gdb session, commands and driver share need (warn, at
    the step's key that asks for it).
    """
    lines = _Lines(lab)
    out: list[Requirement] = []
    for g in lab.guests.values():
        gpath = f"guests.{g.name}"
        out += [RULES[k].at(g.name, g.line, gpath) for k in (*_BOOT_RULES, *_GUEST_RULES)]
        for nic in g.nics:
            line = lines.of(nic.line, "guests", g.name, "nics", nic.index, "model")
            out.append(_nic_rule(nic.model).at(g.name, line, f"{gpath}.nics[{nic.index}].model"))
            if nic.impair is not None:
                line = lines.of(nic.line, "guests", g.name, "nics", nic.index, "impair")
                out.append(RULES["netem"].at(g.name, line, f"{gpath}.nics[{nic.index}].impair"))
        out += [RULES[key].at(g.name, line, path) for key, line, path in _net_needs(g)]
    for i, step in enumerate(lab.steps):
        out += _step_requirements(lab, i, step, lines)
    return list(dict.fromkeys(out))  # a matrix may repeat one need at one place


def _net_needs(g: Guest) -> list[tuple[str, int, str]]:
    """(rule key, line, path) of what a guest's network settings need: IPv6 at its first IPv6
    address or route, 802.1Q at each VLAN, bonding and bridging at each bond and bridge."""
    gpath, out, v6 = f"guests.{g.name}", [], []
    holders: list[tuple[Any, int, str, str]]  # a NIC, bond or bridge; its line, path and kind
    holders = [(n, n.ip_line or n.line, f"{gpath}.nics[{n.index}]", "") for n in g.nics]
    holders += [(m, m.line, f"{gpath}.{kind}s.{m.name}", kind) for kind, ms in (("bond", g.bonds), ("bridge", g.bridges))
                for m in ms]
    for h, line, path, kind in holders:
        out += [("bonding" if kind == "bond" else kind, line, path)] if kind else []
        out += [("vlan", v.line, f"{path}.vlans[{j}]") for j, v in enumerate(h.vlans)]
        v6 += [(line, f"{path}.ip")] * any(a.version == 6 for a in h.addresses)
        v6 += [(v.line, f"{path}.vlans[{j}].ip") for j, v in enumerate(h.vlans) if any(a.version == 6 for a in v.addresses)]
    v6 += [(r.line, f"{gpath}.routes[{k}]") for k, r in enumerate(g.routes) if r.version == 6]
    return ([("ipv6", *min(v6))] if v6 else []) + out


def _step_requirements(lab: Lab, index: int, step: Step, lines: _Lines) -> list[Requirement]:
    """What one step needs: its tracing per guest, gdb, commands and driver share."""
    out: list[Requirement] = []
    base = ("steps", index)
    spath = f"steps[{index}]"

    def need(key: str | Rule, guest: str, *path: str | int) -> None:
        rule = RULES[key] if isinstance(key, str) else key
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
        out.append(rule.at(guest, lines.of(step.line, *base, *path), spath + where))

    for guest, spec in step.trace.items():
        for key, *path in _trace_needs(spec):
            need(key, guest, "trace", guest, *path)
    if step.gdb is not None:
        need("debug_info", step.gdb.guest, "gdb")
    for j, run in enumerate(step.run):
        if isinstance(run, LinkSpec):
            continue
        for key, pattern in (("modules", _MODULE_COMMAND), ("netem", _NETEM_COMMAND), ("rps", _RPS_COMMAND)):
            if pattern.search(run.command):
                need(key, run.guest, "run", j, "command")
    for imp in step.impair:
        for row in step.variants():
            guest = render(imp.nic, row, {}, quote=False).partition(".")[0]
            if guest in lab.guests:
                need("netem", guest, "impair")
    for guest, nic in _nics_under_test(lab, step):
        traced = step.trace.get(guest)
        if traced is not None and traced.perf_record is not None:
            need(_driver_module_rule(nic.model), guest, "nic")
    return out


def _trace_needs(spec: TraceSpec) -> list[tuple[str, ...]]:
    """(rule key, *path inside the guest's trace section) for one guest's tracing."""
    out: list[tuple[str, ...]] = []
    for section, events in (("perf_record", spec.perf_record.events if spec.perf_record else None),
                            ("perf_stat", spec.perf_stat)):
        if events is None:
            continue
        out.append(("perf_events", section))
        if any(":" in ev and not ev.startswith("probe:") for ev in events):
            out.append(("tracepoints", section))
    ft = spec.ftrace
    if ft is not None:
        if ft.tracer in ("function", "function_graph"):
            out.append((f"{ft.tracer}_tracer", "ftrace", "tracer"))
            if ft.functions:
                out.append(("dynamic_ftrace", "ftrace", "functions"))
        if ft.events:
            out.append(("tracepoints", "ftrace", "events"))
    if spec.kprobes:
        out.append(("kprobe_events", "kprobes"))
    if spec.skb_latency is not None:
        out += [("skb_latency", "skb_latency"), ("debug_info", "skb_latency")]
    return out


def _nics_under_test(lab: Lab, step: Step) -> list[tuple[str, Nic]]:
    """(guest, NIC) that a step's ``nic:`` names, one per matrix row."""
    if step.nic is None:
        return []
    out = []
    for row in step.variants():
        guest, _, name = render(step.nic, row, {}, quote=False).partition(".")
        g = lab.guests.get(guest)
        if g is not None and any(n.name == name for n in g.nics):
            out.append((guest, g.nic(name)))
    return out


# --------------------------------------------------------------------------
# Preflight
# --------------------------------------------------------------------------


@dataclass
class Preflight:
    """What :func:`check_requirements` found, each list sorted by line.

    ``refusals``: the lab cannot run on these kernels. ``warnings``: a lab
    feature will not work, or a guest's kernel could not be checked.
    ``notes``: information that changes nothing yet (a needed module that
    nothing in the guest loads).
    """

    refusals: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing refuses the lab."""
        return not self.refusals


def check_requirements(lab: Lab, config_for: Callable[[str], KConfig | None],
              kernel_name_for: Callable[[str], str]) -> Preflight:
    """Check ``lab`` against each guest's kernel configuration before anything starts.

    :param config_for: a guest's kernel configuration, or None when unknown
        (that guest then gets one warning that it could not be checked).
    :param kernel_name_for: the name messages give a guest's kernel
        (``6.1.0-56-cloud-amd64``, a path...).
    :return: problems such as ``lab.yaml:14: guests.b.nics[0].model: kernel
        6.1.0-56-cloud-amd64 has no driver for NIC model e1000 (CONFIG_E1000
        is not set)``.
    """
    result = Preflight()
    configs = {name: config_for(name) for name in lab.guests}
    names = {name: kernel_name_for(name) for name in lab.guests}
    for g in lab.guests.values():
        if configs[g.name] is None:
            result.warnings.append(Problem(lab.source, g.line, f"guests.{g.name}",
                                           f"kernel {names[g.name]}: its configuration is unknown, "
                                           "so preflight could not check it"))
    for req in lab_requirements(lab):
        config = configs[req.guest]
        if config is None:
            continue
        if req.form == "module" and not any(config.enabled(o) for group in req.options for o in group):
            continue  # no driver at all: refused at the NIC's line
        missing = req.missing(config)
        if missing:
            message = f"kernel {names[req.guest]} has no {req.what} ({', '.join(missing)})"
            if req.why:
                message += f": {req.why}"
            problem = Problem(lab.source, req.line, req.path, message)
            (result.refusals if req.severity == "refuse" else result.warnings).append(problem)
        elif req.module_note:
            modules = [o for group in req.options for o in group if config.module(o)]
            if modules:
                listed = ", ".join(f"CONFIG_{o}=m" for o in modules)
                result.notes.append(Problem(lab.source, req.line, req.path,
                                            f"kernel {names[req.guest]} has {listed}: {req.module_note}"))
    for problems in (result.refusals, result.warnings, result.notes):
        problems.sort(key=lambda p: (p.line, p.path, p.message))
    return result


# --------------------------------------------------------------------------
# The config fragment
# --------------------------------------------------------------------------

# Options a fragment cannot set (no prompt): the visible options that give them.
_HIDDEN: dict[str, tuple[str, ...]] = {
    "EVENT_TRACING": ("FTRACE", "FUNCTION_TRACER"),  # FUNCTION_TRACER selects GENERIC_TRACER -> TRACING
    "DEBUG_INFO": ("DEBUG_KERNEL", "DEBUG_INFO_DWARF_TOOLCHAIN_DEFAULT"),  # the choice's "not none" entries select it
    "RPS": ("SMP",),  # def_bool y if SMP && SYSFS
}

# Visible options an option depends on (6.1 Kconfig "depends on" and the
# enclosing "if"/menuconfig blocks), which merge_config.sh + olddefconfig would
# otherwise drop it for without a word. Only those a usual configuration
# (x86_64_defconfig, a distribution's) may lack; applied transitively.
_DEPENDS: dict[str, tuple[str, ...]] = {
    "PVH": ("HYPERVISOR_GUEST",),
    "SERIAL_8250_CONSOLE": ("SERIAL_8250",),
    "VIRTIO_PCI": ("PCI", "VIRTIO_MENU"),
    "VIRTIO_BLK": ("BLK_DEV", "VIRTIO_PCI"),  # VIRTIO is selected by VIRTIO_PCI
    "BLK_DEV": ("BLOCK",),
    "EXT4_FS": ("BLOCK",),
    "INET": ("NET",),
    "UNIX": ("NET",),
    "NETDEVICES": ("NET",),
    "NET_SCHED": ("NET",),
    "SERIAL_8250": ("TTY",),
    "VIRTIO_NET": ("NETDEVICES", "NET_CORE", "VIRTIO_PCI"),
    "FW_CFG_SYSFS": ("ACPI", "SYSFS"),  # the fw_cfg device is found through ACPI (QEMU0002) on x86
    "PVPANIC_MMIO": ("PVPANIC", "ACPI"),
    "ACPI_BUTTON": ("ACPI", "INPUT"),
    "INPUT_EVDEV": ("INPUT",),
    "KPROBES": ("MODULES",),
    "KPROBE_EVENTS": ("FTRACE", "KPROBES"),
    "FUNCTION_TRACER": ("FTRACE",),
    "FUNCTION_GRAPH_TRACER": ("FUNCTION_TRACER",),
    "DYNAMIC_FTRACE": ("FUNCTION_TRACER",),
    "DEBUG_INFO_DWARF_TOOLCHAIN_DEFAULT": ("DEBUG_KERNEL",),
    "NET_SCH_NETEM": ("NET_SCHED",),
    "IPV6": ("INET",),
    "VLAN_8021Q": ("NET",),
    "BRIDGE": ("NET", "INET"),
    "BONDING": ("NETDEVICES", "NET_CORE", "INET"),
    "8139CP": ("NETDEVICES", "ETHERNET", "NET_VENDOR_REALTEK", "PCI"),
    "8139TOO": ("NETDEVICES", "ETHERNET", "NET_VENDOR_REALTEK", "PCI"),
    "E1000": ("NETDEVICES", "ETHERNET", "NET_VENDOR_INTEL", "PCI"),
    "E1000E": ("NETDEVICES", "ETHERNET", "NET_VENDOR_INTEL", "PCI"),
    "E100": ("NETDEVICES", "ETHERNET", "NET_VENDOR_INTEL", "PCI"),
    "PCNET32": ("NETDEVICES", "ETHERNET", "NET_VENDOR_AMD", "PCI"),
    "NE2K_PCI": ("NETDEVICES", "ETHERNET", "NET_VENDOR_8390", "PCI"),
    "NET_VENDOR_8390": ("NET_VENDOR_NATSEMI",),
    "VMXNET3": ("NETDEVICES", "PCI", "INET"),
}


# A choice entry the fragment turns on, and its siblings it must turn off
# (merge_config.sh does not know choices: it would report the base's entry).
_CHOICES: dict[str, tuple[str, ...]] = {
    "DEBUG_INFO_DWARF_TOOLCHAIN_DEFAULT": ("DEBUG_INFO_NONE", "DEBUG_INFO_DWARF4", "DEBUG_INFO_DWARF5"),
}


@dataclass
class _Entry:
    value: str = "y"  # y, m or n
    reasons: set[str] = field(default_factory=set)
    needed_by: set[str] = field(default_factory=set)


def config_fragment(lab: Lab) -> str:
    """A configuration fragment with every option ``lab`` needs, for ``merge_config.sh``.

    Each option comes with ``#`` lines saying why (the lab's needs, or the
    options that depend on it), sorted by option name, so equal labs give
    equal text. Values: ``y``, except ``m`` for drivers whose share a step
    measures (only a module's samples count) and ``is not set`` for what
    must be off (reduced or split debug info). Full DWARF debug info is
    always asked for (``labctl gdb`` and oops decoding work on every guest).
    Dependencies that Kconfig would drop an option for are included, so
    ``merge_config.sh`` reports nothing dropped on an x86_64 defconfig or a
    Debian configuration.
    """
    entries: dict[str, _Entry] = {}
    reqs = [*lab_requirements(lab), RULES["debug_info"].at("", 0, "")]
    for req in reqs:
        for group in req.options:
            for option in _HIDDEN.get(group[0], (group[0],)):
                entry = entries.setdefault(option, _Entry())
                entry.reasons.add(req.comment())
                if (req.form == "module" or req.fragment_module) and option == group[0]:
                    entry.value = "m"
        for option in req.unset:
            entries.setdefault(option, _Entry("n")).reasons.add(req.comment())
    todo = list(entries)
    while todo:
        option = todo.pop()
        for dep in _DEPENDS.get(option, ()):
            if dep not in entries:
                entries[dep] = _Entry()
                todo.append(dep)
            entries[dep].needed_by.add(option)
    for option, siblings in _CHOICES.items():
        if option in entries:
            for sibling in siblings:
                entries.setdefault(sibling, _Entry("n")).reasons.add(f"the same choice as {option}")
    if any(e.value == "m" for e in entries.values()):
        entries.setdefault("MODULES", _Entry()).reasons.add("loadable module support: the drivers set to m need it")
    return _render_fragment(lab.name, entries)


def _render_fragment(lab_name: str, entries: dict[str, _Entry]) -> str:
    out = [
        f"# Kernel configuration fragment for labctl lab {lab_name}.",
        "# Merge it into a kernel tree's configuration:",
        "#   scripts/kconfig/merge_config.sh .config <this file>",
        "# which names every requested value that did not make it into .config.",
    ]
    for option in sorted(entries):
        entry = entries[option]
        out.append("")
        out += [f"# {reason}" for reason in sorted(entry.reasons)]
        if not entry.reasons:
            out.append("# dependency of " + ", ".join(sorted(entry.needed_by)))
        out.append(f"# CONFIG_{option} is not set" if entry.value == "n" else f"CONFIG_{option}={entry.value}")
    return "\n".join(out) + "\n"
