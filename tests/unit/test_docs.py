"""The documentation's generated reference pages match labctl's code (scripts/gen-docs.py), every key
list of the lab file's validator is in them, every command's --help prints, and every labctl command
the README and the guides show parses with labctl's parser."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import labctl.lab
from labctl.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen-docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_pages_match_the_code() -> None:
    done = subprocess.run([sys.executable, "scripts/gen-docs.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def test_a_changed_option_makes_the_check_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = _gen()
    real = gen.build_parser

    def changed() -> argparse.ArgumentParser:
        parser = real()
        parser.add_argument("--brand-new-option", help="not in the page")
        return parser

    monkeypatch.setattr(gen, "build_parser", changed)
    assert "--brand-new-option" in gen.commands_page()
    assert gen.main(["gen-docs.py", "--check"]) == 1


def _key_lists() -> dict[str, tuple[str, ...]]:
    """Every module-level tuple of key names in labctl/lab (``KEYS``, ``_STEP_KEYS``, ...)."""
    found = {}
    for path in sorted((ROOT / "labctl" / "lab").glob("*.py")):
        module = importlib.import_module(f"labctl.lab.{path.stem}") if path.stem != "__init__" else labctl.lab
        for name, value in vars(module).items():
            if name.rstrip("_").endswith("KEYS") and isinstance(value, tuple):
                found[f"{path.stem}.{name}"] = value
    return found


def test_every_key_list_of_the_validator_is_documented() -> None:
    gen = _gen()
    shown = {keys for _, keys, *_ in (*gen.LAB_SECTIONS, *gen.STEP_SECTIONS)}
    shown |= {keys for _, keys, _ in gen.TRACE_KINDS if keys is not None}
    lists = _key_lists()
    assert len(lists) >= 15
    missing = {name: keys for name, keys in lists.items() if keys not in shown}
    assert not missing, f"key lists not in scripts/gen-docs.py's tables: {missing}"


def test_every_trace_kind_of_the_validator_has_a_row() -> None:
    from labctl.lab import tracespec

    assert sorted(kind for kind, _, _ in _gen().TRACE_KINDS) == sorted(tracespec._TRACE_KEYS)


def shown_commands(text: str) -> list[str]:
    """The labctl command lines of a page's fenced blocks (``$ `` prompts dropped; a line's ``&&``,
    ``;`` and ``&`` parts each; comments, pipes and redirections cut off)."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        row = line.strip().removeprefix("$ ")
        for part in re.split(r"\s*(?:&&|\|\|)\s*|;\s*|\s&\s", row) if fenced else ():
            part = re.split(r"\s+#|\s(?:\||>>?|<)\s?", part.strip().lstrip("(").rstrip(")"))[0]
            if part.startswith("labctl "):
                found.append(part)
    return found


# The pages a newcomer copies commands from: the README's tour and the guides (the console blocks
# of three of them also run in tests/integration/test_guides.py; find-the-commit's and the parts
# that build a kernel do not, so this is what keeps them in step with the parser).
SHOWN = ["README.md", "docs/getting-started.md",
         *sorted(f"docs/guides/{p.name}" for p in (ROOT / "docs" / "guides").glob("*.md"))]


@pytest.mark.parametrize("page", SHOWN)
def test_commands_shown_parse(page: str) -> None:
    parser = build_parser()
    commands = shown_commands((ROOT / page).read_text())
    assert commands, page
    for line in commands:
        argv = [w for word in shlex.split(line)[1:] for w in ((word, word) if "*" in word else (word,))]  # a glob: 2
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                parser.parse_args(argv)
        except SystemExit as e:
            assert not e.code, f"{page}: {line}: {err.getvalue().strip().splitlines()[-1]}"


def test_shown_commands_are_found() -> None:
    page = "```sh\nlabctl up a.yaml   # a comment\n```\n```console\n$ (sleep 1; labctl exec l a -- true) & labctl " \
           "capture l a eth1 -w - | tcpdump -r -\n```\nlabctl prose\n"
    assert shown_commands(page) == ["labctl up a.yaml", "labctl exec l a -- true", "labctl capture l a eth1 -w -"]


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _parsers(sub)
    return out


def test_every_command_help_prints() -> None:
    parsers = _parsers(build_parser())
    assert len(parsers) > 30
    for parser in parsers:
        assert parser.prog in parser.format_help()


def test_every_example_is_in_the_reference_and_the_man_page() -> None:
    from labctl.cli.examples import EXAMPLES

    gen = _gen()
    commands, man = gen.commands_page(), gen.man_page()
    for example in EXAMPLES.values():
        assert f"Example: `{example}`" in commands, example
        assert gen._roff(example) in man, example


def test_the_site_builds_strict_and_fetches_nothing_when_viewed(tmp_path: Path) -> None:
    """mkdocs build --strict (a broken link or anchor fails it); the pages load no script, style
    sheet or font from the network (theme.font: false, no plugin that downloads)."""
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr
    pages = list(site.rglob("*.html"))
    assert len(pages) > 25
    remote = re.compile(r'<(script|img|iframe)[^>]*\ssrc="(https?:)?//|<link[^>]*\shref="(https?:)?//[^"]*"[^>]*>')
    for page in pages:
        text = page.read_text()
        loads = [m.group(0) for m in remote.finditer(text) if "stylesheet" in m.group(0) or m.group(1)]
        assert not loads, f"{page.relative_to(site)} fetches {loads}"
        assert "fonts.googleapis" not in text and "fonts.gstatic" not in text, page


def test_readme_is_a_front_door() -> None:
    """README.md: at most 300 lines, its first commands are the setup and the test command (.ci/run runs
    the latter), and each of its links to the repository's files (docs pages, images) exists."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    first = text.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert first == ["bash setup.sh && labctl up labs/quickstart.yaml", "bash setup.sh && .venv/bin/python -m pytest"]
    assert ".venv/bin/python -m pytest" in (ROOT / ".ci" / "run").read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert len(links) > 20
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
