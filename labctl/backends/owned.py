"""What a backend created on its hosts for one guest: the ownership journal.

``guests/<guest>/owned.json`` in the lab's run directory lists every domain,
volume and helper process created for the guest, each written *before* it
is created; ``owned.json`` in the run directory itself lists what belongs
to the whole lab (a libvirt host's directory of the lab's sockets).
``down``, and the clean-up of a failed or interrupted ``up``, remove
exactly these and nothing else, even when ``up`` died before the lab's
state was saved.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from labctl.paths import atomic_write

JOURNAL = "owned.json"


class OwnedEntry(TypedDict):
    """One thing the journal lists: its backend and kind, and what finds it again."""

    backend: str
    kind: str  # domain, volume, host-dir (remote-dir: an older labctl's), process
    uri: NotRequired[str]  # the host's libvirt URI and name (domain, volume, host-dir)
    host: NotRequired[str]
    name: NotRequired[str]  # the domain's or the volume's
    run_dir: NotRequired[str]  # a domain's guest directory
    pool: NotRequired[str]  # a volume's storage pool
    path: NotRequired[str]  # a host-dir's path
    pid: NotRequired[int]  # a process's, and its command line's marker
    marker: NotRequired[str]


def record(guest_dir: Path, entry: OwnedEntry) -> None:
    """Add ``entry`` (a JSON object with at least ``backend`` and ``kind``) to the journal."""
    items = entries(guest_dir)
    if entry not in items:
        items.append(entry)
    _write(guest_dir, items)


def _write(guest_dir: Path, items: list[OwnedEntry]) -> None:
    atomic_write(guest_dir / JOURNAL, json.dumps(items, indent=1) + "\n", 0o600)


def forget(guest_dir: Path, entry: OwnedEntry) -> None:
    """Take ``entry`` out of the journal: its creation was refused because the thing
    already existed, so it is someone else's and must not be removed."""
    _write(guest_dir, [e for e in entries(guest_dir) if e != entry])


def entries(guest_dir: Path) -> list[OwnedEntry]:
    """The journal's entries, oldest first ([] when there is none)."""
    try:
        data = json.loads((guest_dir / JOURNAL).read_text())
    except (OSError, ValueError):
        return []
    # the journal's JSON objects, as this labctl (or an older one) wrote them
    return [cast(OwnedEntry, e) for e in data if isinstance(e, dict)] if isinstance(data, list) else []


def backends(run_dir: Path) -> dict[str, list[Path]]:
    """backend name -> the guest directories under ``run_dir`` whose journal names it,
    then ``run_dir`` itself if its own journal does (after the guests: their
    domains go before the lab's directories)."""
    out: dict[str, list[Path]] = {}
    for gdir in [*sorted((run_dir / "guests").glob("*")), run_dir]:
        for name in sorted({str(e.get("backend")) for e in entries(gdir)}):
            out.setdefault(name, []).append(gdir)
    return out
