"""labctl.pack.gitfetch on real git repositories of tmp_path (``git+file://``), its URL form, the rules of a
lab file from a URL or a git repository, and labctl.pack.cache's prune (pins, states of labs up)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from labctl.errors import LabFileError, UsageError
from labctl.lab import load_lab_text
from labctl.pack import cache_entries, fetch_git, git_lab, parse_git_url, prune_cache
from labctl.pack.cache import pin
from labctl.pack.fetch import check_foreign

LAB = """name: fromgit
networks: {}
guests:
  a: {kernel: debian:6.1.0-56-amd64}
steps:
  - name: probe
    run: [{guest: a, command: "true"}]
    trace:
      a:
        bpftrace: {file: BPF}
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    c = tmp_path / "cache"
    monkeypatch.setenv("LABCTL_CACHE_DIR", str(c))
    return c


def _repo(tmp_path: Path, files: dict[str, str], links: dict[str, str] | None = None) -> tuple[str, str]:
    """A bare repository of one commit with ``files`` (and symbolic ``links``); its git+file URL and commit."""
    src = tmp_path / "src"
    src.mkdir()
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    for name, target in (links or {}).items():
        os.symlink(target, src / name)
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(src)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(tmp_path / "repo.git")], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    return f"git+file://{tmp_path}/repo.git", commit


@pytest.mark.parametrize(("url", "repo", "rev", "path"), [
    ("git+https://example.org/r.git#labs/a.yaml", "https://example.org/r.git", None, "labs/a.yaml"),
    ("git+https://example.org/r.git@v1.0#a.yaml", "https://example.org/r.git", "v1.0", "a.yaml"),
    ("git+ssh://git@example.org/org/r.git@feature/x#a.labpack", "ssh://git@example.org/org/r.git", "feature/x",
     "a.labpack"),
    ("git://127.0.0.1:9418/r.git@" + "a" * 40 + "#l.yaml", "git://127.0.0.1:9418/r.git", "a" * 40, "l.yaml"),
    ("git+file:///srv/labs.git#x.yaml", "file:///srv/labs.git", None, "x.yaml"),
])
def test_a_git_url_is_taken_apart(url: str, repo: str, rev: str | None, path: str) -> None:
    src = parse_git_url(url)
    assert (src.repo, src.rev, src.path) == (repo, rev, path)
    assert parse_git_url(src.label("b" * 40)).rev == "b" * 40


