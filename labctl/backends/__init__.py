"""Backends turn a guest plan into a running machine: ``qemu`` (embedded) and ``libvirt``."""

from labctl.backends.base import Backend, GuestPlan, GuestRecord, get_backend

__all__ = ["Backend", "GuestPlan", "GuestRecord", "get_backend"]
