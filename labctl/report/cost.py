"""The whole-cost section: each step variant's CPU, host and guest side by side, per GB where bytes moved.

Its piece of summary.json is each step's ``cost`` (:mod:`labctl.trace.hostcost`): each involved
guest's QEMU on the host (its vCPU threads, its main loop, the rest) and the guest's own CPU over
the step's window, and both per GB of what the step moved: the transfer tool's count, else, for a
step meant to move bytes over its NIC (it runs commands and names the NIC), that NIC's byte
counters. A step that moved nothing (selftests, commands that move nothing) has no per-GB figure
and no place in the report's section. Then, per guest, what the host profile of its QEMU saw.
What the accelerator hides is said, not guessed: under TCG the guest's profile cannot see the
emulated NIC's device model, which runs in QEMU.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import ClassVar

from labctl.bundle import (
    HOST_DIR,
    Run,
    StepSummary,
    as_dict,
    as_list,
    figure,
    full_label,
    is_failed,
    nic_model,
    run_steps,
    step_labels,
    usable,
    verdict,
)
from labctl.report.charts import bar_chart_svg
from labctl.report.document import Block, Bullets, Charts, Heading, Para, Row, Span, Table, num, txt
from labctl.report.sections import HeadlineFigure, Metric, ReportSection, StepFiles, expects_transfer
from labctl.trace import KINDS, GuestCost, guest_cost, nic_bytes, step_cost

log = logging.getLogger(__name__)
COST_FIGURES = ("host_cpu_s_per_gb", "guest_cpu_s_per_gb", "host_cpu_s", "guest_cpu_s")
SAME = 1.1  # a ratio of costs below this is "about the same", whatever the noise

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


def cost_table(steps: Sequence[StepSummary], labels: Sequence[str]) -> Table:
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


def cost_charts(steps: Sequence[StepSummary], labels: Sequence[str]) -> Charts:
    failed = [is_failed(s.get("status")) for s in steps]
    return Charts(tuple(
        bar_chart_svg(title, list(labels), [usable(as_dict(s.get("cost")).get(key)) for s in steps], "s/GB",
                      axis_label=f"{title} (CPU seconds per GB)", failed=failed)
        for key, title in (("host_cpu_s_per_gb", "Host CPU per GB moved (every QEMU)"),
                           ("guest_cpu_s_per_gb", "Guest CPU per GB moved (every guest)"))))


def profile_blocks(steps: Sequence[StepSummary], labels: Sequence[str]) -> list[Block]:
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


def moved(step: StepSummary) -> bool:
    """Whether the step moved bytes (its cost has a count of them)."""
    return (usable(as_dict(step.get("cost")).get("bytes")) or 0) > 0


def cost_blocks(run: Run) -> list[Block]:
    """The whole-cost section; empty when no step moved bytes (or a bundle of an older labctl has no cost)."""
    steps = [s for s in run_steps(run.summary) if as_dict(s.get("cost")).get("guests") and moved(s)]
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


def fmt_cost(value: float) -> str:
    """CPU seconds per GB with three significant digits at most (``64``, ``21.3``, ``5.21``)."""
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def cost_points(steps: Sequence[StepSummary]) -> dict[str, tuple[list[float], list[float]]]:
    """NIC variant -> (host CPU s/GB of each run, guest CPU s/GB of each run) over its runs that did
    not fail and measured the host side of every involved guest."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for s in steps:
        label, host = nic_model(s), usable(figure(s, "host_cpu_s_per_gb"))
        if label and host is not None and not is_failed(s.get("status")) and s.get("status") != "skipped":
            hosts, guests = out.setdefault(label, ([], []))
            hosts.append(host)
            guest = usable(figure(s, "guest_cpu_s_per_gb"))
            if guest is not None:
                guests.append(guest)
    return out


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def cost_sentence(steps: Sequence[StepSummary]) -> str | None:
    """Which NIC variant cost the least and the most host CPU per GB moved (all the step's QEMUs), with
    the guests' own CPU per GB beside, and whether the difference is beyond the run-to-run noise
    (``repeat:``); None with fewer than two variants measured."""
    points = cost_points(steps)
    if len(points) < 2:
        return None
    ranked = sorted(points.items(), key=lambda kv: _mean(kv[1][0]))
    (best, (b_hosts, b_guests)), (worst, (w_hosts, w_guests)) = ranked[0], ranked[-1]
    b_host, w_host = _mean(b_hosts), _mean(w_hosts)
    ratio = w_host / b_host if b_host > 0 else None
    inside = (f"; inside the guests {fmt_cost(_mean(b_guests))} vs {fmt_cost(_mean(w_guests))} CPU s/GB"
              if b_guests and w_guests else "")
    lead = "Counting every QEMU's host CPU time (guest code, device models and I/O), "
    noise = verdict(b_hosts, w_hosts)
    if ratio is not None and ratio < SAME:
        return (f"{lead}the NIC models cost about the same host CPU per GB moved ({best} {fmt_cost(b_host)}, "
                f"{worst} {fmt_cost(w_host)} s/GB){inside}.")
    times = f" ({ratio:.1f} times as much)" if ratio is not None else ""
    if noise == "within noise":
        tail = f", but that is within the run-to-run noise of their {len(b_hosts)} and {len(w_hosts)} runs"
    elif noise == "beyond noise":
        tail = f", beyond the run-to-run noise of their {len(b_hosts)} and {len(w_hosts)} runs"
    else:
        tail = " (one run each: repeat: N on the step tells this from noise)"
    return (f"{lead}{best} cost {fmt_cost(b_host)} host CPU s per GB moved and {worst} "
            f"{fmt_cost(w_host)}{times}{tail}{inside}.")


