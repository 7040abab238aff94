"""Where everything is in a report bundle: every file name, once.

::

    runs/<lab>-<YYYYmmdd-HHMMSS>/
        manifest.json   lab file + sha256, resolved lab, image manifest, QEMU
                        version and argv per guest, accelerator, host, labctl
                        version, start/end, every command with status and duration
        summary.json    figures per step and NIC (labctl.report.run_summary)
        report.md, report.html (labctl.report)
        lab.yaml        the lab file as run
        guests/<guest>/console.log, oops.txt, oops.json
        guests/<guest>/vmcore, vmcore.json   the guest's memory when it crashed (kdump, 0600;
                        vmcore-2... for later crashes) and drgn's summary of it (the report's
                        crash section); ``labctl archive`` leaves vmcores out unless asked
        steps/<step>/<variant>/<guest>/...   raw artifacts (``_`` for a step without a matrix;
                        ``<variant>@N`` for run N of a step with ``repeat``), and what the
                        analysis derives from them: flamegraph.folded/.svg, trace.json
        steps/<step>/<variant>/<guest>/<nic>.pcapng   a NIC's capture during the step
        steps/<step>/<variant>/_host/<guest>/   the guest's QEMU on the host during the step
                        (labctl.steps.hostwatch): qemu-threads.json, perf.data, perf-script.txt.gz
        steps/<step>/flamegraph-diff-<guest>-<a>-vs-<b>.svg   differential flame graphs between variants
"""

from __future__ import annotations

from pathlib import Path

from labctl.errors import UsageError

MANIFEST = "manifest.json"
SUMMARY = "summary.json"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
LAB_FILE = "lab.yaml"
GUESTS = "guests"
STEPS = "steps"
CONSOLE = "console.log"
OOPS_TXT = "oops.txt"
OOPS_JSON = "oops.json"
NO_VARIANT = "_"
HOST_DIR = "_host"  # guest names start with a letter: no guest's directory is called this
VMCORE = "vmcore"
FLAMEGRAPH_FOLDED = "flamegraph.folded"
FLAMEGRAPH_SVG = "flamegraph.svg"
REPEAT_MARK = "@"  # variant labels never hold it


def step_dir(step: str, variant: str | None, repeat: int = 1) -> Path:
    """A step variant's directory, relative to the bundle (``steps/<step>/<variant>``, ``<variant>@N`` for run N > 1)."""
    name = variant or NO_VARIANT
    return Path(STEPS) / step / (name if repeat <= 1 else f"{name}{REPEAT_MARK}{repeat}")


def diff_flamegraph(step: str, guest: str, before: str, after: str) -> Path:
    """The differential flame graph of ``guest`` between two variants of a step, relative to the bundle."""
    return Path(STEPS) / step / f"flamegraph-diff-{guest}-{before}-vs-{after}.svg"


def capture_file(guest: str, nic: str) -> Path:
    """A NIC's capture during a step, relative to the step variant's directory (``<guest>/<nic>.pcapng``)."""
    return Path(guest) / f"{nic}.pcapng"


def guest_dir(guest: str) -> Path:
    """A guest's directory, relative to the bundle (``guests/<guest>``)."""
    return Path(GUESTS) / guest


def is_vmcore(rel: Path) -> bool:
    """Whether ``rel`` (relative to the bundle) is a guest's vmcore: ``guests/<guest>/vmcore[-N]``."""
    parts = rel.parts
    if len(parts) != 3 or parts[0] != GUESTS:
        return False
    name = parts[2]
    return name == VMCORE or (name.startswith(VMCORE + "-") and name[len(VMCORE) + 1:].isdigit())


def check_bundle_dir(path: Path) -> Path:
    """``path`` resolved when it is a bundle (it holds manifest.json).

    :raise UsageError: for anything else.
    """
    if not path.is_dir():
        raise UsageError(f"{path}: not a directory", hint="pass the run directory of a lab run")
    if not (path / MANIFEST).is_file():
        raise UsageError(f"{path} is not a report bundle (no {MANIFEST})",
                         hint="pass the run directory of a lab run: it holds manifest.json and summary.json")
    return path.resolve()
