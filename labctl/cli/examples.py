"""One example line for each command's ``--help`` (and the generated command reference)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

EXAMPLES: dict[str, str] = {
    "validate": "labctl validate labs/quickstart.yaml",
    "up": "labctl up labs/quickstart.yaml",
    "down": "labctl down quickstart",
    "status": "labctl status --json",
    "run": "labctl run labs/nic-driver-cost.yaml --junit results.xml",
    "report": "labctl report runs/nic-driver-cost-20261127-101500",
    "bundle": "labctl bundle runs/nic-driver-cost-20261127-101500 -o run.tar.gz",
    "compare": "labctl compare runs/lab-20261127-101500 runs/lab-20261127-113000",
    "pack": "labctl pack runs/lab-20261127-101500 -o bug.labpack",
    "cache": "labctl cache prune",
    "bisect": "labctl bisect lab.yaml --tree ~/linux --good v6.1 --bad HEAD --check reaches-b",
    "oops": "labctl oops decode --kernel debian:6.1.0-56-amd64 console.log",
    "gdb": "labctl gdb quickstart a",
    "replay": "labctl replay runs/oops-buggy-driver-20250101-120000 victim",
    "drgn": "labctl drgn quickstart a -c \"print(prog['init_net'].loopback_dev.name)\"",
    "dump": "labctl dump quickstart a -o a.vmcore",
    "doctor": "labctl doctor",
    "ssh": "labctl ssh quickstart c",
    "exec": "labctl exec quickstart a -- ping -c 3 10.10.0.3",
    "cp": "labctl cp quickstart a:/var/log/syslog .",
    "check": "labctl check quickstart --json",
    "ssh-config": "labctl ssh-config quickstart >> ~/.ssh/config",
    "class": "labctl class up course.yaml --roster students.txt --out handouts",
    "capture": "labctl capture quickstart a eth1 -w - | tcpdump -r -",
    "follow": "labctl follow rtlab 'icmp or udp port 9' -c 5",
    "impair": "labctl impair quickstart a eth1 --delay 20ms --loss 1%",
    "link": "labctl link quickstart a eth1 down",
    "graph": "labctl graph labs/quickstart.yaml -o quickstart.svg",
    "image": "labctl image build debian-12",
    "kernel": "labctl kernel list",
    "reset": "labctl reset quickstart a",
    "checkpoint": "labctl checkpoint save quickstart before-exercise",
    "snapshot": "labctl snapshot list",
    "serve": "labctl serve --listen 127.0.0.1:8080",
    "completion": "labctl completion bash > /etc/bash_completion.d/labctl",
}


def add_examples(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Each registered command's example as its help's last line."""
    for word, parser in sub.choices.items():
        if word in EXAMPLES:
            parser.epilog = f"example: {EXAMPLES[word]}"
