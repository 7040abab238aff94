"""Lab steps: templates are shell-quoted, matrices expand, the bundled labs resolve."""

from __future__ import annotations

import shlex
from pathlib import Path

from labctl.lab import load_lab
from labctl.lab.templates import render
from labctl.steps import tracers as tr

ROOT = Path(__file__).resolve().parents[2]


def test_template_values_are_shell_quoted_in_commands() -> None:
    row = {"server": "10.0.0.1; rm -rf /", "label": "x"}
    out = render("iperf3 -c {{server}} -J", row, {}, quote=True)
    assert shlex.split(out) == ["iperf3", "-c", "10.0.0.1; rm -rf /", "-J"]
    assert render("{{ a.eth1.ip }}", {}, {"a.eth1.ip": "10.1.0.1"}, quote=False) == "10.1.0.1"


def test_driver_cost_lab_runs_three_variants_over_three_models() -> None:
    lab = load_lab(ROOT / "labs" / "nic-driver-cost.yaml")
    (step,) = lab.steps
    assert [v["label"] for v in step.variants()] == ["rtl8139", "e1000", "virtio-net-pci"]
    models = []
    for row in step.variants():
        guest, _, nic = render(step.nic, row, {}, quote=False).partition(".")
        models.append(lab.guests[guest].nic(nic).model)
    assert models == ["rtl8139", "e1000", "virtio-net-pci"]
    assert step.trace["client"].perf_record is not None
    assert step.trace["client"].mpstat == 1.0


def test_tracer_commands_quote_everything() -> None:
    lab = load_lab(ROOT / "labs" / "perf-net-events.yaml")
    spec = lab.steps[0].trace["a"]
    perf = tr.tracers(spec)[0]
    assert perf.argv[:3] == ["perf", "record", "-o"]
    assert "-a" in perf.argv and "net:netif_receive_skb" in perf.argv
    start = tr.start("/tmp/labctl/x y", perf)
    assert "'/tmp/labctl/x y'" in start
    one = lab.steps[1].trace["a"]
    assert tr.tracers(one) == []  # per-process recording wraps the command instead
    assert "-a" not in tr.perf_record_argv(one, system=False)


def test_tracers_say_when_they_record() -> None:
    spec = load_lab(ROOT / "labs" / "perf-net-events.yaml").steps[0].trace["a"]
    perf, ftrace, mpstat = tr.tracers(spec)
    # perf starts with its events off and turns them on when told through its FIFO
    assert perf.signal == "control" and perf.argv[-4:] == ["-D", "-1", "--control",
                                                           "fifo:perf-record.ctl,perf-record.ack"]
    assert "mkfifo -m 600 perf-record.ctl perf-record.ack" in tr.start("/w", perf)
    wait = tr.ready("/w x", perf, timeout=7) or ""
    assert wait.startswith("cd '/w x' && timeout 7 bash -c ")
    assert "echo enable > perf-record.ctl" in wait and "= ack" in wait
    # trace-cmd prints its banner once tracing is on; line-buffered so it shows at once
    assert "exec stdbuf -oL trace-cmd record" in tr.start("/w", ftrace)
    assert "Hit Ctrl^C" in (tr.ready("/w", ftrace) or "")
    assert mpstat.signal == "" and tr.ready("/w", mpstat) is None
    assert "rm -f perf-record.ctl perf-record.ack" in tr.stop("/w", ["perf-record"])
    # trace-cmd's recorders are told to take what the buffer holds before it is stopped (its own
    # last read loses a short step's events under load), tracing off first; perf is not
    stop = tr.stop("/w", ["perf-record", "trace-cmd"], flush=("trace-cmd",))
    perf_stop = stop.index("kill -INT")
    assert perf_stop < stop.index("tracing_on") < stop.index("pkill -USR2 -P \"$(cat trace-cmd.pid)\"") \
        < stop.index("kill -INT", perf_stop + 1)
    assert "USR2" not in tr.stop("/w", ["perf-record"])
    # every tracer is told before any is waited for (a perf's write-out no longer delays the others' ends)
    three = tr.stop("/w", ["perf-record", "trace-cmd", "mpstat"], flush=("trace-cmd",))
    assert three.count("kill -INT") == 3 and three.rindex("kill -INT") < three.index("while kill -0")


def test_skb_latency_lab_traces_both_ends_of_each_nic_model() -> None:
    lab = load_lab(ROOT / "labs" / "skb-latency.yaml")
    (step,) = lab.steps
    assert [v["label"] for v in step.variants()] == ["rtl8139", "e1000", "virtio-net-pci"]
    for guest in ("client", "server"):
        spec = step.trace[guest]
        assert spec.skb_latency is not None and spec.ftrace is None
        (t,) = tr.tracers(spec)
        assert t.name == "skb-latency" and t.argv[:2] == ["trace-cmd", "record"]
        assert "skb-report.txt" in tr.postprocess("/tmp/w", spec)
        assert "-:labctl_skb/tcp_v4_rcv" in (tr.remove_kprobes(spec) or "")


def test_kallsyms_is_copied_only_for_perf_record() -> None:
    """perf's reports and the flame graphs read the guest's kallsyms copy; without perf_record it is
    4 MB written and copied back for nothing (about 2 s a guest and step under TCG)."""
    lab = load_lab(ROOT / "labs" / "skb-latency.yaml")
    (step,) = lab.steps
    assert "kallsyms" not in tr.postprocess("/tmp/w", step.trace["client"])
    perf = load_lab(ROOT / "labs" / "perf-net-events.yaml")
    spec = next(s for st in perf.steps for s in st.trace.values() if s.perf_record is not None)
    post = tr.postprocess("/tmp/w", spec)
    assert "cat /proc/kallsyms > kallsyms.txt" in post and "kallsyms-modules.txt" in post


def test_perf_records_build_ids_in_mmap_events_only_where_the_kernel_can() -> None:
    """perf 6.1 asks a kernel for build ids in its mmap events with --buildid-mmap and does not fall back
    when the kernel is older than 5.12 (it would not record at all): the flag goes only to a kernel
    that has them, the guest's (by its release) or the host's."""
    argv = ["perf", "record", "-o", "perf.data", "-a"]
    assert tr.with_build_ids(argv, "6.1.0-56-amd64") == ["perf", "record", "--buildid-mmap", "-o", "perf.data", "-a"]
    assert tr.with_build_ids(argv, "5.12.0") [2] == "--buildid-mmap"
    assert tr.with_build_ids(["/usr/bin/perf", "record", "-p", "1"], "6.1.192-heldout")[2] == "--buildid-mmap"
    for release in ("5.10.0-30-amd64", "4.19.0", "", "?"):
        assert tr.with_build_ids(argv, release) == argv, release
    stat = ["perf", "stat", "-a"]
    assert tr.with_build_ids(stat, "6.1.0") == stat