@pytest.mark.parametrize(("url", "why"), [
    ("git+https://example.org/r.git", "no path of a file"),
    ("git+https://example.org/r.git#/etc/passwd", "not a path in the repository"),
    ("git+https://example.org/r.git#a/../../x", "not a path in the repository"),
    ("git+https://u:secret@example.org/r.git#a", "no user name or password"),
    ("git+https://token@example.org/r.git#a", "no user name or password"),
    ("git+https://example.org/r.git@-upload-pack=x#a", "not a branch, a tag or a commit id"),
    ("git+https://example.org/r.git@a..b#a", "not a branch, a tag or a commit id"),
    ("git+https://example.org/r.git?x=1#a", "takes no query"),
    ("git+file://otherhost/srv/r.git#a", "names a directory of this host"),
    ("git+ftp://example.org/r.git#a", "not a git URL"),
])
def test_a_bad_git_url_is_refused(url: str, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        parse_git_url(url)


def test_a_lab_from_git_is_its_tree_s_regular_files_at_a_commit(cache: Path, tmp_path: Path) -> None:
    url, commit = _repo(tmp_path, {"labs/one.yaml": LAB.replace("BPF", "probe.bt"), "labs/probe.bt": "BEGIN { exit(); }\n",
                                   "labs/run.sh": "#!/bin/sh\n"}, {"labs/passwd.bt": "/etc/passwd"})
    os.chmod(tmp_path / "src" / "labs" / "run.sh", 0o755)
    out = fetch_git(parse_git_url(f"{url}#labs/one.yaml"))
    assert out.commit == commit and out.root == cache / "git" / out.root.parent.parent.name / "trees" / commit
    assert sorted(p.name for p in out.file.parent.iterdir()) == ["one.yaml", "probe.bt", "run.sh"]  # no link
    assert not any(p.stat().st_mode & 0o111 for p in out.root.rglob("*") if p.is_file())
    lab = git_lab(out)
    assert lab.source == f"{url}@{commit}#labs/one.yaml"
    assert lab.steps[0].trace["a"].bpftrace is not None and "BEGIN" in lab.steps[0].trace["a"].bpftrace.script
    assert fetch_git(parse_git_url(f"{url}@{commit}#labs/one.yaml")).root == out.root  # by commit id, once
    os.rename(tmp_path / "repo.git", tmp_path / "gone.git")  # the pinned URL again, offline
    assert fetch_git(parse_git_url(out.label)).root == out.root
    with pytest.raises(UsageError, match="git could not fetch HEAD"):
        fetch_git(parse_git_url(f"{url}#labs/one.yaml"))
    os.rename(tmp_path / "gone.git", tmp_path / "repo.git")
    with pytest.raises(UsageError, match=f"no file labs/passwd.bt in .* at commit {commit}; nothing started"):
        fetch_git(parse_git_url(f"{url}@main#labs/passwd.bt"))
    with pytest.raises(UsageError, match="git could not fetch nosuch"):
        fetch_git(parse_git_url(f"{url}@nosuch#labs/one.yaml"))


def test_a_lab_from_git_names_nothing_of_this_host(cache: Path, tmp_path: Path) -> None:
    url, _ = _repo(tmp_path, {"outside.yaml": LAB.replace("BPF", "/etc/hostname"),
                              "tree.yaml": LAB.replace("debian:6.1.0-56-amd64", "{tree: .}").replace("BPF", "p.bt"),
                              "p.bt": "BEGIN {}\n", "bad.yaml": "name: x\nguests: {a: {memory: lots}}\n"})
    with pytest.raises(LabFileError, match=r"bpftrace.file: bpftrace file /etc/hostname is not trusted: a lab file "
                                           r"from git\+file://.* may not name a path of this host"):
        git_lab(fetch_git(parse_git_url(f"{url}#outside.yaml")))  # refused by the loader, before it is read
    with pytest.raises(UsageError, match=r"guests.a.kernel: tree .*/trees/"):
        git_lab(fetch_git(parse_git_url(f"{url}#tree.yaml")))
    with pytest.raises(LabFileError) as err:
        git_lab(fetch_git(parse_git_url(f"{url}#bad.yaml")))
    assert all(p.file.startswith(url + "@") and p.file.endswith("#bad.yaml") for p in err.value.problems)


def test_a_lab_from_an_http_url_names_no_bpftrace_file(tmp_path: Path) -> None:
    lab = load_lab_text(LAB.replace("BPF", "/etc/hostname"), "http://example.org/lab.yaml")
    with pytest.raises(UsageError, match="bpftrace.file: /etc/hostname"):
        check_foreign(lab, "http://example.org/lab.yaml")


def test_prune_keeps_what_is_pinned_or_named_by_a_lab_up(cache: Path, tmp_path: Path) -> None:
    for p in ("packs/aaaa/lab/lab.yaml", "packs/bbbb/lab/lab.yaml", "packs/cccc/x", "images/debian-12/pack-dd/rootfs.img",
              "images/debian-12/0123/rootfs.img", "fetched/eeee"):
        (cache / p).parent.mkdir(parents=True, exist_ok=True)
        (cache / p).write_bytes(b"x" * 5000)
    (cache / "git" / "ffff").mkdir(parents=True)
    (cache / "git" / "ffff" / "url").write_text("https://example.org/r.git\n")
    assert {e.kind for e in cache_entries()} == {"pack", "pack image", "fetched", "git"}
    pin(cache / "packs" / "cccc")  # a labctl (this process) uses it
    state = (f'{{"source": "https://example.org/r.git@{"1" * 40}#l.yaml", '
             f'"image": {{"dir": "{cache}/images/debian-12/pack-dd"}}, "x": "{cache}/packs/aaaa/lab/lab.yaml"}}')
    removed, kept = prune_cache([state])
    assert sorted(e.path.name for e in removed) == ["bbbb", "eeee"]
    assert sorted(e.path.name for e in kept) == ["aaaa", "cccc", "ffff", "pack-dd"]
    assert (cache / "images" / "debian-12" / "0123").is_dir()  # a built image: image prune's
    removed, _ = prune_cache([])
    assert sorted(e.path.name for e in removed) == ["aaaa", "ffff", "pack-dd"]  # still pinned: cccc


def test_prune_keeps_an_entry_whose_file_a_running_process_has_open(cache: Path, tmp_path: Path) -> None:
    """A pack's image whose root file system a QEMU reads (through a guest's overlay), as a real process
    holding it open: kept while it runs, removed once it has ended; a pack beside it nothing holds is removed."""
    import sys

    disk = cache / "images" / "debian-12" / "pack-dd" / "rootfs.img"
    disk.parent.mkdir(parents=True)
    disk.write_bytes(b"x" * 5000)
    (cache / "packs" / "bbbb" / "lab").mkdir(parents=True)
    (cache / "packs" / "bbbb" / "lab" / "lab.yaml").write_text("name: b\n")
    hold = "import sys; f = open(sys.argv[1], 'rb'); print('open', flush=True); sys.stdin.read()"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(disk)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        removed, kept = prune_cache([])
        assert [e.path.name for e in removed] == ["bbbb"] and [(e.kind, e.path) for e in kept] == [
            ("pack image", disk.parent)]
        assert disk.is_file()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    removed, kept = prune_cache([])
    assert [e.path for e in removed] == [disk.parent] and not kept and not disk.parent.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="gives the repository to another user")
def test_a_git_file_repository_of_another_user_is_refused_by_git(cache: Path, tmp_path: Path) -> None:
    url, _ = _repo(tmp_path, {"a.yaml": LAB})
    subprocess.run(["chown", "-R", "nobody", str(tmp_path / "repo.git")], check=True)
    with pytest.raises(UsageError, match="dubious ownership in repository at .*; nothing started"):
        fetch_git(parse_git_url(f"{url}#a.yaml"))


def test_cache_list_and_prune_on_the_command_line(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from labctl.cli.main import main

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setenv("LABCTL_STATE_DIR", str(state))
    (cache / "packs" / "aaaa").mkdir(parents=True)
    (cache / "packs" / "aaaa" / "pack.json").write_bytes(b"x" * 8192)
    assert main(["cache", "list", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["entries"]
    assert entry["kind"] == "pack" and entry["path"] == str(cache / "packs" / "aaaa") and entry["bytes"] >= 8192
    assert main(["cache", "prune", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [e["path"] for e in out["removed"]] == [str(cache / "packs" / "aaaa")] and out["bytes_freed"] >= 8192
    assert main(["cache", "prune"]) == 0 and "nothing to prune" in capsys.readouterr().out
