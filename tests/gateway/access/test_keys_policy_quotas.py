"""The gateway's access rules, pure: keys and tokens, the policy per request, quotas."""

from __future__ import annotations

import base64
import dataclasses
import hashlib

import orjson
import pytest

from gateway.access.keys import AuthError, Client, KeyRing, bearer
from gateway.access.policy import AccessPolicy, Denial, RequestFacts, host_name
from gateway.access.quotas import PerMinute, RateLimited, Sessions, TooManySessions
from gateway.errors import Overloaded
from kokoro_contract.listen import is_loopback

KEY = "k" * 24
OTHER = "o" * 24
RING = KeyRing.parse([f"web:{KEY}", OTHER, "", "# a comment"])


def facts(
    path: str = "/v1/speak",
    method: str = "POST",
    query_token: str | None = None,
    **headers: str,
) -> RequestFacts:
    base = {"host": "127.0.0.1:8000", "content-type": "application/json"}
    return RequestFacts(
        method=method,
        path=path,
        headers={**base, **{k.replace("_", "-"): v for k, v in headers.items()}},
        query_token=query_token,
        address="10.0.0.7",
    )


def refused(verdict: Client | Denial) -> Denial:
    assert isinstance(verdict, Denial), verdict
    return verdict


# --- keys and tokens ----------------------------------------------------------------------------


