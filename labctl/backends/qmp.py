"""A small synchronous face on ``qemu.qmp`` for labctl's short QMP exchanges.

Every qemu.qmp exception is mapped to :class:`MachineError` here.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from qemu.qmp import QMPClient, QMPError

from labctl.errors import MachineError


def qmp_execute(socket_path: Path | str, command: str, args: dict[str, Any] | None = None,
                timeout: float = 5.0) -> Any:
    """Connect to a QEMU monitor socket, run one command, disconnect.

    :raise MachineError: when the monitor is unreachable, times out, or the
        command fails (the message carries QMP's error class).
    """

    async def go() -> Any:
        client = QMPClient("labctl")
        try:
            await asyncio.wait_for(client.connect(str(socket_path)), timeout)
            return await asyncio.wait_for(client.execute(command, args), timeout)
        finally:
            await client.disconnect()

    try:
        return asyncio.run(go())
    except (QMPError, OSError, asyncio.TimeoutError, EOFError) as exc:
        raise MachineError(f"QMP {command} on {socket_path} failed: {exc or type(exc).__name__}") from exc
