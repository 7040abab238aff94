"""The guides run as written: each page of docs/guides/ listed here is read, its files (fenced blocks
with a ``title="NAME"``) written into a fresh directory, and the commands of its ``console`` blocks
(``$ COMMAND`` lines) run there in order with bash, ``labctl`` being this tree's (in a private state
directory, taken down after the test whatever happens). A command must exit 0 (or the status its
block shows as ``(exit status N)``), and each other line the block shows under it must appear in a
line of its output (``...`` stands for lines not shown). So a guide whose commands or output drift
from labctl fails here. Lean on purpose: each guide boots one small lab, later boots of it start
from its post-boot snapshot."""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import harness
from tests.conftest import ROOT, Cli

OVER_3_MIN = ("three guides run as a reader would: two runs and a compare, a class of two students with checks and "
              "a reset, a run with JUnit; each guide's lab boots once, later boots start warm")
GUIDES = ROOT / "docs" / "guides"
_FENCE = re.compile(r"^```(\w*)(.*)$")
_TITLE = re.compile(r'title="([^"]+)"')
_STATUS = re.compile(r"^\(exit status (\d+)\)$")


@dataclass
class Command:
    line: str
    expect: list[str] = field(default_factory=list)
    status: int = 0


def parse(text: str) -> tuple[dict[str, str], list[Command]]:
    """The page's titled files and its console commands, in the page's order."""
    files: dict[str, str] = {}
    commands: list[Command] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        body = lines[i + 1:end]
        title = _TITLE.search(m.group(2))
        if title:
            files[title.group(1)] = "\n".join(body) + "\n"
        elif m.group(1) == "console":
            for row in body:
                if row.startswith("$ "):
                    commands.append(Command(row[2:]))
                elif (s := _STATUS.match(row.strip())) and commands:
                    commands[-1].status = int(s.group(1))
                elif row.strip() and row.strip() != "..." and commands:
                    commands[-1].expect.append(row.strip())
        i = end + 1
    return files, commands


def test_parse_reads_files_commands_output_and_status() -> None:
    page = ('x\n```yaml title="a.yaml"\nname: a\n```\n```console\n$ labctl up a.yaml\n...\nup\n'
            "$ labctl check a\n(exit status 6)\n```\n```sh\nnot run\n```\n")
    files, commands = parse(page)
    assert files == {"a.yaml": "name: a\n"}
    assert commands == [Command("labctl up a.yaml", ["up"]), Command("labctl check a", [], 6)]


def _shell(cli: Cli, workdir: Path) -> dict[str, str]:
    bindir = workdir / ".bin"
    bindir.mkdir()
    wrapper = bindir / "labctl"
    wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m labctl \"$@\"\n")
    wrapper.chmod(0o755)
    env = dict(cli.env)
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)  # this tree's labctl, whatever the directory
    env["COLUMNS"] = "200"  # rich's tables unwrapped
    return env


def run_guide(cli: Cli, page: str, workdir: Path) -> None:
    files, commands = parse((GUIDES / page).read_text())
    assert commands, f"{page} has no console block"
    assert cli.tracked is not None
    for name, text in files.items():
        (workdir / name).write_text(text)
        cli.tracked.note_args([str(workdir / name)])  # taken down after the test by its name
    env = _shell(cli, workdir)
    for cmd in commands:
        done = harness.run(["bash", "-c", cmd.line], cwd=workdir, env=env, capture_output=True, text=True,
                           timeout=600)
        output = done.stdout + done.stderr
        assert done.returncode == cmd.status, f"{page}: $ {cmd.line}\nexit {done.returncode}\n{output}"
        for want in cmd.expect:
            assert any(want in line for line in output.splitlines()), \
                f"{page}: $ {cmd.line}\nno line with {want!r} in:\n{output}"


@pytest.mark.parametrize("page", ["debug-kernel.md", "run-a-course.md", "ci.md"])
def test_guide_runs(cli: Cli, image: object, tmp_path: Path, page: str) -> None:
    run_guide(cli, page, tmp_path)
