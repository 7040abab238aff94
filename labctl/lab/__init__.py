"""Lab files, the pipeline's first stage: a YAML file with line numbers
(:mod:`.yamlpos`, :mod:`.load`) checked section by section (:mod:`.checker`,
:mod:`.validate`; guests, NICs and networks as read: :mod:`.specs`; NICs: :mod:`.nicparse`;
addresses, IPv4 and IPv6: :mod:`.addresses`; VLANs, bonds, bridges, routes and sysctls:
:mod:`.netconf`; firewall and NAT (nftables): :mod:`.firewall`; tunnels and VRFs: :mod:`.tunnels`; XDP and tc programs
on NICs: :mod:`.xdp`, built from the lab's C with the host's clang (:mod:`.bpfbuild`: the one thing reading a lab
runs); network options: :mod:`.netopts`, :mod:`.impair`; host
directories: :mod:`.shares`; kernels: :mod:`.kernels`; setup and graded checks:
:mod:`.checks`, a drgn check's expression language :mod:`.drgnexpr`; what QEMU's record/replay cannot
record :mod:`.recordable`; steps: :mod:`.stepspec`, their kinds
:mod:`.stepkinds` (each kind's keys, parser and records: :mod:`.stepgdb`, :mod:`.stepnetwork`; the others
it names itself), their trace section
:mod:`.tracespec`, the packets they follow :mod:`.followspec`,
their templates :mod:`.templates`, their selftests :mod:`.kselftest`; libvirt
URIs: :mod:`.uri`; which host paths may be used: :mod:`.trust`) into the
resolved model (:mod:`.model`, :mod:`.nics`; a guest's network settings and their shared views:
:mod:`.ifaces`; with the tunnels' and VRFs', as they are shown: :mod:`.guestnet`), and where each guest runs (:mod:`.hosts`).

Owns every rule of the lab file and every problem's line. Pure: reads the
file and nothing else, starts nothing; must not import any other stage.

Imports never: labctl.image, labctl.kernel, labctl.up, labctl.backends, labctl.steps, labctl.bundle, labctl.report, labctl.cli, labctl.net, labctl.trace, labctl.debug, labctl.pipeline, labctl.state, labctl.live, labctl.training

Typical use::

    from labctl.lab import load_lab
    lab = load_lab("labs/quickstart.yaml")   # raises LabFileError with every problem, by line
    for guest in lab.guests.values():
        for nic in guest.nics: ...
"""


from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from labctl.lab.addresses import default_mac, mgmt_mac
    from labctl.lab.checker import close_match
    from labctl.lab.drgnexpr import BUILTINS as DRGN_BUILTINS
    from labctl.lab.drgnexpr import DRGN_FUNCTIONS, drgn_helper_names
    from labctl.lab.drgnexpr import OBJECT_ATTRIBUTES as DRGN_OBJECT_ATTRIBUTES
    from labctl.lab.drgnexpr import OBJECT_METHODS as DRGN_OBJECT_METHODS
    from labctl.lab.drgnexpr import PROGRAM_METHODS as DRGN_PROGRAM_METHODS
    from labctl.lab.drgnexpr import TEXT_METHODS as DRGN_TEXT_METHODS
    from labctl.lab.drgnexpr import TYPE_ATTRIBUTES as DRGN_TYPE_ATTRIBUTES
    from labctl.lab.drgnexpr import parse as parse_drgn
    from labctl.lab.firewall import Firewall, FirewallRecord, ScriptLine
    from labctl.lab.followspec import FollowSpec
    from labctl.lab.guestnet import guest_interfaces, net_settings, settings_text
    from labctl.lab.hosts import HostPlace, HostRecord, host_place, place_guests
    from labctl.lab.ifaces import (
        Address,
        Bond,
        Bridge,
        IfaceView,
        NetSettings,
        Route,
        Sysctl,
        Vlan,
        firewall_lines,
        first_ip,
        nic_addresses,
    )
    from labctl.lab.impair import IMPAIR_KEYS, Impairment, parse_impairment
    from labctl.lab.kernels import DEBIAN, TREE, KernelSpec
    from labctl.lab.kernels import FILE_KEYS as KERNEL_FILE_KEYS
    from labctl.lab.kernels import FILES as KERNEL_FILES
    from labctl.lab.kernels import debian as debian_kernel
    from labctl.lab.kernels import from_command_line as kernel_from_command_line
    from labctl.lab.kselftest import SELFTESTS, BuildRecord, Kselftest, SelftestEntry, SelftestRecord
    from labctl.lab.load import load_lab, load_lab_text
    from labctl.lab.model import (
        DEFAULT_HOST,
        DEFAULT_IMAGE,
        MGMT_NIC,
        MGMT_SUBNET,
        Check,
        Guest,
        GuestRecord,
        Lab,
        LabRecord,
        Network,
        Nic,
        NicRecord,
    )
    from labctl.lab.netopts import LinkSpec, render_impairment
    from labctl.lab.nics import NIC_ALIASES, NIC_MODELS, NicModel, canonical_nic_model, get_nic_model
    from labctl.lab.recordable import record_refusals
    from labctl.lab.shares import Share, export_link, parse_option, tag
    from labctl.lab.stepgdb import GdbRecord, GdbStep, check_location
    from labctl.lab.stepkinds import KINDS as STEP_KINDS
    from labctl.lab.stepkinds import KindDecl, StepContext, recorded_keys
    from labctl.lab.stepnetwork import CaptureRecord, NetworkRecord
    from labctl.lab.stepspec import RunSpec, Step
    from labctl.lab.templates import render
    from labctl.lab.tracespec import TraceSpec, render_trace
    from labctl.lab.trust import env_trusted, named_path_reason, read_capped, untrusted_reason
    from labctl.lab.tunnels import ETHERTYPES, KINDS, Framing, Tunnel, Vrf
    from labctl.lab.tunnels.views import summary_lines as tunnel_lines
    from labctl.lab.uri import SshHop, parse_uri, with_no_verify
    from labctl.lab.validate import BACKENDS
    from labctl.lab.xdp import Tc, Xdp, nic_tc, nic_xdp
    from labctl.lab.yamlpos import YamlMap, YamlSeq, parse_yaml
    from labctl.names import LAB_IDENT, LAB_IDENT_RULE, LAB_NAME, LAB_NAME_RULE
