"""``labctl completion``: the script shtab generates from the parser, driven through bash's own
completion function (``labctl down <TAB>`` offers the labs that are up, ``labctl ssh LAB <TAB>``
that lab's guests), and the choice of names it asks labctl for."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from labctl.cli.completion_cmd import next_names

ROOT = Path(__file__).resolve().parents[2]


def _labs() -> list[str]:
    return ["course@ann", "quickstart"]


def _guests(lab: str) -> list[str]:
    return {"quickstart": ["a", "b", "c"], "course@ann": ["a"]}[lab]


@pytest.mark.parametrize(("kind", "words", "names"), [
    ("lab", ["down"], ["course@ann", "quickstart"]),
    ("guest", ["ssh", "quickstart"], ["a", "b", "c"]),
    ("guest", ["reset", "course@ann", "a"], ["a"]),
    ("guest", ["ssh", "gone"], []),                      # not up: nothing to offer
    ("lab-guest", ["exec"], ["course@ann", "quickstart"]),
    ("lab-guest", ["exec", "--timeout", "5", "quickstart"], ["a", "b", "c"]),
    ("lab-guest", ["exec", "quickstart", "a"], []),      # the command's words: the shell's own completion
])
def test_next_names(kind: str, words: list[str], names: list[str]) -> None:
    assert next_names(kind, words, _labs, _guests) == names


def _state(root: Path) -> Path:
    state = root / "state"
    (state / "labs").mkdir(parents=True)
    for lab, guests in (("quickstart", ["a", "b", "c"]), ("nicpair", ["a", "b"])):
        d = state / "labs" / lab
        d.mkdir(mode=0o700)
        records = {g: {"name": g, "backend": "qemu", "pid": 0, "dir": str(d / g), "console": "", "qmp": "",
                       "ssh_port": 0, "accel": "tcg"} for g in guests}
        (d / "state.json").write_text(json.dumps({"lab": lab, "source": "x", "dir": str(d), "backend": "qemu",
                                                  "accel": "tcg", "image": {}, "started_at": "",
                                                  "guests": records}))
    state.chmod(0o700)
    return state


def _complete(tmp_path: Path, line: str) -> list[str]:
    """What bash's completion function for labctl offers at the end of ``line``."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "labctl").write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m labctl \"$@\"\n")
    (bindir / "labctl").chmod(0o755)
    if not (tmp_path / "labctl.bash").exists():
        script = subprocess.run([sys.executable, "-m", "labctl", "completion", "bash"], cwd=ROOT, capture_output=True,
                                text=True, check=True, timeout=60).stdout
        (tmp_path / "labctl.bash").write_text(script)
    words = line.split(" ")
    driver = (f"source {tmp_path / 'labctl.bash'}\n"
              f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
              f"COMP_LINE={shlex.quote(line)}; COMP_POINT=${{#COMP_LINE}}\n"
              "_shtab_labctl labctl\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n")
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
           "LABCTL_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run(["bash", "-c", driver], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                          check=True)
    return sorted(w for w in done.stdout.splitlines() if w)


def test_bash_completes_commands_labs_and_guests(tmp_path: Path) -> None:
    _state(tmp_path)
    assert _complete(tmp_path, "labctl dow") == ["down"]
    assert _complete(tmp_path, "labctl down ") == ["nicpair", "quickstart"]
    assert _complete(tmp_path, "labctl down qu") == ["quickstart"]
    assert _complete(tmp_path, "labctl ssh nicpair ") == ["a", "b"]
    assert _complete(tmp_path, "labctl exec quickstart ") == ["a", "b", "c"]
    assert _complete(tmp_path, "labctl capture quickstart c --") == ["--count", "--duration", "--format", "--help",
                                                                     "--write"]


def test_zsh_script_is_generated() -> None:
    done = subprocess.run([sys.executable, "-m", "labctl", "completion", "zsh"], cwd=ROOT, capture_output=True,
                          text=True, check=True, timeout=60)
    assert done.stdout.startswith("#compdef labctl") and "_labctl_labs" in done.stdout
