"""labctl loads only the module of the command it runs: the table of command words in
labctl.cli.main must name exactly what each module registers, and a light command must not pull
in the pipeline."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from labctl.cli.main import COMMANDS, MODULES, _new_parser, build_parser, parser_for


def _words(parser: argparse.ArgumentParser) -> list[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def test_each_module_registers_exactly_its_words() -> None:
    for load, words in MODULES.items():
        p, sub = _new_parser()
        load().register(sub)
        assert tuple(_words(p)) == words, load.__name__


def test_the_whole_parser_has_every_command_once() -> None:
    words = _words(build_parser())
    assert sorted(words) == sorted(COMMANDS) and len(words) == len(set(words))


@pytest.mark.parametrize("argv", [["exec", "lab", "a", "--", "true"], ["--debug", "status"],
                                  ["class", "up", "c.yaml", "--roster", "r.txt", "--out", "o"], ["drgn", "--core", "v", "-c", "1"],
                                  ["down", "--all"], ["image", "list"]])
def test_one_commands_parser_parses_as_the_whole_one(argv: list[str]) -> None:
    lazy, full = vars(parser_for(argv).parse_args(argv)), vars(build_parser().parse_args(argv))
    assert {k: v for k, v in lazy.items() if k != "func"} == {k: v for k, v in full.items() if k != "func"}
    assert lazy["func"].__qualname__ == full["func"].__qualname__


def test_a_light_command_loads_neither_the_pipeline_nor_the_web_server() -> None:
    code = ("import sys\nfrom labctl.cli.main import parser_for\nparser_for(['exec', 'l', 'a', '--', 'true'])\n"
            "print(sorted(m for m in ('labctl.pipeline', 'labctl.web', 'labctl.bisect', 'labctl.report')"
            " if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"


def test_help_and_mistakes_get_the_whole_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parser_for(["exce"]).parse_args(["exce"])
    assert exc.value.code == 2 and "invalid choice: 'exce'" in capsys.readouterr().err
    assert _words(parser_for(["--help"])) == _words(build_parser())


def test_every_command_has_an_example_that_parses() -> None:
    """``labctl COMMAND --help`` ends with an example line; each one is a valid command line."""
    import shlex

    from labctl.cli.examples import EXAMPLES

    assert sorted(EXAMPLES) == sorted(COMMANDS)
    for word, example in EXAMPLES.items():
        argv = shlex.split(example.split(" | ")[0].split(" > ")[0].split(" >> ")[0])[1:]
        assert argv[0] == word, example
        parser_for(argv).parse_args(argv)  # SystemExit (argparse's error) fails the test
        assert parser_for(argv)._subparsers is not None
    assert build_parser().parse_args(["exec", "l", "a", "true"]).command == "exec"


def test_the_top_level_help_lists_what_the_modules_register() -> None:
    """``labctl --help`` is drawn from main.HELP without loading a command's module: the same text."""
    from labctl.cli.main import HELP, help_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert {a.dest: a.help for a in sub._choices_actions} == HELP
    assert help_parser().format_help() == build_parser().format_help()
    assert parser_for(["--help"]).format_help() == build_parser().format_help()
