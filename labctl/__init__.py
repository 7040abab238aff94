"""labctl: reproducible kernel-network debugging labs on QEMU guests."""

__version__ = "0.1.0"
