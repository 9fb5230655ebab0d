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

A blend (`af_bella(2)+af_sky(1)`, `kokoro_contract.blends`) is checked against the same voices
and sent on by its canonical name; a client may save one under a name of its own
(`SavedBlends`, `POST /v1/voices`), which then names that blend in its requests.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

import redis.asyncio as aioredis

from gateway.errors import BadRequest, UpstreamError
from gateway.fleet.store import Store
from kokoro_contract import blends
from kokoro_contract.errors import InvalidRequest

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


def _checked_blend(blend: str | Sequence[object], known: frozenset[str] | None) -> str:
    """A blend's canonical name, each part one of the servers' voices when they are known
    (else the model server checks them); its refusal as a 400 with the contract's code."""
    try:
        if known is None:
            return blends.parse_blend(blend).name
        return blends.check_blend(blend, known)
    except InvalidRequest as exc:
        raise BadRequest(exc.message, code=exc.code) from None


# a saved blend's (or lexicon's) name: what a voice's name looks like, never a blend's spelling
SAVED_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")


class SavedBlends:
    """Each client's named blends (`POST /v1/voices`), at most `per_client` each and `total`
    held by this gateway in all (anonymous clients are each address: without a bound, many
    addresses could fill memory): a name the client then asks for as a voice speaks that
    blend. A fleet (`store`) shares them through Redis (a hash per client); while Redis does
    not answer, a gateway reads and saves its own, and writes what was saved through it back
    when Redis answers again (where the name is not taken meanwhile)."""

    def __init__(
        self, per_client: int = 50, total: int = 10_000, store: Store | None = None
    ) -> None:
        self.per_client = per_client
        self.total = total
        self.store = store
        self._by_client: dict[str, dict[str, str]] = {}  # saved through this gateway
        self._count = 0
        if store is not None:
            store.on_rejoin.append(self._write_back)

    async def of(self, client: str) -> dict[str, str]:
        """The client's saved blends, name -> canonical blend: the fleet's when Redis
        answers, else those saved through this gateway."""
        if self.store is not None:
            key = self._key(client)
            shared = await self.store.call(lambda r: r.hgetall(key))
            if shared is not None:
                return {str(k): str(v) for k, v in shared.items()}
        return dict(self._by_client.get(client, {}))

    async def save(
        self, client: str, name: object, blend: str, known: frozenset[str] | None
    ) -> None:
        """Saved (again, if the name was the client's already); `invalid_field` for a name
        that is not 1-40 of `a-z 0-9 _ -` or is a voice's or OpenAI's, `too_many_blends` past
        `per_client`."""
        if not isinstance(name, str) or not SAVED_NAME.fullmatch(name):
            raise BadRequest(
                "field 'name': 1-40 characters of a-z, 0-9, '_' and '-', starting with a letter "
                "or digit",
                code="invalid_field",
            )
        if name in OPENAI_VOICES or (known is not None and name in known):
            raise BadRequest(f"field 'name': {name!r} is a voice's name", code="invalid_field")
        saved = await self.of(client)
        if name not in saved and len(saved) >= self.per_client:
            raise BadRequest(
                f"this client has {len(saved)} saved blends, the most it may keep; delete one",
                code="too_many_blends",
            )
        held = self._by_client.get(client, {})
        if name not in held:
            if self._count >= self.total:
                raise BadRequest(
                    "this gateway keeps as many saved blends as it may; delete one",
                    code="too_many_blends",
                )
            self._count += 1
        self._by_client.setdefault(client, {})[name] = blend
        if self.store is not None:
            key = self._key(client)
            await self.store.call(lambda r: r.hset(key, name, blend))

    async def delete(self, client: str, name: str) -> bool:
        """Whether the client had a blend of that name (it has none now, fleet-wide)."""
        saved = self._by_client.get(client, {})
        here = saved.pop(name, None) is not None
        if here:
            self._count -= 1
            if not saved:
                del self._by_client[client]
        gone = None
        if self.store is not None:
            key = self._key(client)
            gone = await self.store.call(lambda r: r.hdel(key, name))
        return here or bool(gone)

    def _key(self, client: str) -> str:
        assert self.store is not None
        return self.store.key("blends", client)

    async def _write_back(self, redis: aioredis.Redis) -> None:
        # a copy: saves and deletes may come while each write waits
        for client, saved in list(self._by_client.items()):
            for name, blend in list(saved.items()):
                await redis.hsetnx(self._key(client), name, blend)


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

    async def resolve(
        self,
        requested: str | list[str] | None,
        saved: Callable[[], Awaitable[Mapping[str, str]]] | None = None,
    ) -> str | None:
        """The voice to ask the model server for (None: its default): a voice, a blend by its
        canonical name, or the blend a client saved under the name asked for (`saved` gives
        the client's, asked only for a name that could be one: no voice's, no blend's)."""
        if requested is None:
            return None
        known = await self.known()
        if (
            saved is not None
            and isinstance(requested, str)
            and SAVED_NAME.fullmatch(requested)
            and requested not in OPENAI_VOICES
            and (known is None or requested not in known)
        ):
            requested = (await saved()).get(requested, requested)
        if isinstance(requested, list) or blends.is_blend(requested):
            return _checked_blend(requested, known)
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
