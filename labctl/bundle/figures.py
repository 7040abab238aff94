"""Reading summary.json's figures: one place that knows its shape.

The report, ``labctl compare`` and the summary itself (its comparison
sentence) read steps, guests and figures through these accessors, and
print numbers with :func:`fmt_num`. Nothing here raises on odd data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def fmt_num(value: object) -> str:
    """A figure as the report prints it: ints as is, floats to at most 2 decimals, None as ``n/a``."""
    if value is None or isinstance(value, bool):
        return "n/a" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "n/a"
        text = f"{value:.2f}".rstrip("0")
        return text + "0" if text.endswith(".") else text
    return str(value)


def usable(value: object) -> float | None:
    """``value`` as a finite float, or None when it is missing or not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None



def as_dict(value: object) -> dict[str, Any]:
    """``value`` when it is a dict, else an empty one."""
    return value if isinstance(value, dict) else {}


def as_list(value: object) -> list[Any]:
    """``value`` when it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def run_steps(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The summary's steps (malformed entries skipped)."""
    return [s for s in as_list(summary.get("steps")) if isinstance(s, dict)]


def step_guests(step: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A step's guests with their measurements, in summary order."""
    return [(str(name), g) for name, g in as_dict(step.get("guests")).items() if isinstance(g, dict)]


def is_failed(status: object) -> bool:
    """True for any status but ok, skipped or unknown."""
    return status not in (None, "ok", "skipped")


def nic_model(step: Mapping[str, Any]) -> str | None:
    """The step's variant, else its NIC model: what a comparison calls it."""
    variant = step.get("variant") or as_dict(step.get("nic")).get("model")
    return str(variant) if variant else None


def variant_text(step: Mapping[str, Any]) -> str:
    """Variant and NIC model for the results table."""
    variant, model = step.get("variant"), as_dict(step.get("nic")).get("model")
    if variant and model and variant != model:
        return f"{variant} ({model})"
    return str(variant or model or "–")


def primary_guest(step: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The guest the step's figures are about: the NIC's guest, else the first one."""
    guests = step_guests(step)
    nic_guest = as_dict(step.get("nic")).get("guest")
    for name, data in guests:
        if name == nic_guest:
            return name, data
    return guests[0] if guests else None


def figure(step: Mapping[str, Any], key: str) -> Any:
    """A step figure from ``figures``, else from its primary guest; None if not measured."""
    figures = as_dict(step.get("figures"))
    if key in figures:
        return figures[key]
    primary = primary_guest(step)
    return primary[1].get(key) if primary else None


def full_label(step: Mapping[str, Any]) -> str:
    """``name / variant`` (or just the name)."""
    model, name = nic_model(step), str(step.get("name") or "?")
    return f"{name} / {model}" if model else name


def step_labels(steps: Sequence[Mapping[str, Any]]) -> list[str]:
    """Short unique labels, one per step: the variant alone when all steps share a name."""
    one_name = len({s.get("name") for s in steps}) == 1
    labels: list[str] = []
    for s in steps:
        model = nic_model(s)
        label = model if (one_name and model) else full_label(s)
        n = 2
        base = label
        while label in labels:
            label, n = f"{base} #{n}", n + 1
        labels.append(label)
    return labels


def driver_sentence(steps: Sequence[Mapping[str, Any]]) -> str | None:
    """The seed's sentence: which NIC variant spent the least and the most guest CPU in its driver.

    Only steps that did not fail and have a ``driver_cpu_pct`` figure count;
    None when fewer than two distinct variants are left.
    """
    points: dict[str, tuple[float, float | None]] = {}
    for s in steps:
        label, cpu = nic_model(s), usable(figure(s, "driver_cpu_pct"))
        if label and cpu is not None and cpu >= 0 and not is_failed(s.get("status")) and label not in points:
            points[label] = (cpu, usable(figure(s, "throughput_mbit_s")))
    if len(points) < 2:
        return None
    ranked = sorted(points.items(), key=lambda kv: kv[1][0])  # stable: ties keep summary order
    (best, (b_cpu, b_tp)), (worst, (w_cpu, w_tp)) = ranked[0], ranked[-1]
    speed = f", at {_mbyte_s(b_tp)} vs {_mbyte_s(w_tp)} MB/s" if b_tp is not None and w_tp is not None else ""
    cpus = f"{fmt_num(b_cpu)}% vs {fmt_num(w_cpu)}% of the CPU"
    if b_cpu == 0:
        return (f"{best} used no measurable CPU in its driver, {worst} used {fmt_num(w_cpu)}% "
                f"of the CPU in its driver{speed}.")
    ratio = f"{w_cpu / b_cpu:.1f}"
    if ratio == "1.0":
        return f"{best} used about as much CPU in its driver as {worst} ({cpus}){speed}."
    return f"{best} used {ratio} times less CPU in its driver than {worst} ({cpus}){speed}."


def fmt_cost(value: float) -> str:
    """CPU seconds per GB with three significant digits at most (``64``, ``21.3``, ``5.21``)."""
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def cost_points(steps: Sequence[Mapping[str, Any]]) -> dict[str, tuple[list[float], list[float]]]:
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


SAME = 1.1  # a ratio of costs below this is "about the same", whatever the noise


def verdict(va: Sequence[float], vb: Sequence[float]) -> str:
    """Whether two sets of runs of one figure differ beyond their run-to-run noise.

    ``beyond noise`` when both have repeats and their ranges do not overlap,
    or when one has repeats and the other's value lies outside that range
    widened by its own width; ``within noise`` otherwise; ``no repeats`` when
    neither side ran more than once (nothing tells the noise).
    """
    if len(va) >= 2 and len(vb) >= 2:
        return "beyond noise" if max(va) < min(vb) or max(vb) < min(va) else "within noise"
    if len(va) >= 2 or len(vb) >= 2:
        many, one = (va, vb) if len(va) >= 2 else (vb, va)
        width = max(many) - min(many)
        lo, hi = min(many) - width, max(many) + width
        return "beyond noise" if any(v < lo or v > hi for v in one) else "within noise"
    return "no repeats"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def cost_sentence(steps: Sequence[Mapping[str, Any]]) -> str | None:
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


TCG_NOTE = ("Under TCG the emulated NICs' device models run inside QEMU on the host, out of the guest "
            "profiler's sight: the guest driver's share is not the NIC's cost.")


def comparison_sentence(steps: Sequence[Mapping[str, Any]], accel: object = None) -> str | None:
    """The run's headline: what the data shows about the NIC variants' cost, no more.

    Under TCG it is based on the whole cost (the QEMUs' host CPU per GB, see
    :func:`cost_sentence`) and says that the device models' work is in QEMU;
    without host figures it says the run cannot rank the NICs. Otherwise
    (KVM) it is the seed's driver sentence (:func:`driver_sentence`),
    followed by the whole cost when it was measured. None when fewer than
    two variants have figures.
    """
    cost, driver = cost_sentence(steps), driver_sentence(steps)
    if accel == "tcg":
        if cost:
            return f"{cost} {TCG_NOTE}"
        if driver:
            return f"{TCG_NOTE} The host side was not measured, so this run cannot rank the NICs by cost."
        return None
    if driver and cost:
        return f"{driver} {cost}"
    return driver or cost


def _mbyte_s(mbit_s: float | None) -> str:
    mb = (mbit_s or 0.0) / 8
    return f"{mb:.0f}" if mb >= 10 else f"{mb:.1f}"




# --------------------------------------------------------------------------- metrics: every figure, flat

HEADLINE: tuple[tuple[str, str, str, int], ...] = (
    # (key, label, unit, which way is better: +1 higher, -1 lower, 0 neither)
    ("throughput_mbit_s", "throughput", "Mbit/s", +1),
    ("cpu_load_pct", "guest CPU load", "%", -1),
    ("driver_share_pct", "driver share of the guest's busy samples", "%", -1),
    ("driver_cpu_pct", "guest CPU in the NIC driver", "%", -1),
    ("host_cpu_s_per_gb", "host CPU (all QEMUs) per GB", "s/GB", -1),
    ("guest_cpu_s_per_gb", "guest CPU (all guests) per GB", "s/GB", -1),
)
LATENCY_PCTS = ("p50", "p90", "p99")


def _latency_metrics(step: Mapping[str, Any]) -> dict[str, tuple[float, str, str, int]]:
    out: dict[str, tuple[float, str, str, int]] = {}
    nic = as_dict(step.get("nic")).get("name")
    for guest, figs in step_guests(step):
        skb = as_dict(figs.get("skb_latency"))
        for direction in ("rx", "tx"):
            d = as_dict(skb.get(direction))
            part = as_dict(as_dict(d.get("by_nic")).get(nic)) if nic else {}
            src = part if part.get("followed") else d
            if not src.get("followed"):
                continue
            titles = as_dict(skb.get("stage_titles"))
            stages = [*as_dict(src.get("stages")).items(), ("end_to_end", src.get("end_to_end"))]
            for stage, stats in stages:
                for pct in LATENCY_PCTS:
                    value = usable(as_dict(stats).get(f"{pct}_us"))
                    if value is not None:
                        title = "end to end" if stage == "end_to_end" else str(titles.get(stage, stage))
                        out[f"latency.{guest}.{direction}.{stage}.{pct}"] = (
                            value, f"{guest} {direction.upper()} {title} {pct}", "µs", -1)
    return out


def step_metrics(step: Mapping[str, Any]) -> dict[str, tuple[float, str, str, int]]:
    """Every number of a step entry worth comparing, flat: key -> (value, label, unit, better).

    The headline figures; each guest's host CPU per GB; per-packet latency
    percentiles per stage; softnet drops and squeezes; every SNMP counter
    that moved; tracepoint totals. Values that were not measured are left out.
    """
    out: dict[str, tuple[float, str, str, int]] = {}
    for key, label, unit, better in HEADLINE:
        value = usable(figure(step, key))
        if value is not None:
            out[key] = (value, label, unit, better)
    cost = as_dict(step.get("cost"))
    for guest, c in as_dict(cost.get("guests")).items():
        for key, label in (("host_cpu_s_per_gb", "host CPU per GB (its QEMU)"),
                           ("guest_cpu_s_per_gb", "guest CPU per GB")):
            value = usable(as_dict(c).get(key))
            if value is not None:
                out[f"cost.{guest}.{key}"] = (value, f"{guest}: {label}", "s/GB", -1)
    out.update(_latency_metrics(step))
    for guest, figs in step_guests(step):
        sn = as_dict(figs.get("softnet"))
        for key in ("dropped", "time_squeeze"):
            value = usable(sn.get(key))
            if value is not None:
                out[f"softnet.{guest}.{key}"] = (value, f"{guest} softnet {key}", "", -1)
        for counter, value in as_dict(figs.get("snmp")).items():
            if usable(value) is not None:
                out[f"snmp.{guest}.{counter}"] = (float(value), f"{guest} {counter}", "", 0)
        for source in as_list(figs.get("tracepoints")):
            for event, e in as_dict(as_dict(source).get("events")).items():
                value = usable(as_dict(e).get("total"))
                if value is not None:
                    key = f"tracepoints.{guest}.{as_dict(source).get('source')}.{event}"
                    out[key] = (value, f"{guest} {event} ({as_dict(source).get('source')})", "events", 0)
    return out


def spread(values: Sequence[float]) -> dict[str, float | int]:
    """n, mean, min, max and sample standard deviation of a figure over repeated runs."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return {"n": n, "mean": round(mean, 4), "min": min(values), "max": max(values), "sd": round(sd, 4)}


def repeat_key(step: Mapping[str, Any]) -> tuple[str, str | None]:
    """What repeated runs of one variant share: (step name, variant)."""
    return str(step.get("name") or "?"), (str(step["variant"]) if step.get("variant") else None)