def test_key_file_lines_name_their_keys() -> None:
    assert RING.by_key(KEY) == Client("web")
    bare = RING.by_key(OTHER)
    assert bare.name == "key-2"  # its line: nothing derived from the secret reaches the logs
    assert RING.names() == ["key-2", "web"]
    assert hashlib.sha256(OTHER.encode()).hexdigest()[:8] not in bare.name
    with pytest.raises(AuthError, match="unknown API key"):
        RING.by_key("x" * 24)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["short:abc"], "shorter than 16"),
        ([f"a:{KEY}", f"b:{KEY}"], "given twice"),
        ([f"a:{KEY}", f"a:{OTHER}"], "given twice"),
        ([f"my name:{KEY}"], "without spaces"),
    ],
)
def test_bad_key_files_are_refused(lines: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KeyRing.parse(lines)


def test_a_token_carries_its_key_name_until_it_expires() -> None:
    token = RING.mint(Client("web"), now=1000.0, ttl_s=900)
    assert RING.by_token(token, now=1899.0) == Client("web", via="token")
    with pytest.raises(AuthError, match="expired"):
        RING.by_token(token, now=1900.0)


def test_a_forged_or_foreign_token_is_refused() -> None:
    token = RING.mint(Client("web"), now=1000.0, ttl_s=900)
    payload, signature = token.split(".")
    claims = orjson.loads(base64.urlsafe_b64decode(payload + "=="))
    other = RING.by_key(OTHER).name
    forged = base64.urlsafe_b64encode(orjson.dumps({**claims, "sub": other})).rstrip(b"=")
    with pytest.raises(AuthError, match="invalid token"):
        RING.by_token(forged.decode() + "." + signature, now=1000.0)
    longer = base64.urlsafe_b64encode(orjson.dumps({**claims, "exp": 10**10})).rstrip(b"=")
    with pytest.raises(AuthError, match="invalid token"):
        RING.by_token(longer.decode() + "." + signature, now=1000.0)
    # the same name under another key (a rotated key file) does not accept it
    rotated = KeyRing.parse([f"web:{'n' * 24}"])
    with pytest.raises(AuthError, match="invalid token"):
        rotated.by_token(token, now=1000.0)
    for junk in ("", ".", "abc", "a.b", "é.é", "e30.AAAA"):
        with pytest.raises(AuthError):
            RING.by_token(junk, now=1000.0)


def test_bearer_header() -> None:
    assert bearer(None) is None
    assert bearer(f"Bearer {KEY}") == KEY
    assert bearer(f"bearer  {KEY} ") == KEY
    for bad in ("Basic abc", "Bearer", "Bearer   ", KEY):
        with pytest.raises(AuthError):
            bearer(bad)


# --- the policy ---------------------------------------------------------------------------------

KEYED = AccessPolicy(keys=RING, local_origins=False, origins=frozenset({"https://app.example"}))


def test_keys_are_needed_on_v1_routes_only() -> None:
    assert KEYED.check(facts(path="/healthz", method="GET"), 0) == Client("anonymous", "anonymous")
    assert KEYED.check(facts(path="/", method="GET"), 0).anonymous  # type: ignore[union-attr]
    missing = refused(KEYED.check(facts(), 0))
    assert (missing.status, missing.code) == (401, "unauthorized")
    assert KEYED.check(facts(authorization=f"Bearer {KEY}"), 0) == Client("web")
    wrong = refused(KEYED.check(facts(authorization="Bearer " + "w" * 24), 0))
    assert wrong.message == "unknown API key"


def test_tokens_go_in_the_query_and_keys_never_do() -> None:
    token = RING.mint(Client("web"), now=0, ttl_s=60)
    assert KEYED.check(facts(method="GET", query_token=token), 10) == Client("web", "token")
    assert KEYED.check(facts(authorization=f"Bearer {token}"), 10) == Client("web", "token")
    assert refused(KEYED.check(facts(method="GET", query_token=KEY), 10)).status == 401
    late = refused(KEYED.check(facts(method="WEBSOCKET", query_token=token), 60))
    assert late.message == "token expired"


def test_rotating_a_key_revokes_its_tokens_and_no_others() -> None:
    web, other = RING.mint(Client("web"), 0, 60), RING.mint(RING.by_key(OTHER), 0, 60)
    rotated = KeyRing.parse([f"web:{'n' * 24}", OTHER])  # web's secret replaced, same name
    with pytest.raises(AuthError, match="invalid token"):
        rotated.by_token(web, 10)
    assert rotated.by_token(other, 10) == Client("key-2", "token")
    assert RING.by_token(web, 10) == Client("web", "token")  # before the rotation it was good


def test_a_token_calls_only_its_routes() -> None:
    speak_only = RING.mint(Client("web"), 0, 60, routes=["speak"])
    for path in ("/v1/speak", "/v1/speak/sse", "/v1/speak/ws"):
        assert KEYED.check(facts(path=path, method="GET", query_token=speak_only), 1) == Client(
            "web", "token"
        )
    for path in ("/v1/audio/speech", "/v1/voices", "/v1/tokens", "/v1/speakers"):
        denial = refused(KEYED.check(facts(path=path, authorization=f"Bearer {speak_only}"), 1))
        assert (denial.status, denial.code) == (403, "token_not_for_route"), path
    default = RING.mint(Client("web"), 0, 60)
    assert KEYED.check(facts(path="/v1/voices", method="GET", query_token=default), 1)
    assert (
        refused(KEYED.check(facts(path="/v1/audio/speech", query_token=default), 1)).status == 403
    )
    key = KEYED.check(facts(path="/v1/audio/speech", authorization=f"Bearer {KEY}"), 1)
    assert key == Client("web")  # a key calls every route


def test_tokens_live_an_hour_at_most_and_name_known_routes() -> None:
    with pytest.raises(ValueError, match="1 to 3600 s"):
        RING.mint(Client("web"), 0, 3601)
    with pytest.raises(ValueError, match="unknown route groups"):
        RING.mint(Client("web"), 0, 60, routes=["speak", "admin"])
    with pytest.raises(ValueError, match="at least one"):
        RING.mint(Client("web"), 0, 60, routes=[])
    payload, signature = RING.mint(Client("web"), 0, 60).split(".")
    claims = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["routes"] == ["speak", "voices"]
    widened = base64.urlsafe_b64encode(orjson.dumps({**claims, "routes": ["speech"]}))
    with pytest.raises(AuthError, match="invalid token"):  # the routes are signed
        RING.by_token(widened.rstrip(b"=").decode() + "." + signature, 1)


def test_without_keys_clients_are_their_addresses() -> None:
    open_policy = AccessPolicy(keys=None)
    assert open_policy.check(facts(), 0) == Client("ip:10.0.0.7", "anonymous")


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("https://app.example", True),
        ("https://app.example/", True),
        ("http://127.0.0.1:8000", True),  # the gateway's own page
        ("https://127.0.0.1:8000", False),  # same host, another scheme: another origin
        ("https://evil.example", False),
        ("http://localhost:3000", False),  # not on loopback: localhost is someone else
        ("null", False),
    ],
)
def test_origins_on_every_v1_route(origin: str, allowed: bool) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    for method in ("GET", "POST", "WEBSOCKET"):
        verdict = KEYED.check(facts(method=method, origin=origin, **auth), 0)
        if allowed:
            assert isinstance(verdict, Client), (method, verdict)
        else:
            assert (refused(verdict).status, refused(verdict).code) == (403, "origin_not_allowed")


def test_cross_site_requests_without_origin() -> None:
    """`<img src=".../v1/speak/sse?prompt=...">` on another site: no Origin, but the browser
    says where the request comes from."""
    policy = AccessPolicy(keys=None)
    img = facts(method="GET", sec_fetch_site="cross-site", sec_fetch_mode="no-cors")
    assert refused(policy.check(img, 0)).code == "origin_not_allowed"
    assert refused(policy.check(facts(method="GET", sec_fetch_site="same-site"), 0)).status == 403
    for site in ("same-origin", "none"):  # the page itself; typed into the address bar
        assert isinstance(policy.check(facts(method="GET", sec_fetch_site=site), 0), Client)


