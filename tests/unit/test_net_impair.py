"""Impairments: the values a lab file, a step and ``labctl impair`` may give, and the netem commands they become."""

from __future__ import annotations

import shlex

import pytest

from labctl.cli.main import build_parser
from labctl.errors import UsageError
from labctl.lab import load_lab_text
from labctl.lab.impair import Impairment, parse_impairment, parse_percent, parse_rate, parse_time
from labctl.lab.netopts import render_impairment
from labctl.net.netem import apply_command, netem_argv


@pytest.mark.parametrize("text, canonical", [("20ms", "20ms"), ("0.5ms", "0.5ms"), ("250us", "250us"),
                                             ("1s", "1s"), (" 020.50ms ", "20.5ms"), ("60s", "60s")])
def test_times_in_tc_units(text: str, canonical: str) -> None:
    assert parse_time(text) == canonical


@pytest.mark.parametrize("value", [20, "20", "20 min", "61s", "-1ms", True, None, "1e3ms"])
def test_bad_times(value: object) -> None:
    with pytest.raises(ValueError):
        parse_time(value)


def test_percentages_need_their_sign_except_zero() -> None:
    assert [parse_percent(v) for v in ("1%", "0.1%", "100%", 0, "0%")] == ["1%", "0.1%", "100%", "0%", "0%"]
    for bad in (0.5, "0.5", "101%", "-1%", False):
        with pytest.raises(ValueError):
            parse_percent(bad)


def test_rates_bits_and_bytes() -> None:
    assert [parse_rate(v) for v in ("10mbit", "512KBIT", "1mbps", "1kbit", "100gbit")] == \
        ["10mbit", "512kbit", "1mbps", "1kbit", "100gbit"]
    for bad in ("10", "10 mbits", "999bit", "101gbit", 10):
        with pytest.raises(ValueError):
            parse_rate(bad)


def test_jitter_and_reorder_need_a_delay() -> None:
    imp, problems = parse_impairment({"jitter": "5ms", "reorder": "5%", "loss": "1%"})
    assert [k for k, _ in problems] == ["jitter", "reorder"]
    imp, problems = parse_impairment({"delay": "20ms", "jitter": "5ms", "reorder": "5%"})
    assert problems == [] and imp.describe() == "delay 20ms ± 5ms, reorder 5%"


def test_netem_command_has_every_value_quoted() -> None:
    imp = Impairment.from_dict({"delay": "20ms", "jitter": "5ms", "loss": "1%", "duplicate": "0.1%",
                                "corrupt": "0.1%", "reorder": "5%", "rate": "10mbit", "limit": 5000})
    assert netem_argv("eth1", imp) == ["tc", "qdisc", "replace", "dev", "eth1", "root", "netem", "limit", "5000",
                                       "delay", "20ms", "5ms", "loss", "1%", "duplicate", "0.1%", "corrupt",
                                       "0.1%", "reorder", "5%", "rate", "10mbit"]
    assert shlex.split(apply_command("eth1", imp)) == netem_argv("eth1", imp)
    clear = apply_command("we ird", None)
    assert "tc qdisc del dev 'we ird' root" in clear and apply_command("we ird", Impairment()) == clear


def test_lab_nic_impairment_is_in_the_model() -> None:
    lab = load_lab_text("name: l\nnetworks: {n: {}}\nguests:\n  a:\n    nics:\n"
                        "      - {name: eth1, model: e1000, network: n, impair: {delay: 20ms, loss: 1%}}\n", "l.yaml")
    nic = lab.guests["a"].nic("eth1")
    assert nic.impair == Impairment(delay="20ms", loss="1%")
    assert lab.to_dict()["guests"]["a"]["nics"][0]["impair"] == {"delay": "20ms", "loss": "1%"}


def test_step_impairment_rendered_per_row_and_checked_again() -> None:
    lab = load_lab_text("""name: l
networks: {n: {}}
guests:
  a: {nics: [{name: eth1, model: e1000, network: n}]}
steps:
  - name: s
    matrix: [{label: x, loss: 5%, lim: 10}]
    impair: {a.eth1: {loss: "{{loss}}", limit: "{{lim}}"}}
    run: [{guest: a, command: "true"}]
""", "l.yaml")
    (spec,) = lab.steps[0].impair
    assert render_impairment(spec, lambda t: t.replace("{{loss}}", "7%").replace("{{lim}}", "10")) == \
        Impairment(loss="7%", limit=10)
    with pytest.raises(ValueError):
        render_impairment(spec, lambda t: t.replace("{{loss}}", "170%").replace("{{lim}}", "10"))


def test_labctl_impair_refuses_bad_values_before_anything(tmp_path: object) -> None:
    from labctl.cli.impair_cmd import _requested

    args = build_parser().parse_args(["impair", "lab", "a", "eth1", "--loss", "2"])
    with pytest.raises(UsageError, match="--loss: expected a percentage"):
        _requested(args)
    args = build_parser().parse_args(["impair", "lab", "a", "eth1", "--clear", "--delay", "1ms"])
    with pytest.raises(UsageError, match="--clear"):
        _requested(args)
    args = build_parser().parse_args(["impair", "lab", "a", "eth1", "--delay", "50ms", "--jitter", "5ms"])
    assert _requested(args) == Impairment(delay="50ms", jitter="5ms")
    assert _requested(build_parser().parse_args(["impair", "lab", "a", "eth1"])) is None
