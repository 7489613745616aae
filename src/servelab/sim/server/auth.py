"""``--api-key`` as vLLM enforces it (``vllm/entrypoints/serve/middleware/authenticate.py``,
``AuthenticationMiddleware``): with one or more keys configured (``--api-key`` wins over
``VLLM_API_KEY``), every request whose path starts with ``/v1``, ``/v2``, ``/inference`` or
``/cohere`` needs ``Authorization: Bearer KEY`` (the scheme case-insensitive, the key exact),
else it gets 401 with the body ``{"error":"Unauthorized"}``. OPTIONS requests and every other
path (``/health``, ``/ping``, ``/version``, ``/metrics``, ``/tokenize``, ``/detokenize``) pass.
Keys are compared by SHA-256 digest with ``secrets.compare_digest``, as vLLM does."""
from __future__ import annotations

import hashlib
import os
import secrets

from aiohttp import web

GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")
UNAUTHORIZED_BODY = b'{"error":"Unauthorized"}'   # Starlette's JSONResponse: compact JSON


def configured_keys(cli_keys=(), serve_args_ignored=(), environ=os.environ) -> list[str]:
    """The keys in force: ``--api-key`` (from ``servelab sim`` or a variant's serve args, as
    ``--api-key=KEY`` in ``ServeArgs.ignored``), else ``$VLLM_API_KEY``; empty ones dropped."""
    keys = [k for k in cli_keys or () if k]
    keys += [item.partition("=")[2] for item in serve_args_ignored
             if item.startswith("--api-key=") and item.partition("=")[2]]
    if not keys and environ.get("VLLM_API_KEY"):
        keys = [environ["VLLM_API_KEY"]]
    return keys


def authentication(keys: list[str]):
    """An aiohttp middleware enforcing ``keys`` (None when there are none: nothing to check)."""
    if not keys:
        return None
    digests = [hashlib.sha256(k.encode("utf-8")).digest() for k in keys]

    def verify(header: str | None) -> bool:
        if not header:
            return False
        scheme, _, param = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        given = hashlib.sha256(param.encode("utf-8")).digest()
        match = False
        for digest in digests:   # every key compared, so the time says nothing about which
            match |= secrets.compare_digest(given, digest)
        return match

    @web.middleware
    async def check_api_key(request: web.Request, handler):
        if (request.method != "OPTIONS" and request.path.startswith(GUARDED_PREFIX)
                and not verify(request.headers.get("Authorization"))):
            return web.Response(status=401, body=UNAUTHORIZED_BODY,
                                content_type="application/json")
        return await handler(request)

    return check_api_key