def step_bytes(step: StepFiles) -> tuple[int | None, str | None]:
    """What the step moved and who counted it: the transfer tool on the NIC's guest (else the first
    guest), else the NIC's byte counters when the step was meant to move bytes over it."""
    e = step.entry
    guests, nic = as_dict(e.get("guests")), as_dict(e.get("nic"))
    focus = nic.get("guest") if nic.get("guest") in guests else next(iter(guests), None)
    figs = as_dict(guests.get(focus)) if focus else {}
    nbytes, source = figs.get("transfer_bytes"), figs.get("throughput_source")
    if not nbytes and focus and nic.get("name") and expects_transfer(e):
        nbytes, source = nic_bytes(step.dir / focus, nic["name"]), f"{focus} {nic['name']} rx+tx bytes (/proc/net/dev)"
    return (nbytes, source) if nbytes else (None, None)


class CostSection(ReportSection):
    """The whole cost (see the module docstring)."""

    name = "cost"
    kinds = ("stats",)
    compare_groups = ((1, "cost.", "Cost per GB, per guest"),)
    headline: ClassVar[tuple[HeadlineFigure, ...]] = (
        ("host_cpu_s_per_gb", "host CPU (all QEMUs) per GB", "s/GB", -1),
        ("guest_cpu_s_per_gb", "guest CPU (all guests) per GB", "s/GB", -1),
    )

    def summarize(self, step: StepFiles) -> None:
        e = step.entry
        window = e.get("window_s") if isinstance(e.get("window_s"), int | float) else None
        costs: dict[str, GuestCost] = {}
        for g, gdir in step.guest_dirs():
            try:
                costs[g] = guest_cost(gdir, step.dir / HOST_DIR / g)
            except Exception as exc:  # noqa: BLE001 - a figure must never lose the bundle
                log.warning("cost of %s/%s failed: %s", e.get("dir"), g, exc)
        nbytes, source = step_bytes(step)
        e["cost"] = cost = step_cost(costs, nbytes, source, window)
        e["figures"] = {**as_dict(e.get("figures")), **{k: cost.get(k) for k in COST_FIGURES}}

    def blocks(self, run: Run) -> list[Block]:
        return cost_blocks(run)

    def metrics(self, step: StepSummary) -> dict[str, Metric]:
        out = super().metrics(step)
        for guest, c in as_dict(as_dict(step.get("cost")).get("guests")).items():
            for key, label in (("host_cpu_s_per_gb", "host CPU per GB (its QEMU)"),
                               ("guest_cpu_s_per_gb", "guest CPU per GB")):
                value = usable(as_dict(c).get(key))
                if value is not None:
                    out[f"cost.{guest}.{key}"] = (value, f"{guest}: {label}", "s/GB", -1)
        return out
