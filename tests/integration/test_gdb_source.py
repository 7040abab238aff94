"""`labctl image build --with-source`: gdb lists the driver's real source."""

from __future__ import annotations

import pytest

from tests.conftest import Cli

LAB = "name: src\nnetworks: {lan: {}}\nguests:\n  g:\n    nics: [{name: eth1, model: e1000, network: lan, ip: 10.33.0.1/24}]\n"


def test_gdb_lists_kernel_source(cli: Cli, image: object, tmp_path: object) -> None:
    built = cli("image", "build", "--with-source", timeout=1800)
    if built.returncode == 3 and "the archive no longer carries linux-source-" in built.stderr:
        pytest.skip(built.stderr.strip())  # only the archive's own lack: the kernel's source version is gone
    assert built.returncode == 0, built.stderr
    path = cli.state_dir / "src.yaml"
    path.write_text(LAB)
    assert cli("up", str(path), "--accel", "tcg").returncode == 0
    try:
        res = cli("gdb", "src", "g", "--batch", "list e1000_xmit_frame", timeout=300)
        assert res.returncode == 0, res.stderr
        assert "static netdev_tx_t e1000_xmit_frame(struct sk_buff *skb," in res.stdout
    finally:
        cli("down", "src")
