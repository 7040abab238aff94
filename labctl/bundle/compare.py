"""Two runs of one lab, side by side: what differs between them, and every figure with its change.

:func:`compare_runs` pairs the steps of run A and run B by step name and
variant, and for each pair puts every figure (:func:`labctl.bundle.figures.step_metrics`:
throughput, CPU, driver share, cost per GB, per-stage latency percentiles,
softnet drops, SNMP counters, tracepoint totals) side by side with its
change. It also says what differs between the runs: the kernel of each
guest, the NIC models, the lab file, labctl's and QEMU's versions, the
accelerator, the image and the host.

**Noise.** A variant run several times (a step's ``repeat: N``) has a spread.
A change is *beyond noise* when:

* both runs have repeats: their ranges (min..max over the runs) do not
  overlap. With 3 runs a side, two samples of the same distribution give
  disjoint ranges by chance with probability 2/20 = 10%; with 5 a side,
  2/252 < 1%;
* only one run has repeats: the other's value lies outside that range
  widened by its own width on each side;
* neither has repeats: there is no estimate of the noise, and no verdict.

Runs that failed are left out of the figures. Nothing here prints; the
result is JSON-able and rendered by :mod:`labctl.report.compare`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from labctl.bundle.figures import as_dict, is_failed, repeat_key, run_steps, spread, step_metrics, verdict
from labctl.bundle.read import Run
from labctl.errors import UsageError

BEYOND, WITHIN, NO_REPEATS = "beyond noise", "within noise", "no repeats"  # what figures.verdict says


def lab_of(run: Run) -> str:
    """The run's lab name (summary first, then manifest)."""
    return str(run.summary.get("lab") or as_dict(run.manifest.get("lab")).get("name") or "")


def check_same_lab(a: Run, b: Run, names: tuple[str, str] = ("RUN_A", "RUN_B")) -> None:
    """:raise UsageError: (exit 2) when the two runs are of different labs."""
    la, lb = lab_of(a), lab_of(b)
    if la != lb:
        raise UsageError(f"{names[0]} is a run of lab '{la or 'unknown'}' and {names[1]} of lab "
                         f"'{lb or 'unknown'}': labctl compare pairs the steps of two runs of the same lab",
                         hint="pass two bundles of one lab file (before and after a change)")


# --------------------------------------------------------------------------- what differs


def _kernel(k: object) -> str:
    k = as_dict(k)
    if not k:
        return "unknown"
    build = f" (build id {str(k['build_id'])[:12]})" if k.get("build_id") else ""
    return f"{k.get('release') or '?'}{build}"


