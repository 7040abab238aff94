"""Reading summary.json's shape: one place that knows it.

The report's sections, ``labctl compare``, bisect's oracles and the summary itself read steps,
guests and figures through these accessors, print numbers with :func:`fmt_num`, and judge
repeated runs with :func:`spread` and :func:`verdict` (the noise rule). What each figure means
is its report section's (:mod:`labctl.report`). Nothing here raises on odd data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from labctl.bundle.records import Spread, StepSummary
    from labctl.trace import GuestFigures


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


def kind_record(step: Mapping[str, object], key: str) -> object:
    """A step entry's record of a kind at ``key`` (the kind declares it, :mod:`labctl.lab.stepkinds`), None
    when it has none: for a kind whose record is not a typed field of :class:`StepSummary` (its section
    checks its shape)."""
    return step.get(key)


def as_list(value: object) -> list[Any]:
    """``value`` when it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def as_step(value: object) -> StepSummary:
    """``value`` as a step entry of summary.json when it is a dict (read back from JSON: its keys are
    the entry's, each read with ``get``), else an empty one."""
    return cast("StepSummary", as_dict(value))


def run_steps(summary: Mapping[str, Any]) -> list[StepSummary]:
    """The summary's steps (malformed entries skipped)."""
    return [as_step(s) for s in as_list(summary.get("steps")) if isinstance(s, dict)]


def step_guests(step: StepSummary) -> list[tuple[str, GuestFigures]]:
    """A step's guests with their measurements, in summary order."""
    return [(str(name), cast("GuestFigures", g)) for name, g in as_dict(step.get("guests")).items()
            if isinstance(g, dict)]


def is_failed(status: object) -> bool:
    """True for any status but ok, skipped or unknown."""
    return status not in (None, "ok", "skipped")


def nic_model(step: StepSummary) -> str | None:
    """The step's variant, else its NIC model: what a comparison calls it."""
    variant = step.get("variant") or as_dict(step.get("nic")).get("model")
    return str(variant) if variant else None


def variant_text(step: StepSummary) -> str:
    """Variant and NIC model for the results table."""
    variant, model = step.get("variant"), as_dict(step.get("nic")).get("model")
    if variant and model and variant != model:
        return f"{variant} ({model})"
    return str(variant or model or "–")


def primary_guest(step: StepSummary) -> tuple[str, GuestFigures] | None:
    """The guest the step's figures are about: the NIC's guest, else the first one."""
    guests = step_guests(step)
    nic_guest = as_dict(step.get("nic")).get("guest")
    for name, data in guests:
        if name == nic_guest:
            return name, data
    return guests[0] if guests else None


def figure(step: StepSummary, key: str) -> Any:
    """A step figure from ``figures``, else from its primary guest; None if not measured."""
    figures = as_dict(step.get("figures"))
    if key in figures:
        return figures[key]
    primary = primary_guest(step)
    return primary[1].get(key) if primary else None


def full_label(step: StepSummary) -> str:
    """``name / variant`` (or just the name)."""
    model, name = nic_model(step), str(step.get("name") or "?")
    return f"{name} / {model}" if model else name


def step_labels(steps: Sequence[StepSummary]) -> list[str]:
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


BEYOND, WITHIN, NO_REPEATS = "beyond noise", "within noise", "no repeats"  # what verdict says


def verdict(va: Sequence[float], vb: Sequence[float]) -> str:
    """Whether two sets of runs of one figure differ beyond their run-to-run noise.

    ``beyond noise`` when both have repeats and their ranges do not overlap,
    or when one has repeats and the other's value lies outside that range
    widened by its own width; ``within noise`` otherwise; ``no repeats`` when
    neither side ran more than once (nothing tells the noise).
    """
    if len(va) >= 2 and len(vb) >= 2:
        return BEYOND if max(va) < min(vb) or max(vb) < min(va) else WITHIN
    if len(va) >= 2 or len(vb) >= 2:
        many, one = (va, vb) if len(va) >= 2 else (vb, va)
        width = max(many) - min(many)
        lo, hi = min(many) - width, max(many) + width
        return BEYOND if any(v < lo or v > hi for v in one) else WITHIN
    return NO_REPEATS


def spread(values: Sequence[float]) -> Spread:
    """n, mean, min, max and sample standard deviation of a figure over repeated runs."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return {"n": n, "mean": round(mean, 4), "min": min(values), "max": max(values), "sd": round(sd, 4)}


def repeat_key(step: StepSummary) -> tuple[str, str | None]:
    """What repeated runs of one variant share: (step name, variant)."""
    return str(step.get("name") or "?"), (str(step["variant"]) if step.get("variant") else None)
