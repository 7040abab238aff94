"""labctl.state.rundir: the lab name that names one directory under the labs root, and the labs root
checked before anything in it is trusted (exec reads a lab's state from here before anything else)."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.errors import UnsafePath, UsageError
from labctl.state.rundir import check_lab_name, labs_root, run_dir


@pytest.mark.parametrize("name", ["one", "lab-2", "class1@ann", "a" * 8])
def test_a_lab_name_or_an_instance_names_a_directory(name: str) -> None:
    assert check_lab_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "/tmp", "one/../two", "one/", "one@", "@ann", "one@ann@bob",
                                  "one\n", "one two", "one/x", "../one"])
def test_anything_else_is_refused_whole(name: str) -> None:
    # a valid start is not enough: the whole word is the name ("one/../two" begins like one)
    with pytest.raises(UsageError, match="invalid lab name"):
        check_lab_name(name)


def test_the_run_directory_is_under_a_labs_root_nobody_else_can_write(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "s"
    (state / "labs").mkdir(parents=True)
    state.chmod(0o700)
    (state / "labs").chmod(0o700)
    monkeypatch.setenv("LABCTL_STATE_DIR", str(state))
    assert labs_root() == state / "labs" and run_dir("one") == state / "labs" / "one"
    (state / "labs").chmod(0o777)  # anyone could have put a lab there
    try:
        with pytest.raises(UnsafePath):
            run_dir("one")
    finally:
        (state / "labs").chmod(0o700)
