"""The report's "Whole cost" section: each step variant's CPU per GB moved, host and guest side by side.

From the ``cost`` entry of every step in summary.json (:mod:`labctl.trace.hostcost`):
the bytes the transfer moved, each involved guest's QEMU on the host (its vCPU
threads, its main loop, the rest) and the guest's own CPU over the same
window, both per GB; then, per guest, what the host profile of its QEMU saw.
What the accelerator hides is said, not guessed: under TCG the guest's profile
cannot see the emulated NIC's device model, which runs in QEMU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from labctl.bundle.figures import (
    as_dict,
    as_list,
    fmt_cost,
    full_label,
    is_failed,
    run_steps,
    step_labels,
    usable,
)
from labctl.bundle.read import Run
from labctl.report.charts import bar_chart_svg
from labctl.report.document import Block, Bullets, Charts, Heading, Para, Row, Span, Table, num, txt
from labctl.trace.hostcost import KINDS

ACCEL_NOTES = {
    "tcg": ("Under TCG, QEMU translates the guest's code and runs it in its vCPU threads, and the emulated NIC's "
            "device model runs in QEMU too (register accesses in the vCPU thread, the packet backend in the main "
            "loop). The guest's profiler sees only the guest's side: its driver's share is not the NIC's cost. "
            "The host CPU below contains the guest's CPU (the vCPU threads run it): they are two views of one cost, "
            "not a sum."),
    "kvm": ("Under KVM the guest's code runs natively: the guest's CPU is what its profiler sees, driver included. "
            "An emulated NIC's device model still runs in QEMU on the host, on every register access (a VM exit), "
            "which the host CPU below counts."),
}


TOP_PER_GUEST = 5
UNNAMED = ("QEMU unnamed: the share of QEMU's own samples without a function name. QEMU's static functions "
           "(its device models among them) are named only when the host has QEMU's debug symbols "
           "(Debian: qemu-system-x86-dbgsym, from the debian-debug archive).")


def _s(value: object) -> tuple[Span, ...]:
    v = usable(value)
    return (Span(fmt_cost(v)),) if v is not None else (Span("n/a", "muted"),)


def _bytes(value: object) -> str:
    v = usable(value)
    if v is None:
        return "n/a"
    return f"{v / 1e9:.3f} GB" if v >= 1e8 else f"{v / 1e6:.1f} MB"


def cost_table(steps: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> Table:
    """One row per step variant and guest: window, bytes, host CPU (vCPU, main loop, other), guest CPU, per GB."""
    rows = []
    for s, label in zip(steps, labels, strict=True):
        cost = as_dict(s.get("cost"))
        for guest, c in as_dict(cost.get("guests")).items():
            c = as_dict(c)
            rows.append(Row((txt(label), txt(guest), num(cost.get("window_s")), txt(_bytes(cost.get("bytes"))),
                             num(c.get("host_cpu_s")), num(c.get("host_vcpu_s")), num(c.get("host_main_s")),
                             num(c.get("host_other_s")), num(c.get("guest_cpu_s")), _s(c.get("host_cpu_s_per_gb")),
                             _s(c.get("guest_cpu_s_per_gb"))), "failed" if is_failed(s.get("status")) else ""))
        if len(as_dict(cost.get("guests"))) > 1:
            rows.append(Row((txt(label, "b"), txt("all", "b"), num(cost.get("window_s")),
                             txt(_bytes(cost.get("bytes"))), num(cost.get("host_cpu_s")), txt(""), txt(""), txt(""),
                             num(cost.get("guest_cpu_s")), _s(cost.get("host_cpu_s_per_gb")),
                             _s(cost.get("guest_cpu_s_per_gb")))))
    headers = ("variant", "guest", "window s", "moved", "host CPU s", "vCPU threads s", "main loop s", "other s",
               "guest CPU s", "host CPU s/GB", "guest CPU s/GB")
    return Table(headers, tuple(rows), frozenset(range(2, 11)), "cost")


def cost_charts(steps: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> Charts:
    failed = [is_failed(s.get("status")) for s in steps]
    return Charts(tuple(
        bar_chart_svg(title, list(labels), [usable(as_dict(s.get("cost")).get(key)) for s in steps], "s/GB",
                      axis_label=f"{title} (CPU seconds per GB)", failed=failed)
        for key, title in (("host_cpu_s_per_gb", "Host CPU per GB moved (every QEMU)"),
                           ("guest_cpu_s_per_gb", "Guest CPU per GB moved (every guest)"))))


def profile_blocks(steps: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> list[Block]:
    """What each QEMU's host profile saw: a row of shares per variant and guest, then the hottest named functions."""
    shares, top, missing = [], [], []
    for s, label in zip(steps, labels, strict=True):
        for guest, c in as_dict(as_dict(s.get("cost")).get("guests")).items():
            host = as_dict(as_dict(c).get("host"))
            profile = as_dict(host.get("profile"))
            if not profile:
                missing.append((Span(f"{label} · {guest}: ", "b"),
                                Span(str(host.get("profile_note") or "no host profile recorded"))))
                continue
            kinds = as_dict(profile.get("kinds"))
            shares.append(Row((txt(f"{label} · {guest}"), num(profile.get("samples")),
                               *(num(kinds.get(k, 0.0)) for k in KINDS[:4]), num(profile.get("unnamed_qemu_pct")))))
            top += [Row((txt(f"{label} · {guest}"), txt(f.get("function") or "?", "code"),
                         txt(f.get("object") or "?", "code"), txt(f.get("kind") or "?"), num(f.get("pct"))))
                    for f in as_list(profile.get("top"))[:TOP_PER_GUEST] if isinstance(f, dict)]
    blocks: list[Block] = []
    if shares:
        blocks += [Table(("variant · guest", "samples", *(f"{k} %" for k in KINDS[:4]), "QEMU unnamed %"),
                         tuple(shares), frozenset(range(1, 7)), "host-kinds")]
        if any(usable(as_dict(as_dict(as_dict(as_dict(c).get("host")).get("profile"))).get("unnamed_qemu_pct"))
               for s in steps for c in as_dict(as_dict(s.get("cost")).get("guests")).values()):
            blocks.append(Para(txt(UNNAMED), "muted"))
    if top:
        blocks += [Heading(4, f"Hottest named functions of each QEMU (top {TOP_PER_GUEST})"),
                   Table(("variant · guest", "function", "object", "kind", "% of its samples"), tuple(top),
                         frozenset({4}), "host-top")]
    if missing:
        blocks += [Heading(4, "No host profile"), Bullets(tuple(missing), "warnings")]
    return blocks