def test_the_pages_own_origin_has_its_scheme() -> None:
    policy = AccessPolicy(keys=None, local_origins=False)
    secure = dataclasses.replace(facts(host="voice.example", origin="https://voice.example"))
    assert isinstance(policy.check(dataclasses.replace(secure, scheme="https"), 0), Client)
    assert refused(policy.check(secure, 0)).code == "origin_not_allowed"  # served over http
    plain = facts(host="voice.example", origin="http://voice.example")
    assert isinstance(policy.check(plain, 0), Client)
    assert refused(policy.check(dataclasses.replace(plain, scheme="https"), 0)).status == 403


def test_localhost_origins_only_on_loopback() -> None:
    local = AccessPolicy(keys=None, local_origins=True)
    assert isinstance(local.check(facts(origin="http://localhost:3000"), 0), Client)
    assert isinstance(local.check(facts(origin="http://[::1]:5173"), 0), Client)
    assert refused(local.check(facts(origin="http://localhost.evil.example"), 0)).status == 403


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("application/json", None),
        ("application/json; charset=utf-8", None),
        ("Application/JSON", None),
        ("text/plain", 415),  # a cross-site "simple" request: no CORS preflight
        ("application/x-www-form-urlencoded", 415),
        ("multipart/form-data; boundary=x", 415),
        ("", 415),
    ],
)
def test_posts_take_json_only(content_type: str, status: int | None) -> None:
    verdict = AccessPolicy(keys=None).check(facts(content_type=content_type), 0)
    if status is None:
        assert isinstance(verdict, Client)
    else:
        assert refused(verdict).status == status


def test_declared_body_size() -> None:
    policy = AccessPolicy(keys=None, max_body_bytes=100)
    assert isinstance(policy.check(facts(content_length="100"), 0), Client)
    for length in ("101", "-1", "1e9", "abc"):
        assert refused(policy.check(facts(content_length=length), 0)).code == "body_too_large"


def test_host_names() -> None:
    assert host_name("example.com:8000") == "example.com"
    assert host_name("[::1]:8000") == "[::1]"
    assert host_name("EXAMPLE.com") == "EXAMPLE.com"
    policy = AccessPolicy(keys=None, hosts=frozenset({"localhost", "127.0.0.1"}))
    assert isinstance(policy.check(facts(host="localhost:8000", method="GET"), 0), Client)
    rebound = refused(policy.check(facts(path="/", host="evil.example", method="GET"), 0))
    assert (rebound.status, rebound.code) == (400, "host_not_allowed")
    probe = facts(path="/readyz", host="10.1.2.3:8000", method="GET")  # a kubelet
    assert isinstance(policy.check(probe, 0), Client)


def test_loopback_addresses() -> None:
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.1", "example.com"):
        assert not is_loopback(host), host


# --- quotas -------------------------------------------------------------------------------------


def test_sessions_in_total_and_per_client() -> None:
    emptied: list[int] = []
    sessions = Sessions(max_total=3, max_per_client=2, on_empty=lambda: emptied.append(1))
    a1, a2 = sessions.open("a"), sessions.open("a")
    with pytest.raises(TooManySessions) as mine:
        sessions.open("a")
    assert (mine.value.status, mine.value.code) == (429, "too_many_sessions")
    b1 = sessions.open("b")
    with pytest.raises(Overloaded) as full:
        sessions.open("c")
    assert (full.value.status, full.value.code) == (503, "overloaded")
    a1.release()
    a1.release()  # twice: counted once
    assert (sessions.total, sessions.of("a")) == (2, 1)
    c1 = sessions.open("c")
    a2.release()
    b1.release()
    assert sessions.of("a") == sessions.of("b") == 0
    assert emptied == []  # "c" is still open
    c1.release()
    assert (sessions.total, emptied) == (0, [1])


def test_per_minute_windows() -> None:
    replies = PerMinute(limit=2, what="replies")
    replies.check("a", 0.0)
    replies.charge("a", 1, 0.0)
    replies.charge("a", 1, 30.0)
    with pytest.raises(RateLimited) as limited:
        replies.check("a", 45.0)
    assert limited.value.retry_after_s == 15  # until the first one leaves the window
    replies.check("b", 45.0)  # others are not affected
    replies.check("a", 60.0)  # the first one has left
    assert replies.used("a", 60.0) == 1
    unlimited = PerMinute(limit=0, what="replies")
    unlimited.charge("a", 10**6, 0.0)
    unlimited.check("a", 0.0)


def test_quiet_clients_are_forgotten() -> None:
    tokens = PerMinute(limit=100, what="LLM tokens")
    for i in range(50):
        tokens.charge(f"ip:10.0.0.{i}", 10, float(i))
    assert tokens.clients() == 50
    tokens.charge("ip:10.0.1.1", 10, 200.0)  # a minute later: the sweep drops the rest
    assert tokens.clients() == 1
