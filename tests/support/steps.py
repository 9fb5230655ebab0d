"""Waiting for a condition in a test without betting on time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(condition: Callable[[], bool], turns: int = 1_000_000) -> None:
    """Let the other tasks run until `condition` holds: a poll of their own progress, turn by
    turn of the event loop (which also polls sockets each turn), not a timing bet."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the tasks never got there")
