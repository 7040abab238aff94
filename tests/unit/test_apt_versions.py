"""Debian's archive moves: every package labctl fetches is asked for by its exact version, and a
version the archive no longer carries is an error that says what it has (exit 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import labctl.kernel.prepare as prep
from labctl.errors import ImageError
from labctl.image import apt
from labctl.image.recipe import load_recipe
from labctl.lab.kernels import debian

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "apt"


def test_the_policy_table_lists_every_version_newest_first() -> None:
    # Recorded on 2026-12-01, the day 6.1.192-3 arrived beside the kernel's 6.1.192-2.
    text = (FIXTURES / "policy-moved.txt").read_text()
    assert apt.parse_policy(text) == ["6.1.192-3", "6.1.192-2", "6.1.192-1", "6.1.190-1", "6.1.187-1",
                                      "6.1.176-1", "6.1.170-3"]


def test_an_installed_version_is_listed_once_and_only_fetchable_sources_count() -> None:
    text = (FIXTURES / "policy-installed.txt").read_text()
    assert apt.parse_policy(text) == ["6.1.192-2"] and apt._fetchable(text, "6.1.192-2")
    only_installed = text.split("        500 ")[0] + "        100 /var/lib/dpkg/status\n"
    assert apt.parse_policy(only_installed) == ["6.1.192-2"] and not apt._fetchable(only_installed, "6.1.192-2")


def test_a_version_gone_from_the_archive_says_what_it_has(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LABCTL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(apt, "versions", lambda package: ["6.1.192-3", "6.1.192-1"])
    with pytest.raises(ImageError, match=r"no longer carries linux-source-6.1 6.1.192-2 \(it has 6.1.192-3, "
                                         r"6.1.192-1\)") as err:
        apt.apt_download("linux-source-6.1", "6.1.192-2")
    assert err.value.exit_code == 3 and err.value.hint and "apt-get update" in err.value.hint


def test_a_downloaded_version_is_found_without_asking_the_archive(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    monkeypatch.setenv("LABCTL_CACHE_DIR", str(tmp_path))
    kept = apt.downloads_dir() / "linux-source-6.1_6.1.192-2_amd64.deb"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"deb")
    monkeypatch.setattr(apt, "versions", lambda package: [])  # gone from the archive since
    assert apt.apt_download("linux-source-6.1", "6.1.192-2") == kept
    with pytest.raises(ImageError, match="no longer carries"):
        apt.apt_download("linux-source-6.1", "6.1.192-3")


@pytest.mark.parametrize("name", ["-oDir::Cache::pkgcache=/root/x", "/root/r", "../x", "Linux", "a"])
def test_a_package_name_is_data_never_an_option_or_a_path(name: str) -> None:
    with pytest.raises(ImageError, match="is not a Debian package's name"):
        apt.check_name(name)
    with pytest.raises(ImageError, match="is not a Debian version"):
        apt.check_name("linux-source-6.1", "-oAPT::x=1")


def _archive(monkeypatch: pytest.MonkeyPatch, abis: dict[str, list[str]]) -> None:
    """An archive that carries these kernel packages (``linux-image-ABI-FLAVOUR-unsigned``: versions)."""
    def newest(line: str, flavour: str) -> str | None:
        numbers = [int(p.split("-")[3]) for p, have in abis.items() if p.startswith(f"linux-image-{line}-") and have]
        return f"{line}-{max(numbers)}" if numbers else None

    monkeypatch.setattr(apt, "versions", lambda package: abis.get(package, []))
    monkeypatch.setattr(apt, "newest_abi", newest)


def test_the_default_image_follows_its_line_once_the_pinned_abi_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = load_recipe("debian-12")
    pinned = recipe.kernel_release
    _archive(monkeypatch, {recipe.kernel_package: ["6.1.192-2"]})
    assert recipe.kernel_today() == (pinned, None)
    line = recipe.kernel_abi.rsplit("-", 1)[0]
    newer = f"{line}-{int(recipe.kernel_abi.rsplit('-', 1)[1]) + 1}"
    _archive(monkeypatch, {f"linux-image-{newer}-amd64-unsigned": ["6.1.193-1"]})
    release, why = recipe.kernel_today()
    assert release == f"{newer}-amd64" and why and pinned in why and release in why


def test_a_kernel_prepared_before_outlives_its_abi_in_the_archive(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    monkeypatch.setenv("LABCTL_CACHE_DIR", str(tmp_path))
    spec = debian("debian:6.1.0-56-amd64")
    package, _dbg = prep.debian_packages(spec)
    monkeypatch.setattr(prep, "candidate", lambda p: None)
    assert prep.debian_version(spec) is None and prep.check(spec) is not None
    done = prep.kernels_root() / "0123456789abcdef"
    done.mkdir(parents=True)
    (done / "manifest.json").write_text(json.dumps({"debian": {"package": package, "version": "6.1.192-2"}}))
    assert prep.debian_version(spec) == "6.1.192-2" and prep.check(spec) is None
    monkeypatch.setattr(prep, "candidate", lambda p: "6.1.192-3")  # the archive's own wins while it has one
    assert prep.debian_version(spec) == "6.1.192-3"


def test_the_source_of_a_kernel_is_its_own_version_or_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    from labctl.kernel.cached import Kernel

    monkeypatch.setenv("LABCTL_CACHE_DIR", str(tmp_path))
    kdir = tmp_path / "k"
    kdir.mkdir()
    kernel = Kernel(kdir, {"release": "6.1.0-56-amd64", "source": {"kind": "debian"},
                           "debian": {"package": "linux-image-6.1.0-56-amd64-unsigned", "version": "6.1.192-2"}})
    asked: list[tuple[str, str]] = []

    def download(package: str, version: str) -> Path:
        asked.append((package, version))
        raise ImageError(f"the archive no longer carries {package} {version} (it has 6.1.192-3)")

    monkeypatch.setattr(prep, "apt_download", download)
    with pytest.raises(ImageError, match="no longer carries linux-source-6.1 6.1.192-2") as err:
        prep.add_source(kernel)
    assert asked == [("linux-source-6.1", "6.1.192-2")] and err.value.exit_code == 3
