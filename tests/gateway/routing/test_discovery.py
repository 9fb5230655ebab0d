"""Discovery (`gateway.routing.discovery`) over a scripted resolver and a clock the test turns:
names are resolved again only once `every_s` has passed, a server found again keeps its object,
one that left is dropped and one that came is made. (The DNS itself, `expand`, is tested in
`tests/end_to_end/test_realtime.py` and through the pool in `test_pool.py`.)"""

from __future__ import annotations

import asyncio

from gateway.routing.discovery import Discovery, resolve_due


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Resolver:
    """Each name's addresses as the test sets them, every lookup counted."""

    def __init__(self, **names: list[str]) -> None:
        self.names = names
        self.lookups: list[str] = []

    async def __call__(self, url: str) -> list[str]:
        self.lookups.append(url)
        await asyncio.sleep(0)  # a lookup takes a turn of the loop, as the DNS's does
        return [f"http://{a}:8080" for a in self.names[url]]


class Server:
    def __init__(self, url: str) -> None:
        self.url = url


def test_names_are_resolved_again_once_every_s_has_passed() -> None:
    assert resolve_due(found_any=False, now=0.0, resolved_at=0.0, every_s=10.0)
    assert not resolve_due(found_any=True, now=9.99, resolved_at=0.0, every_s=10.0)
    assert resolve_due(found_any=True, now=10.0, resolved_at=0.0, every_s=10.0)
    assert resolve_due(found_any=True, now=0.0, resolved_at=0.0, every_s=0.0)


async def test_a_server_found_again_keeps_its_object() -> None:
    clock = Clock(100.0)
    dns = Resolver(tts=["10.0.0.3", "10.0.0.4"], other=["10.0.0.9"])
    found = Discovery(["tts", "other"], Server, clock, dns)
    await found.refresh(every_s=10.0)
    assert [s.url for s in found.found] == [
        "http://10.0.0.3:8080",
        "http://10.0.0.4:8080",
        "http://10.0.0.9:8080",
    ]
    stays = found["http://10.0.0.4:8080"]

    dns.names["tts"] = ["10.0.0.2", "10.0.0.4"]  # .3 left, .2 came
    clock.now = 109.5
    await found.refresh(every_s=10.0)  # not yet: what was found serves
    assert dns.lookups == ["tts", "other"]
    assert "http://10.0.0.3:8080" in [s.url for s in found.found]

    clock.now = 110.0
    await found.refresh(every_s=10.0)
    assert [s.url for s in found.found] == [
        "http://10.0.0.2:8080",
        "http://10.0.0.4:8080",
        "http://10.0.0.9:8080",
    ]
    assert found["http://10.0.0.4:8080"] is stays
    assert dns.lookups == ["tts", "other"] * 2


async def test_refreshes_at_once_resolve_once() -> None:
    clock = Clock(100.0)
    dns = Resolver(tts=["10.0.0.3"])
    found = Discovery(["tts"], Server, clock, dns)
    await asyncio.gather(*(found.refresh(every_s=10.0) for _ in range(3)))
    assert dns.lookups == ["tts"]
    assert [s.url for s in found.found] == ["http://10.0.0.3:8080"]
