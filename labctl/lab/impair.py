"""Network impairments of a lab NIC: what ``impair:`` may say, checked and kept in tc's own words.

::

    impair: {delay: 20ms, jitter: 5ms, loss: 1%, duplicate: 0.1%, corrupt: 0.1%,
             reorder: 5%, rate: 10mbit, limit: 1000}

Every value is egress (what the NIC sends). labctl applies them with
``tc qdisc replace dev NIC root netem ...`` inside the guest
(:mod:`labctl.net.netem`), so values use tc's units: times in ``us``,
``ms`` or ``s``; shares in percent (``%`` required, ``0`` allowed alone);
rates in ``bit``, ``kbit``, ``mbit``, ``gbit`` (powers of 1000) or
``bps``, ``kbps``, ``mbps``, ``gbps`` (bytes per second); ``limit`` in packets.
``jitter`` and ``reorder`` need a ``delay`` (netem reorders by sending some
packets at once while delaying the others).

The same rules serve the lab file (problems with their line), a step's
``impair:`` filled in from a matrix row, and ``labctl impair`` options.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields

__all__ = ["IMPAIR_KEYS", "Impairment", "parse_impairment"]

IMPAIR_KEYS = ("delay", "jitter", "loss", "duplicate", "corrupt", "reorder", "rate", "limit")
"""The keys of ``impair:``, in display order."""

MAX_DELAY_US = 60_000_000
"""The longest delay or jitter accepted (60 s)."""

_TIME = re.compile(r"(\d+(?:\.\d+)?)\s*(us|ms|s)")
_TIME_US = {"us": 1, "ms": 1_000, "s": 1_000_000}
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*%")
_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)", re.IGNORECASE)
_RATE_BITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9,
              "bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9}
MIN_RATE_BITS = 1_000  # 1kbit: slower than that a lab only times out
MAX_RATE_BITS = 100 * 10**9


def _number(text: str) -> str:
    """``"020.50"`` -> ``"20.5"``: a number as tc prints it back."""
    value = float(text)
    return f"{value:.6f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))


def parse_time(value: object) -> str:
    """A delay or jitter (``20ms``, ``0.5ms``, ``1s``, ``250us``) in canonical form.

    :raise ValueError: for anything else, or more than 60 s.
    """
    m = _TIME.fullmatch(str(value).strip()) if isinstance(value, str) else None
    if m is None:
        raise ValueError(f"expected a time such as 20ms, 500us or 1s, got {_show(value)}")
    if float(m[1]) * _TIME_US[m[2]] > MAX_DELAY_US:
        raise ValueError(f"{value} is more than {MAX_DELAY_US // 1_000_000} s")
    return f"{_number(m[1])}{m[2]}"


def parse_percent(value: object) -> str:
    """A share such as ``1%`` or ``0.1%`` (0 may be written alone) in canonical form.

    :raise ValueError: for anything else, or more than 100%.
    """
    if value == 0 and not isinstance(value, bool):
        return "0%"
    m = _PERCENT.fullmatch(value.strip()) if isinstance(value, str) else None
    if m is None:
        raise ValueError(f"expected a percentage such as 1% or 0.1%, got {_show(value)}")
    if float(m[1]) > 100:
        raise ValueError(f"{value} is more than 100%")
    return f"{_number(m[1])}%"


def parse_rate(value: object) -> str:
    """A rate such as ``10mbit`` or ``512kbit`` (``bps`` units are bytes per second) in canonical form.

    :raise ValueError: for anything else, or a rate outside 1kbit..100gbit.
    """
    m = _RATE.fullmatch(value.strip()) if isinstance(value, str) else None
    if m is None:
        raise ValueError(f"expected a rate such as 10mbit, 512kbit or 1mbps, got {_show(value)}")
    bits = float(m[1]) * _RATE_BITS[m[2].lower()]
    if not MIN_RATE_BITS <= bits <= MAX_RATE_BITS:
        raise ValueError(f"{value} is outside 1kbit..100gbit")
    return f"{_number(m[1])}{m[2].lower()}"


def parse_limit(value: object) -> int:
    """netem's queue length in packets (1..1000000).

    :raise ValueError: for anything else.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise ValueError(f"expected a packet count (1..1000000), got {_show(value)}")
    return value


def _show(value: object) -> str:
    return repr(value) if isinstance(value, str) else "nothing" if value is None else str(value).lower()


@dataclass(frozen=True)
class Impairment:
    """What netem does to one NIC's egress; None where nothing is set.

    Values are canonical text in tc's units (``20ms``, ``1%``, ``10mbit``).
    An impairment with nothing set means "no impairment" (the default qdisc).
    """

    delay: str | None = None
    jitter: str | None = None
    loss: str | None = None
    duplicate: str | None = None
    corrupt: str | None = None
    reorder: str | None = None
    rate: str | None = None
    limit: int | None = None

    @property
    def empty(self) -> bool:
        """True when nothing is set."""
        return not self.to_dict()

    def to_dict(self) -> dict[str, str | int]:
        """The values that are set, in :data:`IMPAIR_KEYS` order (JSON)."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}

    def describe(self) -> str:
        """``delay 20ms ± 5ms, loss 1%, rate 10mbit`` ('none' when nothing is set)."""
        d = self.to_dict()
        parts = []
        if "delay" in d:
            parts.append(f"delay {d.pop('delay')}" + (f" ± {d.pop('jitter')}" if "jitter" in d else ""))
        parts += [f"{k} {v}" for k, v in d.items()]
        return ", ".join(parts) or "none"

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Impairment:
        """An impairment from :meth:`to_dict` output or lab-file values.

        :raise ValueError: naming the first bad value (see :func:`parse_impairment`).
        """
        imp, problems = parse_impairment(data)
        if problems:
            key, message = problems[0]
            raise ValueError(f"{key}: {message}" if key else message)
        return imp


def needs_delay(key: str) -> str:
    """Why ``jitter`` or ``reorder`` cannot go without a delay."""
    what = "delays some packets and sends the others at once" if key == "reorder" else "varies the delay"
    return f"{key} needs a delay (netem {what})"


def parse_value(key: str, value: object) -> str | int:
    """One impairment value checked on its own (see the module docstring for the units).

    :raise ValueError: why it is not allowed. :raise KeyError: for a key not in :data:`IMPAIR_KEYS`.
    """
    result: str | int = _PARSERS[key](value)
    return result


_PARSERS: dict[str, Callable[[object], str | int]] = {
    "delay": parse_time, "jitter": parse_time, "loss": parse_percent, "duplicate": parse_percent,
    "corrupt": parse_percent, "reorder": parse_percent, "rate": parse_rate, "limit": parse_limit}


def parse_impairment(values: Mapping[str, object],
                     keys: Iterable[str] | None = None) -> tuple[Impairment, list[tuple[str, str]]]:
    """Check ``values`` (key -> raw value); the impairment and every problem as (key, message).

    Unknown keys are the caller's to report (the lab checker names them with a
    did-you-mean); they are ignored here. ``keys`` limits the check to those
    keys (default: all of :data:`IMPAIR_KEYS`). A null value means "not set".
    """
    problems: list[tuple[str, str]] = []
    out: dict[str, object] = {}
    for key in keys or IMPAIR_KEYS:
        if key not in values or values[key] is None:
            continue
        try:
            out[key] = _PARSERS[key](values[key])
        except ValueError as exc:
            problems.append((key, str(exc)))
    for key in ("jitter", "reorder"):
        if key in out and out.get("delay") in (None, "0us", "0ms", "0s"):
            problems.append((key, needs_delay(key)))
    return Impairment(**out), problems  # type: ignore[arg-type]
