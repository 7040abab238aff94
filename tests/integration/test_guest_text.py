"""A real guest's text on the host's terminal, and ``exec``'s own options (security issue 19, items 8 and 10).

One guest: ``exec LAB G --timeout S -- CMD`` runs CMD alone (the guest used to get
``--timeout S -- CMD``: ``bash: --: invalid option``), a command's own ``--`` reaches it, and
its output comes back byte for byte (the user's own command, as with ssh). Then the guest
writes an oops headline with an OSC (terminal title) and ``ESC [2J`` (clear screen) to its
kernel log; ``labctl oops decode`` of its real console shows them as ``\\x1b`` escapes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.conftest import Cli
from tests.integration.conftest import qemu_pids_under

LAB = """\
name: guesttext
networks: {}
guests:
  g: {}
"""

HOSTILE = r"BUG: kernel NULL pointer dereference, address: \033]0;pwned\007\033[2Jafter"
SHOWN = "BUG: kernel NULL pointer dereference, address: \\x1b]0;pwned\\x07\\x1b[2Jafter"


def raw_controls(text: str) -> set[str]:
    return {f"{ord(c):#x}" for c in text if (ord(c) < 0x20 and c not in "\t\n") or 0x7F <= ord(c) <= 0x9F}


def test_exec_options_passthrough_and_a_hostile_console(cli: Cli, image: object, tmp_path: Path) -> None:
    lab = tmp_path / "guesttext.yaml"
    lab.write_text(LAB)
    status = json.loads(cli("up", str(lab), "--accel", "tcg", "--json", timeout=900, check=True).stdout)
    try:
        # exec's --timeout is exec's; the command's own -- and options are the command's.
        res = cli("exec", "guesttext", "g", "--timeout", "120", "--", "echo", "--", "-x")
        assert (res.returncode, res.stdout) == (0, "-- -x\n"), res.stderr
        assert "invalid option" not in res.stderr
        res = cli("exec", "guesttext", "g", "--timeout=120", "--", "sh", "-c", r"printf '\033[2J'; exit 5")
        assert (res.returncode, res.stdout) == (5, "\x1b[2J")  # the user's own output: passed through as is
        res = cli("exec", "guesttext", "g", "--timeout", "nope", "--", "true")
        assert res.returncode == 2 and "not a number of seconds" in res.stderr

        # The guest writes a hostile oops headline to its kernel log (and so to its console).
        cli("exec", "guesttext", "g", "--", "sh", "-c", f"printf '<2>{HOSTILE}\\n' > /dev/kmsg", check=True)
        console = Path(status["run_dir"]) / "guests" / "g" / "console.log"
        deadline = time.monotonic() + 60
        while b"pwned" not in console.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert b"\x1b]0;pwned\x07\x1b[2Jafter" in console.read_bytes()  # the console holds it raw
        res = cli("oops", "decode", str(console), timeout=600)
        assert res.returncode == 0, res.stderr
        assert not raw_controls(res.stdout + res.stderr), res.stdout + res.stderr
        assert SHOWN in res.stdout, res.stdout
        decoded = json.loads(cli("oops", "decode", str(console), "--json", timeout=600, check=True).stdout)
        assert decoded[0]["headline"].endswith("\x1b]0;pwned\x07\x1b[2Jafter")  # JSON keeps it exact
    finally:
        down = cli("down", "guesttext")
    assert down.returncode == 0, down.stderr
    assert qemu_pids_under(cli.state_dir) == []
