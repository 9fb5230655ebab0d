"""Text sources: each yields the answer's text as it is written (deltas). What a source can do
besides (take the client's text, say why it ended, ...) its kind declares in
`gateway.sources.registry`."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol


class TextSource(Protocol):
    """Streams one answer's text. Closing the generator closes the upstream."""

    def stream(self) -> AsyncGenerator[str]: ...
