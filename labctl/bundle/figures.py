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


def comparison_sentence(steps: Sequence[Mapping[str, Any]]) -> str | None:
    """One sentence comparing the NIC variants that spent the least and the most CPU in their driver.

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


def _mbyte_s(mbit_s: float | None) -> str:
    mb = (mbit_s or 0.0) / 8
    return f"{mb:.0f}" if mb >= 10 else f"{mb:.1f}"


