"""Kernel configurations: parsing, IKCONFIG extraction, preflight against real Debian configs, the fragment."""

from __future__ import annotations

import bz2
import gzip
import lzma
import re
import struct
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

from labctl.errors import Problem
from labctl.kernel.kconfig import KConfig, extract_ikconfig, parse_config
from labctl.kernel.requirements import DRIVER_OPTIONS, RULES, Preflight, config_fragment, lab_requirements
from labctl.kernel.requirements import check_requirements as preflight
from labctl.lab import NIC_MODELS, load_lab, load_lab_text
from labctl.lab.model import Lab

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "kconfig"
LABS = sorted((ROOT / "labs").glob("*.yaml"))


@cache
def fixture_text(name: str) -> str:
    return gzip.decompress((FIXTURES / name).read_bytes()).decode()


@cache
def debian(flavour: str, abi: str = "6.1.0-56") -> KConfig:
    return parse_config(fixture_text(f"config-{abi}-{flavour}.gz"))


K612 = "6.12.117+deb12"  # Debian 12's 6.12 line (bookworm-security)


def defconfig() -> KConfig:
    return parse_config(fixture_text("x86_64_defconfig-6.1.192.gz"))


def changed(config: KConfig, **values: str) -> KConfig:
    """``config`` with some options changed (``n`` as a config file says it)."""
    return KConfig({**config, **values}, config.release)


def check(lab: Lab, config: KConfig | None, name: str = "6.1.0-56-amd64") -> Preflight:
    return preflight(lab, lambda guest: config, lambda guest: name)


def lines(problems: list[Problem]) -> list[str]:
    return [str(p) for p in problems]


def line_of(text: str, needle: str) -> int:
    """1-based line of the first line of ``text`` containing ``needle``."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


TWO_EMULATED = """\
name: two-emulated
networks:
  lan: {}
guests:
  a:
    nics:
      - {name: eth1, model: virtio-net-pci, network: lan, ip: 10.1.0.1/24}
  b:
    nics:
      - {name: eth1, model: e1000, network: lan, ip: 10.1.0.2/24}
      - {name: eth2, model: rtl8139, network: lan, ip: 10.1.0.3/24}
"""

VIRTIO_ONLY = """\
name: virtio-only
networks:
  lan: {}
guests:
  a:
    nics:
      - {name: eth1, model: virtio, network: lan, ip: 10.1.0.1/24}
  b:
    nics:
      - {name: eth1, model: virtio-net-pci, network: lan, ip: 10.1.0.2/24}
"""

TRACING = """\
name: tracing
networks:
  lan: {}
guests:
  a:
    nics:
      - {name: eth1, model: virtio-net-pci, network: lan, ip: 10.1.0.1/24}
  b:
    nics:
      - {name: eth1, model: e1000, network: lan, ip: 10.1.0.2/24}
steps:
  - name: graph
    run:
      - {guest: a, command: "modprobe sch_netem && tc qdisc add dev eth1 root netem delay 5ms"}
    trace:
      a:
        ftrace:
          tracer: function_graph
          functions: [ip_rcv]
        kprobes: [tcp_v4_rcv]
  - name: latency
    gdb: {guest: a, break: ip_rcv}
    run:
      - {guest: b, command: "echo f > /sys/class/net/eth1/queues/rx-0/rps_cpus"}
    trace:
      b:
        skb_latency: true
