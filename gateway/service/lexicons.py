"""Pronunciation lexicons on the gateway (`kokoro_contract.lexicon`): the deployment's
(`--lexicon-file`, on every reply) and each client's named ones (`PUT /v1/lexicons/{name}`), in
this gateway's memory. A request's `lexicon` names one of its client's, whose entries go on top
of the deployment's; the reply keeps the version it started with (a later `PUT` makes a new
`Lexicon`, never changes one), so it is read one way from start to end."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from gateway.errors import BadRequest, GatewayError
from kokoro_contract.errors import InvalidRequest
from kokoro_contract.lexicon import MAX_ENTRIES, Lexicon, check_entries

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")


def load_file(path: Path) -> Lexicon:
    """The deployment's lexicon: a JSON object word -> "/IPA/" or alias text. `ValueError`
    naming what is wrong."""
    try:
        raw = orjson.loads(path.read_bytes())
        return Lexicon(path.stem, check_entries(raw), 1)
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ValueError(f"--lexicon-file {path}: {exc}") from None
    except InvalidRequest as exc:
        raise ValueError(f"--lexicon-file {path}: {exc.message}") from None


class Lexicons:
    """The deployment's lexicon and each client's, at most `per_client` lexicons a client and
    `total_entries` entries in all (anonymous clients are each address: without a bound, many
    addresses could fill memory)."""

    def __init__(
        self,
        deployment: Lexicon | None = None,
        per_client: int = 20,
        total_entries: int = 20 * MAX_ENTRIES,
    ) -> None:
        self.deployment = deployment
        self.per_client = per_client
        self.total_entries = total_entries
        self._by_client: dict[str, dict[str, Lexicon]] = {}
        self._entries = 0

    def of(self, client: str) -> dict[str, Lexicon]:
        return dict(self._by_client.get(client, {}))

    def save(self, client: str, name: str, entries: object) -> Lexicon:
        """The client's lexicon `name`, new or its next version. `BadRequest`: `invalid_field`
        (the name), `invalid_lexicon`, `invalid_ipa`, `lexicon_too_large`, `too_many_lexicons`."""
        if not _NAME.fullmatch(name):
            raise BadRequest(
                "a lexicon's name: 1-40 characters of a-z, 0-9, '_' and '-', starting with a "
                "letter or digit",
                code="invalid_field",
            )
        try:
            checked = check_entries(entries)
        except InvalidRequest as exc:
            raise BadRequest(exc.message, code=exc.code) from None
        saved = self._by_client.get(client, {})
        old = saved.get(name)
        if old is None and len(saved) >= self.per_client:
            raise BadRequest(
                f"this client has {len(saved)} lexicons, the most it may keep; delete one",
                code="too_many_lexicons",
            )
        grown = self._entries + len(checked) - (len(old.entries) if old else 0)
        if grown > self.total_entries:
            raise BadRequest(
                "this gateway keeps as many lexicon entries as it may; delete a lexicon",
                code="too_many_lexicons",
            )
        self._entries = grown
        lexicon = Lexicon(name, checked, old.version + 1 if old else 1)
        self._by_client.setdefault(client, {})[name] = lexicon
        return lexicon

    def delete(self, client: str, name: str) -> bool:
        saved = self._by_client.get(client, {})
        old = saved.pop(name, None)
        if old is None:
            return False
        self._entries -= len(old.entries)
        if not saved:
            del self._by_client[client]
        return True

    def for_reply(self, client: str, name: str | None) -> Lexicon | None:
        """What a reply of `client` asking for lexicon `name` reads with: the deployment's,
        with that one on top. 400 `unknown_lexicon` for a name the client has none of."""
        own = None
        if name is not None:
            own = self._by_client.get(client, {}).get(name)
            if own is None:
                raise GatewayError(
                    f"no lexicon {name!r} for this client (PUT /v1/lexicons/{{name}} saves one)",
                    code="unknown_lexicon",
                    status=400,
                )
        if self.deployment is None:
            return own
        return self.deployment.merged(own)