else:  # each name loaded at its first use (labctl.lazyface): status and exec load only what they read
    from labctl.lazyface import attach

    __getattr__, __dir__ = attach(__name__, __file__, globals())

__all__ = [
    "BACKENDS", "DEBIAN", "DEFAULT_HOST", "DEFAULT_IMAGE", "DRGN_BUILTINS", "DRGN_FUNCTIONS",
    "DRGN_OBJECT_ATTRIBUTES", "DRGN_OBJECT_METHODS", "DRGN_PROGRAM_METHODS", "DRGN_TEXT_METHODS",
    "DRGN_TYPE_ATTRIBUTES", "ETHERTYPES", "IMPAIR_KEYS", "KERNEL_FILES", "KERNEL_FILE_KEYS", "KINDS", "LAB_IDENT",
    "LAB_IDENT_RULE", "LAB_NAME", "LAB_NAME_RULE", "MGMT_NIC", "MGMT_SUBNET", "NIC_ALIASES", "NIC_MODELS",
    "SELFTESTS", "STEP_KINDS", "TREE", "Address", "Bond", "Bridge", "BuildRecord", "CaptureRecord", "Check",
    "Firewall", "FirewallRecord", "FollowSpec", "Framing", "GdbRecord", "GdbStep", "Guest", "GuestRecord",
    "HostPlace", "HostRecord", "IfaceView", "Impairment", "KernelSpec", "KindDecl", "Kselftest", "Lab", "LabRecord",
    "LinkSpec", "NetSettings", "Network", "NetworkRecord", "Nic", "NicModel", "NicRecord", "Route", "RunSpec",
    "ScriptLine", "SelftestEntry", "SelftestRecord", "Share", "SshHop", "Step", "StepContext", "Sysctl", "Tc",
    "TraceSpec", "Tunnel", "Vlan", "Vrf", "Xdp", "YamlMap", "YamlSeq", "canonical_nic_model", "check_location",
    "close_match", "debian_kernel", "default_mac", "drgn_helper_names", "env_trusted", "export_link",
    "firewall_lines", "first_ip", "get_nic_model", "guest_interfaces", "host_place", "kernel_from_command_line",
    "load_lab", "load_lab_text", "mgmt_mac", "named_path_reason", "net_settings", "nic_addresses", "nic_tc",
    "nic_xdp", "parse_drgn", "parse_impairment", "parse_option", "parse_uri", "parse_yaml", "place_guests",
    "read_capped", "record_refusals", "recorded_keys", "render", "render_impairment", "render_trace",
    "settings_text", "tag", "tunnel_lines", "untrusted_reason", "with_no_verify",
]