def cost_blocks(run: Run) -> list[Block]:
    """The whole-cost section; empty when no step has cost figures (a bundle of an older labctl)."""
    steps = [s for s in run_steps(run.summary) if as_dict(s.get("cost")).get("guests")]
    if not steps:
        return []
    accel = str(run.summary.get("accel") or run.manifest.get("accel") or "")
    labels = step_labels(steps)
    intro = ("CPU seconds per GB moved, for every step variant: each involved guest's QEMU process on the host "
             "(all its threads, over the step's commands) and the guest's own busy CPU over the same window. "
             "Bytes moved: what the transfer tool reports.")
    blocks: list[Block] = [Heading(2, "Whole cost: host and guest"), Para(txt(intro), "muted")]
    if accel in ACCEL_NOTES:
        blocks.append(Para(txt(ACCEL_NOTES[accel]), "callout"))
    blocks += [cost_table(steps, labels), cost_charts(steps, labels)]
    notes = [(Span(f"{full_label(s)} · {g}: ", "b"), Span(str(n)))
             for s in steps for g, c in as_dict(as_dict(s.get("cost")).get("guests")).items()
             for n in as_list(as_dict(c).get("notes"))]
    if notes:
        blocks += [Heading(4, "Not measured"), Bullets(tuple(notes), "warnings")]
    profiles = profile_blocks(steps, labels)
    if profiles:
        blocks += [Heading(3, "Where QEMU's host CPU went (host perf)"),
                   Para(txt("perf on the host sampled each QEMU process during the step (cpu-clock, 499 Hz). Share "
                            "of its samples by kind of code: the guest's code as TCG translated it, QEMU's own code "
                            "(device models, TCG helpers, memory dispatch), the host kernel (sockets, polling) and "
                            "libraries."), "muted"), *profiles]
    return blocks
