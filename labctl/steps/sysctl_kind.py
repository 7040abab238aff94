"""A step's ``sysctls:`` kind (:mod:`labctl.lab.stepsysctl`): sysctls set in guests for the step's
duration, and put back after.

``begin`` (after the network's impairments, before the statistics) reads each sysctl's value from
``/proc/sys``, writes the step's value and fails the step when the guest's kernel refuses it;
``end`` writes the value read before back. The step's record (``sysctls``) keeps, per guest and
sysctl, the value before (as the guest printed it, one safe line, at most 256 characters), the
value set, and whether putting it back worked; a value that could not be put back is a warning.
"""

from __future__ import annotations

import shlex

from labctl.errors import GuestError, LabctlError
from labctl.lab import Step, Sysctl
from labctl.lab.stepsysctl import StepSysctls, SysctlRecord, SysctlValue
from labctl.steps.variant import StepKind, Variant
from labctl.textsafe import safe_line

q = shlex.quote
MAX_VALUE = 256  # characters of a value read from a guest that the record keeps


class SysctlsKind(StepKind):
    """The step's sysctls (see the module docstring)."""

    name = "sysctls"

    def __init__(self, spec: StepSysctls) -> None:
        self.spec = spec
        self.record: SysctlRecord = {"guests": {}}

    @classmethod
    def of(cls, step: Step) -> SysctlsKind | None:
        spec = step.spec(cls.name, StepSysctls)
        return cls(spec) if spec is not None else None

    def guests(self) -> list[str]:
        return [g for g, _ in self.spec.guests]

    @staticmethod
    def _read(v: Variant, guest: str, s: Sysctl) -> str | None:
        """The sysctl's value in ``guest`` (its whitespace folded, as sysctl(8) prints it), None when unreadable."""
        res = v.sessions.ssh(guest).run(f"cat {q('/proc/sys/' + s.path)}", timeout=30)
        if res.status != 0:
            return None
        return safe_line(" ".join(res.stdout.decode(errors="replace").split()))[:MAX_VALUE]

    @staticmethod
    def _write(v: Variant, guest: str, s: Sysctl, value: str) -> bool:
        return v.sh(guest, f"printf '%s\\n' {q(value)} > {q('/proc/sys/' + s.path)}", timeout=30) == 0

    def begin(self, v: Variant) -> None:
        """Each sysctl read, then set.

        :raise LabctlError: when a guest refuses a value (the step fails; what was set is put back at ``end``).
        """
        v.res.records["sysctls"] = self.record
        for guest, sysctls in self.spec.guests:
            values: dict[str, SysctlValue] = self.record["guests"].setdefault(guest, {})
            for s in sysctls:
                values[s.name] = {"before": self._read(v, guest, s), "set": s.value, "restored": False}
                if not self._write(v, guest, s, s.value):
                    raise LabctlError(f"{guest}: the kernel refused sysctl {s.name} = {s.value}")

    def end(self, v: Variant) -> None:
        """Every sysctl set back to its value before; a failure is a warning."""
        for guest, sysctls in self.spec.guests:
            values = self.record["guests"].get(guest, {})
            for s in sysctls:
                entry = values.get(s.name)
                if entry is None or entry["before"] is None:
                    continue
                try:
                    entry["restored"] = self._write(v, guest, s, entry["before"])
                except GuestError as exc:
                    v.res.warnings.append(f"{guest}: sysctl {s.name} not put back: {exc.message}")
                    continue
                if not entry["restored"]:
                    v.res.warnings.append(f"{guest}: sysctl {s.name} not put back to {entry['before']}")