"""


# --- parsing ---------------------------------------------------------------


def test_parse_config_values_helpers_and_release() -> None:
    c = parse_config(
        "#\n# Linux/x86 6.1.0 Kernel Configuration\n#\n"
        'CONFIG_A=y\nCONFIG_B=m\n# CONFIG_C is not set\nCONFIG_D="gcc \\"12\\" x"\nCONFIG_E=0x1000\n'
        "CONFIG_F=32\n  # a comment\nnot a config line\nCONFIG_A=m\n")
    assert c.release == "6.1.0"
    assert dict(c) == {"A": "m", "B": "m", "C": "n", "D": 'gcc "12" x', "E": "0x1000", "F": "32"}
    assert c["CONFIG_B"] == c["B"] == "m" and "CONFIG_C" in c and "G" not in c
    assert c.module("A") and not c.builtin("A") and c.enabled("CONFIG_A")
    assert not c.enabled("C") and c.state("C") == "n"
    assert c.state("NOT_MENTIONED") == "n" and not c.enabled("NOT_MENTIONED")
    assert parse_config("").release is None and len(parse_config("hello\n")) == 0


def test_real_debian_configs_parse() -> None:
    amd64, cloud, rt = debian("amd64"), debian("cloud-amd64"), debian("rt-amd64")
    assert amd64.release == cloud.release == rt.release == "6.1.192"
    assert len(amd64) > 5000
    assert amd64.module("E1000") and amd64.module("8139CP") and amd64.builtin("PVH")
    assert cloud.state("E1000") == "n" and "8139CP" not in cloud and cloud.module("VIRTIO_NET")
    assert rt.builtin("PREEMPT_RT")
    assert amd64["CC_VERSION_TEXT"].startswith("gcc-12 (Debian")
    assert not defconfig().enabled("FW_CFG_SYSFS") and not defconfig().enabled("PVH")


# --- IKCONFIG ----------------------------------------------------------------

CONFIG_TEXT = "# Linux/x86 6.1.0 Kernel Configuration\nCONFIG_E1000=y\n# CONFIG_PVH is not set\n"


def _vmlinux(config: str = CONFIG_TEXT) -> bytes:
    """An ELF-ish kernel: header, code, the IKCONFIG block, more data."""
    block = b"IKCFG_ST" + gzip.compress(config.encode(), mtime=0) + b"IKCFG_ED"
    return b"\x7fELF\x02\x01\x01" + b"\x00" * 57 + b"\x90" * 5000 + b"IKCFG_ST not here" + block + b"\xcc" * 3000


def _bzimage(payload: bytes) -> bytes:
    """An x86 bzImage: a setup header (boot protocol 2.15) pointing at ``payload``."""
    setup_sects = 3
    head = bytearray((setup_sects + 1) * 512)
    head[0x1F1] = setup_sects
    head[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", head, 0x206, 0x020F)
    decompressor = b"\x55\x48\x89\xe5" * 100  # its own code comes first
    struct.pack_into("<II", head, 0x248, len(decompressor), len(payload))
    return bytes(head) + decompressor + payload + struct.pack("<I", 123456)  # + the kernel's size_append


def test_ikconfig_from_a_real_configs_object() -> None:
    obj = gzip.decompress((FIXTURES / "ikconfig-configs.o.gz").read_bytes())
    assert obj.startswith(b"\x7fELF")
    assert extract_ikconfig(obj) == fixture_text("x86_64_defconfig-6.1.192.gz")


def test_ikconfig_from_an_uncompressed_elf() -> None:
    text = extract_ikconfig(_vmlinux())
    assert text == CONFIG_TEXT
    assert parse_config(text or "").builtin("E1000")


@pytest.mark.parametrize("compress", [
    lambda b: gzip.compress(b, mtime=0),
    lambda b: lzma.compress(b, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32),
    lambda b: bz2.compress(b),
    lambda b: lzma.compress(b, format=lzma.FORMAT_ALONE),
], ids=["gzip", "xz", "bzip2", "lzma"])
def test_ikconfig_from_a_bzimage_payload(compress: Callable[[bytes], bytes]) -> None:
    assert extract_ikconfig(_bzimage(compress(_vmlinux()))) == CONFIG_TEXT


@pytest.mark.parametrize("compress", [lambda b: gzip.compress(b, mtime=0), lambda b: lzma.compress(b)],
                         ids=["gzip", "xz"])
def test_ikconfig_from_a_compressed_stream_without_setup_header(compress: Callable[[bytes], bytes]) -> None:
    blob = b"\x1f\x8b\x08 junk that is no gzip" + b"\x00" * 300 + compress(_vmlinux()) + b"\xff" * 64
    assert extract_ikconfig(blob) == CONFIG_TEXT


@pytest.mark.parametrize("magic", [b"\x02\x21\x4c\x18", b"\x28\xb5\x2f\xfd"], ids=["lz4", "zstd"])
def test_ikconfig_unsupported_payloads_and_kernels_without_it_give_none(magic: bytes) -> None:
    assert extract_ikconfig(_bzimage(magic + b"\x00" * 4000)) is None
    assert extract_ikconfig(_bzimage(lzma.compress(b"\x7fELF" + b"\x00" * 10000))) is None
    assert extract_ikconfig(b"\x7fELF" + b"IKCFG_ST\x1f\x8b\x08 broken gzip IKCFG_ED") is None
    truncated = gzip.compress(CONFIG_TEXT.encode() * 50)
    assert extract_ikconfig(b"IKCFG_ST" + truncated[: len(truncated) // 2]) is None
    assert extract_ikconfig(b"") is None


# --- requirements and preflight --------------------------------------------


def test_every_nic_model_driver_has_a_kconfig_option() -> None:
    drivers = {d for m in NIC_MODELS.values() for d in m.drivers}
    assert drivers == set(DRIVER_OPTIONS)


def test_cloud_kernel_refuses_e1000_and_rtl8139_naming_each_nic() -> None:
    lab = load_lab_text(TWO_EMULATED, "lab.yaml")
    result = check(lab, debian("cloud-amd64"), "6.1.0-56-cloud-amd64")
    e1000, rtl = line_of(TWO_EMULATED, "model: e1000"), line_of(TWO_EMULATED, "model: rtl8139")
    assert lines(result.refusals) == [
        (f"lab.yaml:{e1000}: guests.b.nics[0].model: kernel 6.1.0-56-cloud-amd64 has no driver for NIC model "
         "e1000 (CONFIG_E1000 is not set)"),
        (f"lab.yaml:{rtl}: guests.b.nics[1].model: kernel 6.1.0-56-cloud-amd64 has no driver for NIC model "
         "rtl8139 (CONFIG_8139CP and CONFIG_8139TOO are not set)"),
    ]
    assert not result.ok and result.warnings == []


@pytest.mark.parametrize("abi", ["6.1.0-56", K612])
def test_cloud_kernel_accepts_a_virtio_only_lab(abi: str) -> None:
    result = check(load_lab_text(VIRTIO_ONLY, "lab.yaml"), debian("cloud-amd64", abi), f"{abi}-cloud-amd64")
    assert result.ok and result.refusals == [] and result.warnings == []


@pytest.mark.parametrize("abi", ["6.1.0-56", K612])
@pytest.mark.parametrize("flavour", ["amd64", "rt-amd64"])
@pytest.mark.parametrize("lab", ["nic-driver-cost", "skb-latency"])
def test_generic_kernels_accept_the_bundled_labs(flavour: str, lab: str, abi: str) -> None:
    result = check(load_lab(ROOT / "labs" / f"{lab}.yaml"), debian(flavour, abi))
    assert result.refusals == [] and result.warnings == []


def test_the_6_12_configs_parse_and_their_cloud_kernel_refuses_emulated_nics() -> None:
    """Debian 12's 6.12 line read as 6.1's is: its release, its drivers, its debug info (DWARF from
    the toolchain's default, BTF: gdb steps and skb_latency need no warning), cloud's missing drivers."""
    amd64, cloud, rt = debian("amd64", K612), debian("cloud-amd64", K612), debian("rt-amd64", K612)
    assert amd64.release == cloud.release == rt.release == "6.12.117"
    assert amd64.module("E1000") and amd64.module("IGB") and amd64.builtin("PVH") and rt.builtin("PREEMPT_RT")
    assert amd64.builtin("DEBUG_INFO_BTF") and not amd64.enabled("DEBUG_INFO_DWARF5")
    lab = load_lab_text(TWO_EMULATED, "lab.yaml")
    result = check(lab, cloud, f"{K612}-cloud-amd64")
    assert [p.message for p in result.refusals] == [
        f"kernel {K612}-cloud-amd64 has no driver for NIC model e1000 (CONFIG_E1000 is not set)",
        f"kernel {K612}-cloud-amd64 has no driver for NIC model rtl8139 (CONFIG_8139CP and CONFIG_8139TOO are not set)",
    ]
    gdb_lab = load_lab(ROOT / "labs" / "skb-latency.yaml")
    assert check(gdb_lab, changed(amd64, DEBUG_INFO_REDUCED="y"), K612).warnings  # the rule still reads 6.12's


def test_pvpanic_as_a_module_is_fine_and_missing_is_a_warning() -> None:
    lab = load_lab_text(VIRTIO_ONLY, "lab.yaml")
    assert check(lab, debian("amd64")).notes == []  # CONFIG_PVPANIC_MMIO=m: labctl's init loads it
    assert check(lab, changed(debian("amd64"), PVPANIC_MMIO="y")).notes == []
    warned = check(lab, changed(debian("amd64"), PVPANIC="n", PVPANIC_MMIO="n")).warnings
    assert [p.path for p in warned] == ["guests.a", "guests.b"]
    assert "(CONFIG_PVPANIC is not set, CONFIG_PVPANIC_MMIO is not set)" in warned[0].message


def test_missing_fw_cfg_sysfs_is_refused_at_each_guest() -> None:
    lab = load_lab_text(VIRTIO_ONLY, "lab.yaml")
    result = check(lab, changed(debian("amd64"), FW_CFG_SYSFS="n"))
    assert [str(p).split(":")[:3] for p in result.refusals] == [["lab.yaml", "5", " guests.a"],
                                                                 ["lab.yaml", "8", " guests.b"]]
    assert result.refusals[0].message.startswith(
        "kernel 6.1.0-56-amd64 has no QEMU fw_cfg sysfs interface (CONFIG_FW_CFG_SYSFS is not set): ")
    # ACPI is how x86 finds the fw_cfg device: without it the module is useless.
    assert "CONFIG_ACPI is not set" in check(lab, changed(debian("amd64"), ACPI="n")).refusals[0].message


MERGED = ["x86_64_defconfig+all-features-6.1.192.gz", "config-6.1.0-56-cloud-amd64+all-features.gz"]


def all_features() -> Lab:
    return load_lab(FIXTURES / "all-features.yaml")


def test_defconfig_is_refused_for_pvh_and_fw_cfg() -> None:
    lab = load_lab(ROOT / "labs" / "quickstart.yaml")
    refused = {p.message.split(" (")[1].split(")")[0] for p in check(lab, defconfig()).refusals}
    assert refused == {"CONFIG_PVH is not set", "CONFIG_FW_CFG_SYSFS is not set"}


@pytest.mark.parametrize("merged", MERGED)
def test_the_fragment_merged_by_kconfig_passes_every_lab(merged: str) -> None:
    """Kconfig kept the fragment (fixtures' README): preflight then finds nothing, for any bundled lab."""
    config = parse_config(fixture_text(merged))
    for lab in [all_features(), *map(load_lab, LABS)]:
        result = check(lab, config)
        assert (result.refusals, result.warnings, result.notes) == ([], [], []), lab.name


@pytest.mark.parametrize("merged", MERGED)
def test_merged_fixtures_hold_the_golden_fragment(merged: str) -> None:
    config = parse_config(fixture_text(merged))
    golden = parse_config((FIXTURES / "all-features.config").read_text())
    assert len(golden) > 50
    assert {o: v for o, v in golden.items() if config.state(o) != v} == {}


def test_golden_fragment_for_all_features() -> None:
    """A changed fragment must be merged by Kconfig again (see the fixtures' README)."""
    assert config_fragment(all_features()) == (FIXTURES / "all-features.config").read_text()


def test_all_features_fragment_covers_every_bundled_labs_fragment() -> None:
    """So the Kconfig-checked merges above vouch for the bundled labs' fragments too."""
    golden = parse_config((FIXTURES / "all-features.config").read_text())
    for path in LABS:
        for option, value in parse_config(config_fragment(load_lab(path))).items():
            assert golden.state(option) == value or (value == "y" and golden.module(option)), (path.name, option)


def test_skb_latency_without_kprobe_events_warns_at_its_line() -> None:
    lab = load_lab_text(TRACING, "lab.yaml")
    result = check(lab, changed(debian("amd64"), KPROBE_EVENTS="n"))
    assert result.refusals == []
    line = line_of(TRACING, "skb_latency: true")
    expected = (f"lab.yaml:{line}: steps[1].trace.b.skb_latency: kernel 6.1.0-56-amd64 has no kprobe events and "
                "event tracing for skb_latency (CONFIG_KPROBE_EVENTS is not set): skb_latency writes its kprobes "
                "to kprobe_events and records net, skb, napi and irq tracepoints")
    assert expected in lines(result.warnings)
    kprobes = line_of(TRACING, "kprobes: [tcp_v4_rcv]")
    assert [(p.line, p.path) for p in result.warnings] == [(kprobes, "steps[0].trace.a.kprobes"),
                                                           (line, "steps[1].trace.b.skb_latency")]


def test_ftrace_gdb_and_command_features_warn_at_their_keys() -> None:
    lab = load_lab_text(TRACING, "lab.yaml")
    config = changed(debian("amd64"), FUNCTION_GRAPH_TRACER="n", DYNAMIC_FTRACE="n", DEBUG_INFO_REDUCED="y",
                     NET_SCH_NETEM="n", RPS="n", MODULES="n")
    got = {(p.line, p.path, p.message.split(" (")[1].split(")")[0]) for p in check(lab, config).warnings}
    assert got == {
        (line_of(TRACING, "tracer: function_graph"), "steps[0].trace.a.ftrace.tracer",
         "CONFIG_FUNCTION_GRAPH_TRACER is not set"),
        (line_of(TRACING, "functions: [ip_rcv]"), "steps[0].trace.a.ftrace.functions",
         "CONFIG_DYNAMIC_FTRACE is not set"),
        (line_of(TRACING, "modprobe sch_netem"), "steps[0].run[0].command", "CONFIG_MODULES is not set"),
        (line_of(TRACING, "modprobe sch_netem"), "steps[0].run[0].command", "CONFIG_NET_SCH_NETEM is not set"),
        (line_of(TRACING, "gdb:"), "steps[1].gdb", "CONFIG_DEBUG_INFO_REDUCED=y"),
        (line_of(TRACING, "rps_cpus"), "steps[1].run[0].command", "CONFIG_RPS is not set"),
        (line_of(TRACING, "skb_latency: true"), "steps[1].trace.b.skb_latency", "CONFIG_DEBUG_INFO_REDUCED=y"),
    }


def test_driver_share_wants_the_driver_as_a_module() -> None:
    lab = load_lab(ROOT / "labs" / "nic-driver-cost.yaml")
    result = check(lab, changed(debian("amd64"), E1000="y"))
    assert result.refusals == []
    expected = ("kernel 6.1.0-56-amd64 has no e1000 driver as a module (CONFIG_E1000=y, not a module): "
                "the step's driver share counts perf samples in the driver's module")
    assert [(p.path, p.message) for p in result.warnings] == [("steps[0].nic", expected)]
    # A missing driver is refused at its NIC, not warned about again at the step.
    cloud = check(lab, debian("cloud-amd64"), "cloud")
    assert len(cloud.refusals) == 4 and cloud.warnings == []


def test_boot_path_options_that_must_be_built_in() -> None:
    lab = load_lab_text(VIRTIO_ONLY, "lab.yaml")
    refused = check(lab, changed(debian("amd64"), SERIAL_8250="m", SERIAL_8250_CONSOLE="n",
                                 BINFMT_SCRIPT="m")).refusals
    messages = {p.message for p in refused if p.path == "guests.a"}
    assert messages == {
        ("kernel 6.1.0-56-amd64 has no 8250 serial console (CONFIG_SERIAL_8250=m, not built in, "
         "CONFIG_SERIAL_8250_CONSOLE is not set): labctl follows the boot and waits for the READY line on ttyS0"),
        ("kernel 6.1.0-56-amd64 has no initramfs support (CONFIG_BINFMT_SCRIPT=m, not built in): labctl's "
         "initramfs, whose /init is a busybox #! script, loads the disk drivers and mounts the root"),
    }


def test_unknown_config_warns_once_and_guests_may_run_different_kernels() -> None:
    lab = load_lab_text(TWO_EMULATED, "lab.yaml")
    kernels = {"a": ("6.1.0-56-cloud-amd64", debian("cloud-amd64")), "b": ("/src/linux/vmlinux", None)}
    result = preflight(lab, lambda g: kernels[g][1], lambda g: kernels[g][0])
    assert result.ok  # a runs the cloud kernel with virtio only; b's kernel is unknown
    assert lines(result.warnings) == [
        ("lab.yaml:8: guests.b: kernel /src/linux/vmlinux: its configuration is unknown, "
         "so preflight could not check it")]
    kernels["a"], kernels["b"] = kernels["b"], ("6.1.0-56-cloud-amd64", debian("cloud-amd64"))
    swapped = preflight(lab, lambda g: kernels[g][1], lambda g: kernels[g][0])
    assert [p.path for p in swapped.refusals] == ["guests.b.nics[0].model", "guests.b.nics[1].model"]
    assert [p.path for p in swapped.warnings] == ["guests.a"]


def test_requirements_carry_lines_paths_and_severities() -> None:
    lab = load_lab(ROOT / "labs" / "oops-buggy-driver.yaml")
    reqs = lab_requirements(lab)
    victim = [r for r in reqs if r.guest == "victim"]
    assert {r.key for r in victim if r.severity == "refuse"} >= {
        "pvh", "serial_console", "initramfs", "devtmpfs", "virtio_disk", "ext4", "fw_cfg", "unix", "mgmt_nic",
        "nic:rtl8139"}
    (mod,) = [r for r in reqs if r.key == "modules"]
    assert (mod.guest, mod.path, mod.severity, mod.options) == ("victim", "steps[0].run[0].command", "warn",
                                                                (("MODULES",),))
    assert mod.line == line_of(lab.text, "modprobe buggy_nf")
    assert len(reqs) == len(set(reqs))


# --- the fragment ------------------------------------------------------------

_MERGE_CONFIG_LINE = re.compile(r"^(CONFIG_[A-Za-z0-9_]+=.*|# CONFIG_[A-Za-z0-9_]+ is not set)$")


def test_fragment_for_nic_driver_cost() -> None:
    lab = load_lab(ROOT / "labs" / "nic-driver-cost.yaml")
    text = config_fragment(lab)
    values = dict(parse_config(text))
    # Driver share needs modules; the boot path is built in.
    assert {k: values[k] for k in ("8139CP", "E1000", "VIRTIO_NET", "MODULES")} == {
        "8139CP": "m", "E1000": "m", "VIRTIO_NET": "m", "MODULES": "y"}
    for option in ("FW_CFG_SYSFS", "ACPI", "SYSFS", "PVH", "HYPERVISOR_GUEST", "PVPANIC", "PVPANIC_MMIO",
                   "SERIAL_8250", "SERIAL_8250_CONSOLE", "VIRTIO_PCI", "VIRTIO_BLK", "EXT4_FS", "DEVTMPFS",
                   "BLK_DEV_INITRD", "PERF_EVENTS", "KALLSYMS", "NET_VENDOR_INTEL", "NET_VENDOR_REALTEK",
                   "DEBUG_KERNEL", "DEBUG_INFO_DWARF_TOOLCHAIN_DEFAULT"):
        assert values[option] == "y", option
    assert values["DEBUG_INFO_REDUCED"] == values["DEBUG_INFO_NONE"] == "n"
    assert "EVENT_TRACING" not in values and "DEBUG_INFO" not in values  # no prompt: set through others
    assert "CONFIG_E1000E" not in text and "KPROBE_EVENTS" not in values
    # Deterministic: the same lab gives the same text, however it was loaded.
    assert config_fragment(load_lab_text(lab.text, "elsewhere.yaml")) == text == config_fragment(lab)


def test_fragment_shape_is_safe_for_merge_config() -> None:
    for path in LABS:
        text = config_fragment(load_lab(path))
        body = text.split("\n\n")[1:]
        options = []
        for entry in body:
            *comments, setting = entry.strip("\n").split("\n")
            assert comments and all(c.startswith("# ") for c in comments), entry
            # merge_config.sh greps for CONFIG_X as a word and deletes lines holding it.
            assert not any("CONFIG_" in c for c in comments), entry
            assert _MERGE_CONFIG_LINE.match(setting), entry
            options.append(re.sub(r"^(# )?CONFIG_|[= ].*$", "", setting))
        assert options == sorted(options) and len(options) == len(set(options))


def test_fragment_covers_every_option_preflight_checks() -> None:
    """Every checked option is in the fragment with a value that passes, or is set through its prompts."""
    from labctl.kernel.requirements import _HIDDEN  # the options without a prompt

    lab = all_features()
    fragment = parse_config(config_fragment(lab))
    assert {r.key for r in lab_requirements(lab)} >= set(RULES)
    for req in lab_requirements(lab):
        for group in req.options:
            option = group[0]
            if option in _HIDDEN:
                assert all(fragment.builtin(o) for o in _HIDDEN[option]), option
            else:
                wanted = {"module": {"m"}, "builtin": {"y"}, "any": {"y", "m"}}[req.form]
                assert fragment.state(option) in wanted, (req.key, option)
        assert all(fragment.state(o) == "n" for o in req.unset)
    assert RULES["debug_info"].unset == ("DEBUG_INFO_REDUCED", "DEBUG_INFO_SPLIT")


def test_tracepoints_in_perf_and_ftrace_need_event_tracing() -> None:
    lab = load_lab(ROOT / "labs" / "perf-net-events.yaml")
    result = check(lab, changed(debian("amd64"), EVENT_TRACING="n"))
    assert [p.path for p in result.warnings] == [
        "steps[0].trace.a.perf_record", "steps[0].trace.a.ftrace.events", "steps[1].trace.a.perf_record",
        "steps[2].trace.a.perf_stat"]  # steps[2]'s perf_record has cpu-clock only
    assert all("(CONFIG_EVENT_TRACING is not set)" in p.message for p in result.warnings)
    assert result.warnings[0].line == line_of(lab.text, "perf_record:")


def test_problems_are_sorted_by_line_across_guests() -> None:
    lab = load_lab_text(TWO_EMULATED, "lab.yaml")
    configs = {"a": changed(debian("amd64"), KALLSYMS="n"), "b": None}
    result = preflight(lab, configs.__getitem__, lambda g: g)
    assert [(p.line, p.path) for p in result.warnings] == [(5, "guests.a"), (8, "guests.b")]
