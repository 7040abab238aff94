"""What one guest's checks share as they run in order (:class:`GuestChecks`): one SSH session, one
drgn session on its running kernel, the clock. Each kind of check runs on it (:mod:`.shell`,
:mod:`.drgncheck`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from labctl.ssh import Endpoint, Session
from labctl.state import LabState

if TYPE_CHECKING:
    from labctl.inspect import KernelView

CONNECT_TIMEOUT = 10.0


def connect_session(ep: Endpoint) -> Session:
    return Session(ep, timeout=CONNECT_TIMEOUT)


@dataclass
class GuestChecks:
    """What one guest's checks share as they run in order: one SSH session (a new one after an
    error), one drgn session on its kernel (opened for its first drgn check), the clock."""

    state: LabState
    guest: str
    connect: Callable[[Endpoint], Session] = connect_session
    clock: Callable[[], float] = time.monotonic
    _session: Session | None = None
    _kernel: KernelView | None = None
    _open: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def session(self) -> Session:
        """The guest's SSH session. :raise GuestError, LabStateError: when it cannot be opened."""
        if self._session is None:
            self._session = self.connect(self.state.endpoint(self.guest))
        return self._session

    def drop_session(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def kernel(self) -> KernelView:
        """drgn on the guest's running kernel. :raise LabctlError: when it cannot be read."""
        if self._kernel is None:
            from labctl.inspect import open_live

            self._kernel = self._open.enter_context(open_live(self.state, self.guest))
        return self._kernel

    def close(self) -> None:
        self.drop_session()
        self._kernel = None
        self._open.close()
