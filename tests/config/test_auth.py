from __future__ import annotations

import os
from pathlib import Path

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from config import (
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    AuthError,
    ConfigError,
    NonceCache,
    read_secret_file,
    sign_request,
    signed_headers,
    signing_middleware,
    verify_request,
)

SECRET = b"0123456789abcdef0123456789abcdef"


def test_signature_matches_the_documented_formula() -> None:
    import hashlib
    import hmac

    body = b'{"a": 1}'
    message = "\n".join(["POST", "/v1/x?y=1", "100", "ab" * 8, hashlib.sha256(body).hexdigest()])
    expected = hmac.new(SECRET, message.encode(), hashlib.sha256).hexdigest()
    assert sign_request(SECRET, "post", "/v1/x?y=1", "100", "ab" * 8, body) == expected


def test_verify_accepts_then_refuses_replay() -> None:
    nonces = NonceCache()
    headers = signed_headers(SECRET, "gpu-a", "GET", "/v1/status", now=1000)
    assert verify_request(SECRET, headers, "GET", "/v1/status", b"", nonces, now=1000) == "gpu-a"
    with pytest.raises(AuthError, match="nonce seen before"):
        verify_request(SECRET, headers, "GET", "/v1/status", b"", nonces, now=1001)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda h: h.pop(HEADER_SIGNATURE), "missing signature headers"),
        (lambda h: h.__setitem__(HEADER_SIGNATURE, "0" * 64), "bad signature"),
        (lambda h: h.__setitem__(HEADER_NONCE, "abc"), "nonce must be at least 16"),
        (lambda h: h.__setitem__(HEADER_TIMESTAMP, "x"), "timestamp is not unix seconds"),
    ],
)
def test_verify_refusals(mutate: object, reason: str) -> None:
    headers = signed_headers(SECRET, "gpu-a", "GET", "/v1/status", now=1000)
    mutate(headers)  # type: ignore[operator]
    with pytest.raises(AuthError, match=reason):
        verify_request(SECRET, headers, "GET", "/v1/status", b"", NonceCache(), now=1000)


def test_verify_refuses_skewed_timestamp_and_other_body_or_path() -> None:
    headers = signed_headers(SECRET, "a", "POST", "/v1/x", b"body", now=1000)
    with pytest.raises(AuthError, match="off"):
        verify_request(SECRET, headers, "POST", "/v1/x", b"body", NonceCache(), now=1000 + 301)
    with pytest.raises(AuthError, match="bad signature"):
        verify_request(SECRET, headers, "POST", "/v1/x", b"other", NonceCache(), now=1000)
    with pytest.raises(AuthError, match="bad signature"):
        verify_request(SECRET, headers, "POST", "/v1/y", b"body", NonceCache(), now=1000)


def test_nonce_cache_forgets_after_window_and_is_bounded() -> None:
    cache = NonceCache(window_s=10, max_entries=3)
    assert cache.check_and_add("n1", 0)
    assert not cache.check_and_add("n1", 5)
    assert cache.check_and_add("n1", 20)
    for i in range(10):
        cache.check_and_add(f"x{i}", 21)
    assert len(cache._seen) <= 3


def test_secret_file_permissions(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(SECRET)
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        read_secret_file(path)
    os.chmod(path, 0o600)
    assert read_secret_file(path) == SECRET
    path.write_bytes(b"short")
    with pytest.raises(ConfigError, match="too short"):
        read_secret_file(path)
    with pytest.raises(ConfigError, match="not found"):
        read_secret_file(tmp_path / "missing")


async def test_client_middleware_signs_what_the_server_verifies() -> None:
    nonces = NonceCache()
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        body = await request.read()
        try:
            seen.append(
                verify_request(
                    SECRET, request.headers, request.method, request.raw_path, body, nonces
                )
            )
        except AuthError as exc:
            return web.json_response({"error": exc.reason}, status=401)
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    async with TestServer(app) as server:
        url = server.make_url("/v1/records/games?x=1&y=%20z")
        async with ClientSession(middlewares=(signing_middleware(SECRET, "gpu-a"),)) as session:
            async with session.post(url, json=[{"game_id": "g"}]) as response:
                assert response.status == 200
            async with session.get(server.make_url("/v1/status")) as response:
                assert response.status == 200
        async with ClientSession() as session, session.get(url) as response:
            assert response.status == 401
    assert seen == ["gpu-a", "gpu-a"]