def _nics(manifest: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    guests = as_dict(as_dict(as_dict(manifest.get("lab")).get("resolved")).get("guests"))
    for g, spec in guests.items():
        for nic in as_dict(spec).get("nics") or []:
            nic = as_dict(nic)
            out[f"{g}.{nic.get('name')}"] = str(nic.get("model"))
    return out


def differences(a: Run, b: Run) -> list[dict[str, Any]]:
    """What differs between the two runs' setups: [{what, a, b}], empty when nothing does."""
    ma, mb = a.manifest, b.manifest
    pairs: list[tuple[str, object, object]] = [
        ("accelerator", a.summary.get("accel") or ma.get("accel"), b.summary.get("accel") or mb.get("accel")),
        ("labctl", ma.get("labctl_version"), mb.get("labctl_version")),
        ("QEMU", as_dict(ma.get("qemu")).get("version"), as_dict(mb.get("qemu")).get("version")),
        ("lab file sha256", as_dict(ma.get("lab")).get("sha256"), as_dict(mb.get("lab")).get("sha256")),
        ("image", as_dict(ma.get("image")).get("key"), as_dict(mb.get("image")).get("key")),
        ("backend", ma.get("backend"), mb.get("backend")),
    ]
    ka, kb = as_dict(ma.get("kernels")), as_dict(mb.get("kernels"))
    pairs += [(f"kernel of {g}", _kernel(ka.get(g)), _kernel(kb.get(g))) for g in sorted(set(ka) | set(kb))]
    na, nb = _nics(ma), _nics(mb)
    pairs += [(f"NIC model of {n}", na.get(n), nb.get(n)) for n in sorted(set(na) | set(nb))]
    ha, hb = as_dict(ma.get("host")), as_dict(mb.get("host"))
    pairs += [(f"host {k}", ha.get(k), hb.get(k)) for k in ("name", "kernel", "cpus")]
    return [{"what": what, "a": va, "b": vb} for what, va, vb in pairs if va != vb]


# --------------------------------------------------------------------------- figures


def _groups(run: Run) -> dict[tuple[str, str | None], list[dict[str, Any]]]:
    """(step, variant) -> the runs of it that did not fail or get skipped, in order."""
    out: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
    for s in run_steps(run.summary):
        out.setdefault(repeat_key(s), [])
        if not is_failed(s.get("status")) and s.get("status") != "skipped":
            out[repeat_key(s)].append(s)
    return out


def _change(a: float, b: float) -> tuple[float, float | None]:
    return round(b - a, 4), (round(100 * (b - a) / abs(a), 2) if a else None)


def _metric_rows(ra: list[dict[str, Any]], rb: list[dict[str, Any]]) -> list[dict[str, Any]]:
    values: dict[str, tuple[list[float], list[float]]] = {}
    info: dict[str, tuple[str, str, int]] = {}
    order: list[str] = []
    for side, runs in ((0, ra), (1, rb)):
        for run in runs:
            for key, (value, label, unit, better) in step_metrics(run).items():
                if key not in values:
                    values[key] = ([], [])
                    order.append(key)
                values[key][side].append(value)
                info[key] = (label, unit, better)
    rows = []
    for key in order:
        va, vb = values[key]
        label, unit, better = info[key]
        row: dict[str, Any] = {"key": key, "label": label, "unit": unit, "better": better,
                               "a": spread(va) if va else None, "b": spread(vb) if vb else None}
        if va and vb:
            row["change"], row["change_pct"] = _change(float(row["a"]["mean"]), float(row["b"]["mean"]))
            row["verdict"] = verdict(va, vb)
        else:
            row["change"] = row["change_pct"] = None
            row["verdict"] = "only in A" if va else "only in B"
        rows.append(row)
    return rows


def compare_runs(a: Run, b: Run) -> dict[str, Any]:
    """Everything ``labctl compare`` shows, JSON-able.

    Keys: ``lab``, ``a``/``b`` (directory, status, started), ``differences``
    (:func:`differences`), ``pairs`` (one per step and variant present in
    both, with ``runs`` per side and ``metrics``: key, label, unit, better,
    a/b spreads, change, change_pct, verdict), ``only_in_a``/``only_in_b``
    (step and variant names present in one run only) and ``flagged`` (how
    many figure changes are beyond noise).

    :raise UsageError: when the runs are of different labs.
    """
    check_same_lab(a, b)
    ga, gb = _groups(a), _groups(b)
    pairs: list[dict[str, Any]] = []
    flagged = 0
    for key in [k for k in ga if k in gb]:
        metrics = _metric_rows(ga[key], gb[key])
        flagged += sum(1 for m in metrics if m["verdict"] == BEYOND)
        pairs.append({"step": key[0], "variant": key[1], "runs": {"a": len(ga[key]), "b": len(gb[key])},
                      "metrics": metrics})

    def side(r: Run) -> dict[str, Any]:
        return {"dir": str(r.dir), "status": r.summary.get("status") or r.manifest.get("status"),
                "started_at": r.summary.get("started_at") or r.manifest.get("started_at"),
                "accel": r.summary.get("accel") or r.manifest.get("accel")}

    return {"lab": lab_of(a), "a": side(a), "b": side(b), "differences": differences(a, b), "pairs": pairs,
            "only_in_a": [{"step": k[0], "variant": k[1]} for k in ga if k not in gb],
            "only_in_b": [{"step": k[0], "variant": k[1]} for k in gb if k not in ga],
            "flagged": flagged}
