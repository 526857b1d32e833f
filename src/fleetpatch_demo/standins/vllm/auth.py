"""vLLM's API key check (``AuthenticationMiddleware``), as each release does it, before any route:
``ApiKeyCheck.refusal(method, path, authorization)`` is None (served) or (401, body).

Which key (``build_app``): ``--api-key`` takes precedence over ``VLLM_API_KEY`` (vllm/envs.py:
``os.environ.get("VLLM_API_KEY", None)``):

* 0.10.0 (entrypoints/openai/api_server.py): ``if token := args.api_key or envs.VLLM_API_KEY``,
  one token; the header must be exactly ``f"Bearer {self.api_token}"``;
* 0.10.1-0.10.2 (same file): ``if tokens := [key for key in (args.api_key or [envs.VLLM_API_KEY])
  if key]`` (``--api-key`` takes several), the header one of ``{f"Bearer {token}" ...}``;
* 0.11+ (api_server.py; 0.16-0.22 entrypoints/openai/server_utils.py; 0.23-0.28
  entrypoints/serve/utils/server_utils.py; 0.29+ entrypoints/serve/middleware/authenticate.py,
  added by register.py): ``verify_token``: ``scheme, _, param = header.partition(" ")``,
  ``scheme.lower() != "bearer"`` refuses, the param's sha256 compared in constant time.

Which paths: ``url_path.startswith("/v1")`` through 0.21; ``GUARDED_PREFIX = ("/v1", "/v2",
"/inference")`` 0.22-0.26, ``+ "/cohere"`` 0.27+ (/health, /version, /metrics never). OPTIONS and
non-HTTP scopes pass. A refusal: ``JSONResponse(content={"error": "Unauthorized"},
status_code=401)``, which Starlette writes compact: ``{"error":"Unauthorized"}``.

Stdlib only; Python 3.8+.
"""
import hashlib
import hmac
import json

UNAUTHORIZED = json.dumps({"error": "Unauthorized"}, separators=(",", ":")).encode()


def guarded_prefixes(version):
    if version >= (0, 27):
        return ("/v1", "/v2", "/inference", "/cohere")
    if version >= (0, 22):
        return ("/v1", "/v2", "/inference")
    return ("/v1",)


class ApiKeyCheck(object):
    """The check of one server: its tokens (``--api-key`` else VLLM_API_KEY) and its release's rule."""

    def __init__(self, version, api_key, env_key):
        self.version = tuple(version)
        keys = [api_key] if api_key else [env_key]
        self.tokens = [k for k in keys if k]
        self.prefixes = guarded_prefixes(self.version)

    def refusal(self, method, path, authorization):
        if not self.tokens or method == "OPTIONS" or not path.startswith(self.prefixes):
            return None
        return None if self.verified(authorization) else (401, UNAUTHORIZED)

    def verified(self, header):
        if self.version < (0, 11):
            return header in set("Bearer %s" % t for t in self.tokens)
        if not header:
            return False
        scheme, _, param = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(param.encode("utf-8")).digest()
        match = False
        for token in self.tokens:
            match |= hmac.compare_digest(digest, hashlib.sha256(token.encode("utf-8")).digest())
        return match
