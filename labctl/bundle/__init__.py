"""The report bundle of a run: where each file goes, writing it, reading it back, packing it.

Owns: the bundle's file names (:mod:`.layout`), its directory and manifest
(:mod:`.write`), reading it back (:mod:`.read`) and summary.json's shape
(:mod:`.records`: typed records; :mod:`.figures`: accessors, number formatting, the spread of repeated runs
and the noise rule), the JUnit file of a run (:mod:`.junit`) and the archive
(:mod:`.archive`). What summary.json holds is the report sections'
(:mod:`labctl.report.run_summary`). Must not import the report, the CLI, the steps
runner or any backend: the manifest is written from what the run recorded (the lab state,
with the QEMU versions ``up`` asked), never by asking a guest's QEMU.

Imports never: labctl.report, labctl.cli, labctl.steps, labctl.backends
"""

from __future__ import annotations

from labctl.bundle.archive import pack, vmcores_of
from labctl.bundle.figures import (
    BEYOND,
    NO_REPEATS,
    WITHIN,
    as_dict,
    as_list,
    as_step,
    figure,
    fmt_num,
    full_label,
    is_failed,
    kind_record,
    nic_model,
    primary_guest,
    repeat_key,
    run_steps,
    spread,
    step_guests,
    step_labels,
    usable,
    variant_text,
    verdict,
)
from labctl.bundle.junit import ERROR as JUNIT_ERROR
from labctl.bundle.junit import FAILED as JUNIT_FAILED
from labctl.bundle.junit import PASSED as JUNIT_PASSED
from labctl.bundle.junit import Case as JunitCase
from labctl.bundle.junit import Suite as JunitSuite
from labctl.bundle.junit import selftest_cases, step_cases
from labctl.bundle.junit import write as write_junit
from labctl.bundle.layout import (
    CONSOLE,
    FLAMEGRAPH_FOLDED,
    FLAMEGRAPH_SVG,
    GUESTS,
    HOST_DIR,
    MANIFEST,
    OOPS_TXT,
    REPORT_HTML,
    REPORT_MD,
    SUMMARY,
    capture_file,
    check_bundle_dir,
    diff_flamegraph,
    guest_dir,
    is_vmcore,
    step_dir,
)
from labctl.bundle.read import Run, load_run
from labctl.bundle.records import (
    BuildRecord,
    CaptureRecord,
    CommandRecord,
    GdbRecord,
    NetworkRecord,
    NicRecord,
    SelftestEntry,
    SelftestRecord,
    Spread,
    StepSummary,
    Summary,
    VariantSpread,
    VmcoreRecord,
)
from labctl.bundle.write import (
    copy_console,
    copy_inputs,
    lab_section,
    new_bundle_dir,
    vmcore_record,
    write_crash_manifest,
    write_manifest,
)

__all__ = [
    "BEYOND",
    "CONSOLE",
    "FLAMEGRAPH_FOLDED",
    "FLAMEGRAPH_SVG",
    "GUESTS",
    "HOST_DIR",
    "JUNIT_ERROR",
    "JUNIT_FAILED",
    "JUNIT_PASSED",
    "MANIFEST",
    "NO_REPEATS",
    "OOPS_TXT",
    "REPORT_HTML",
    "REPORT_MD",
    "SUMMARY",
    "WITHIN",
    "BuildRecord",
    "CaptureRecord",
    "CommandRecord",
    "GdbRecord",
    "JunitCase",
    "JunitSuite",
    "NetworkRecord",
    "NicRecord",
    "Run",
    "SelftestEntry",
    "SelftestRecord",
    "Spread",
    "StepSummary",
    "Summary",
    "VariantSpread",
    "VmcoreRecord",
    "as_dict",
    "as_list",
    "as_step",
    "capture_file",
    "check_bundle_dir",
    "copy_console",
    "copy_inputs",
    "diff_flamegraph",
    "figure",
    "fmt_num",
    "full_label",
    "guest_dir",
    "is_failed",
    "is_vmcore",
    "kind_record",
    "lab_section",
    "load_run",
    "new_bundle_dir",
    "nic_model",
    "pack",
    "primary_guest",
    "repeat_key",
    "run_steps",
    "selftest_cases",
    "spread",
    "step_cases",
    "step_dir",
    "step_guests",
    "step_labels",
    "usable",
    "variant_text",
    "verdict",
    "vmcore_record",
    "vmcores_of",
    "write_crash_manifest",
    "write_junit",
    "write_manifest",
]
