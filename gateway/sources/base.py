from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol


class TextSource(Protocol):
    """Streams one answer's text. Closing the iterator closes the upstream."""

    def stream(self) -> AsyncIterator[str]: ...
