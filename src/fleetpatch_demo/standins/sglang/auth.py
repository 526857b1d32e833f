"""The API key check of SGLang's HTTP server (``--api-key``, ``--admin-api-key``), as each release
does it, before any route: ``refusal(method, path, authorization)`` is None (served) or the
(status, body) the server answers instead.

* 0.5.7: ``add_api_key_middleware(app, api_key)`` in sglang/srt/utils/common.py, added by
  http_server.py ``if server_args.api_key`` (single tokenizer mode)::

      if request.method == "OPTIONS": ...call_next
      if request.url.path.startswith("/health") or request.url.path.startswith("/metrics"): ...call_next
      if request.headers.get("Authorization") != "Bearer " + api_key:
          return ORJSONResponse(content={"error": "Unauthorized"}, status_code=401)

* 0.5.8+: sglang/srt/utils/auth.py, added by http_server.py ``if server_args.api_key or
  server_args.admin_api_key or app_has_admin_force_endpoints(app)``. Its pure
  ``decide_request_auth`` runs here, loaded from the host's own file (health and metrics exempt;
  0.5.20+ ``/ready`` too; the scheme "bearer" in any case, the key compared in constant time);
  every route the stand-in serves is AuthLevel.NORMAL (none carries ``@auth_level``), so
  api_key alone decides. A refusal is the middleware's
  ``ORJSONResponse(content={"error": "Unauthorized" if decision.error_status_code == 401 else
  "Forbidden"}, status_code=decision.error_status_code)``.

orjson writes compact JSON: ``{"error":"Unauthorized"}``. Stdlib only; Python 3.8+.
"""
import importlib.util
import json
import os
import sys

from .release import version_tuple


def _compact(doc):
    return json.dumps(doc, separators=(",", ":")).encode()


def _auth_module(server_args):
    """The host's sglang/srt/utils/auth.py (0.5.8+), beside the tree's server_args.py that built
    `server_args`, loaded from its file: importing it as sglang.srt.utils.auth would run
    sglang/srt/utils/__init__.py (torch and the rest). None when the tree has none."""
    module = sys.modules.get(type(server_args).__module__)
    srt = os.path.dirname(os.path.abspath(getattr(module, "__file__", None) or "."))
    path = os.path.join(srt, "utils", "auth.py")
    if not os.path.isfile(path):
        return None
    spec = importlib.util.spec_from_file_location("sglang_standin_host_auth", path)
    auth = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = auth   # its @dataclass looks its module up there
    spec.loader.exec_module(auth)
    return auth


class ApiKeyCheck(object):
    """The check of one server: its keys (from its ServerArgs) and its release's rule."""

    def __init__(self, server_args):
        self.api_key = getattr(server_args, "api_key", None)
        self.admin_api_key = getattr(server_args, "admin_api_key", None)
        self.legacy = version_tuple() < (0, 5, 8)
        self.auth = None if self.legacy or not self.enabled() else _auth_module(server_args)

    def enabled(self):
        if self.legacy:
            return bool(self.api_key)
        return bool(self.api_key or self.admin_api_key)

    def refusal(self, method, path, authorization):
        """None: the request goes on to its route; else (status, body) as the release answers."""
        if not self.enabled():
            return None
        if self.legacy or self.auth is None:
            if method == "OPTIONS" or path.startswith("/health") or path.startswith("/metrics"):
                return None
            if authorization != "Bearer " + str(self.api_key):
                return 401, _compact({"error": "Unauthorized"})
            return None
        decision = self.auth.decide_request_auth(
            method=method, path=path, authorization_header=authorization, api_key=self.api_key,
            admin_api_key=self.admin_api_key, auth_level=self.auth.AuthLevel.NORMAL)
        if decision.allowed:
            return None
        code = decision.error_status_code
        return code, _compact({"error": "Unauthorized" if code == 401 else "Forbidden"})
