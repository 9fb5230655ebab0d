"""Which voice a request names, resolved once for every route before any stream starts.

A name the model servers have is theirs. OpenAI's voice names (which the frameworks' OpenAI
classes send, `alloy` by default) map through `--openai-voices` over `NAMESAKES`, Kokoro's
voice of the same name; one whose voice is not loaded speaks with the default voice. Any other
name is `400 unknown_voice`, naming the voices there are, before a reply is admitted: never a
200 with an empty body or an in-band error. The model servers' voices are asked at most every
`refresh_s`; while they cannot be asked, names pass through (the model server then decides).
`GET /v1/voices` (a page's picker) is the same answer: the last one the servers gave, so a
server slow to answer for a moment does not empty the picker; of it, the names and sources
only, never a path on the servers' machines (`public_listing`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

from gateway.errors import BadRequest, UpstreamError

# OpenAI's text-to-speech voices, as its API lists them
OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "cedar",
    "coral",
    "echo",
    "fable",
    "marin",
    "nova",
    "onyx",
    "sage",
    "shimmer",
    "verse",
)
# Kokoro-82M's voices of the same name (American and British English packs)
NAMESAKES = {
    "alloy": "af_alloy",
    "echo": "am_echo",
    "fable": "bm_fable",
    "nova": "af_nova",
    "onyx": "am_onyx",
}


def parse_table(value: str) -> dict[str, str]:
    """`--openai-voices` (`alloy=af_heart,echo=am_adam`) over `NAMESAKES`; ValueError for a
    name that is not OpenAI's or an entry that is not `name=voice`."""
    table = dict(NAMESAKES)
    for item in filter(None, (i.strip() for i in value.split(","))):
        name, sep, voice = item.partition("=")
        name, voice = name.strip(), voice.strip()
        if not sep or not voice:
            raise ValueError(f"--openai-voices: {item!r} is not name=voice")
        if name not in OPENAI_VOICES:
            raise ValueError(f"--openai-voices: {name!r} is not one of OpenAI's voices")
        table[name] = voice
    return table


def public_listing(body: Mapping[str, Any]) -> dict[str, Any]:
    """`GET /v1/voices`' answer from the model servers' `GET /voices`: the default voice and
    each voice's name and source, a directory named by its last part only (never a path on
    their machines); what is not theirs to say is left out."""
    voices: list[dict[str, str]] = []
    listed = body.get("voices")
    for voice in listed if isinstance(listed, list) else []:
        if isinstance(voice, dict) and isinstance(voice.get("name"), str):
            entry = {"name": voice["name"]}
            if isinstance(voice.get("source"), str):
                entry["source"] = _without_path(voice["source"])
            voices.append(entry)
    default = body.get("default")
    return (
        {"default": default, "voices": voices} if isinstance(default, str) else {"voices": voices}
    )


def _without_path(source: str) -> str:
    """`/srv/voices` as `voices`; a hub's `REPO@COMMIT` or a package's name as it is."""
    if source.startswith(("/", "~", "\\")) or PureWindowsPath(source).drive:
        return PureWindowsPath(source).name if "\\" in source else PurePosixPath(source).name
    return source


@dataclass
class VoiceCatalog:
    fetch: Callable[[], Awaitable[dict[str, Any]]]  # the model servers' GET /voices
    table: Mapping[str, str] = field(default_factory=lambda: dict(NAMESAKES))
    refresh_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    _known: frozenset[str] | None = None
    _listing: dict[str, Any] | None = None  # their last readable answer
    _asked_at: float = -1e9

    async def known(self) -> frozenset[str] | None:
        """The model servers' voices (None: not known: they cannot be asked, or do not say)."""
        if self._due():
            with contextlib.suppress(UpstreamError):
                await self._ask()
        return self._known

    async def listing(self) -> dict[str, Any]:
        """`GET /v1/voices`: the servers' last answer, asked again every `refresh_s`; the
        servers' error (UpstreamError) only while they have never answered."""
        if self._listing is not None and not self._due():
            return self._listing
        try:
            answer = await self._ask()
        except UpstreamError:
            if self._listing is None:
                raise
            return self._listing  # what they said last, while they cannot be asked
        return answer if self._listing is None else self._listing  # unreadable: as it came

    def _due(self) -> bool:
        return self.clock() - self._asked_at >= self.refresh_s

    async def _ask(self) -> dict[str, Any]:
        self._asked_at = self.clock()
        body = await self.fetch()
        try:
            names = frozenset(str(v["name"]) for v in body.get("voices", []))
        except (KeyError, TypeError, AttributeError):
            return body  # unreadable: what was known stands
        self._known = names or None  # SageMaker's endpoint lists none: not known
        self._listing = body
        return body

    async def resolve(self, requested: str | None) -> str | None:
        """The voice to ask the model server for (None: its default)."""
        if requested is None:
            return None
        known = await self.known()
        if known is not None and requested in known:
            return requested
        if requested in OPENAI_VOICES:
            mapped = self.table.get(requested)
            return mapped if mapped is not None and known is not None and mapped in known else None
        if known is None:
            return requested
        raise BadRequest(
            f"voice {requested!r} is not served here: use one of {', '.join(sorted(known))}, "
            f"or an OpenAI voice name ({', '.join(OPENAI_VOICES)})",
            code="unknown_voice",
        )
