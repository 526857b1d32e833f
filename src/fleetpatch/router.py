"""Talk to an sglang-router: which API it has, its worker list, take a worker out, put it back.

Facts this module relies on, checked against the real binaries (PyPI
``sglang-router`` 0.3.2, installed by the ``test`` extra; the 0.1.9 and 0.2.4
wheels, which tests/e2e/test_router_versions.py runs) and the 0.1.9 / 0.2.0
sources:

* Starting it: ``python -m sglang_router.launch_router --host 127.0.0.1
  --port P --policy round_robin --prometheus-port Q`` (console scripts
  ``sglang-router launch``, ``smg``, ``amg`` are the same CLI). It starts with
  no ``--worker-urls`` at all ("Router ready | workers: []") and takes workers
  over its API. It also binds a Prometheus port (default 29000 on 0.0.0.0),
  so two routers on one machine need distinct ``--prometheus-port``.
  Health checks: ``--health-check-interval-secs`` (default 60),
  ``--health-failure-threshold`` (3), ``--health-success-threshold`` (2),
  ``--health-check-endpoint`` (/health). Default policy ``cache_aware``;
  ``round_robin`` spreads similar prompts. Retries: ``--retry-max-retries``
  (5), ``--disable-retries``.
* API by version. 0.1.x - 0.2.1: ``POST /add_worker?url=U`` (answers once
  the worker is healthy), ``POST /remove_worker?url=U``, ``GET /list_workers``
  -> ``{"urls": [...]}``. 0.2.0 - 0.2.4: ``POST /workers`` (JSON ``{"url": U}``),
  ``GET /workers`` -> ``{"workers": [{"id", "url", "is_healthy", ...}],
  "total", "stats"}`` where ``id`` is the URL, ``DELETE /workers/{url}``.
  0.3.x: the same routes, but ``id`` is a UUID and ``DELETE /workers/{id}``
  takes only that (by URL: 400 "Invalid worker_id ... (expected UUID)";
  0.3.2 has no /list_workers, 404). So this client deletes by the ``id`` the
  list shows (URL-quoted), which is right for both REST versions. 0.1.9 has
  no GET /workers (404); 0.2.4 has both generations of routes.
* 0.3.2: ``POST`` and ``DELETE`` answer 202 ``{"status": "accepted",
  "worker_id": ...}`` and do the work in the background; a removed worker left
  the list within 4 ms here, an added healthy one was listed (``is_healthy``
  true) within 3 ms. A re-added worker gets a new id. URLs are compared as
  strings: ``http://h:1`` and ``http://h:1/`` are two workers. A duplicate
  ``POST`` answers 202 with the EXISTING worker's id, then its job fails
  ("already exists") - silently for the caller. An unreachable URL is not
  listed at all (never listed unhealthy) while the router retries it in the
  background; ``DELETE`` of its id answers 202.
* On ``POST /workers`` the router asks the worker ``GET /health`` (twice),
  tries HTTP/2 prior knowledge and gRPC (a ``PRI * HTTP/2.0`` line, 505, in
  the worker's access log), then ``GET /server_info`` and ``GET /model_info``.
* ``GET /get_loads`` -> ``{"workers": [{"worker": url, "load": N}]}``: N is -1
  for a worker without ``/get_load`` and otherwise counts tokens, so the
  drain signal is the worker's own ``GET /v1/loads`` (``aggregate.
  total_running_reqs`` / ``total_waiting_reqs``), see `parse_worker_loads`.
* Removing a worker does not drain it: requests already routed keep their
  connection. A stream cut by a dying worker just ends (no ``[DONE]``).

Everything here is bounded: every HTTP call has a timeout, every wait a
deadline, and every error names the router URL and what to do. stdlib only.
"""
from __future__ import annotations

import json
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from .errors import FleetpatchError
from .engines.base import answer_text
from .protocol import parse_worker_loads  # noqa: F401  (shared with the agent)

__all__ = [
    "RouterError", "TunnelError", "RouterApi", "Worker", "Router", "Routers", "RouterConf", "SmokeConf", "capacity_problem",
    "parse_worker_list", "find_worker", "parse_worker_loads", "check_smoke_answer",
    "check_router_section", "check_smoke_section", "build_router_conf",
    "REST", "LEGACY",
]

REST = "rest"       # 0.2.0+: GET/POST /workers, DELETE /workers/{id}
LEGACY = "legacy"   # 0.1.x - 0.2.1: /add_worker, /remove_worker, /list_workers

DEFAULT_HTTP_TIMEOUT = 5.0


class RouterError(FleetpatchError):
    """A router could not be used; str() names the router URL and what to do."""

    def __init__(self, router_url: str, message: str):
        super().__init__(f"router {router_url}: {message}")
        self.router_url = router_url
        self.reason = message


@dataclass(frozen=True)
class RouterApi:
    kind: str                      # REST | LEGACY
    ids: Optional[str] = None      # REST: "uuid" (0.3.x), "url" (0.2.x), None (no worker listed to tell)

    @property
    def description(self) -> str:
        if self.kind == LEGACY:
            return "sglang-router 0.1.x-0.2.1 API (POST /add_worker, POST /remove_worker, GET /list_workers)"
        if self.ids == "uuid":
            return "sglang-router 0.3.x API (GET/POST /workers, DELETE /workers/{id}, workers keyed by UUID)"
        if self.ids == "url":
            return "sglang-router 0.2.x API (GET/POST /workers, DELETE /workers/{url})"
        return "sglang-router 0.2.0+ API (GET/POST /workers, DELETE /workers/{id}; no worker listed yet)"


@dataclass(frozen=True)
class Worker:
    url: str
    id: Optional[str] = None           # REST: what DELETE /workers/{id} takes
    healthy: Optional[bool] = None     # None: the API does not say (legacy lists URLs only)


# --------------------------------------------------------------------------- pure parts


def parse_worker_list(body: Any) -> Tuple[str, List[Worker]]:
    """(API kind, workers) from the decoded JSON of GET /workers or GET /list_workers.

    Raises ValueError (with the reason) for anything else."""
    if isinstance(body, dict) and isinstance(body.get("workers"), list):
        out = []
        for i, w in enumerate(body["workers"]):
            if not isinstance(w, dict) or not isinstance(w.get("url"), str):
                raise ValueError(f"workers[{i}] has no string 'url'")
            wid = w.get("id")
            healthy = w.get("is_healthy")
            out.append(Worker(url=w["url"], id=wid if isinstance(wid, str) and wid else w["url"],
                              healthy=healthy if isinstance(healthy, bool) else None))
        return REST, out
    if isinstance(body, dict) and isinstance(body.get("urls"), list):
        if not all(isinstance(u, str) for u in body["urls"]):
            raise ValueError("'urls' holds a non-string")
        return LEGACY, [Worker(url=u) for u in body["urls"]]
    raise ValueError("expected {'workers': [...]} or {'urls': [...]}")


def find_worker(workers: List[Worker], url: str) -> Optional[Worker]:
    """The listed worker whose URL is exactly `url` (the router compares strings too)."""
    for w in workers:
        if w.url == url:
            return w
    return None


def _near_misses(workers: List[Worker], url: str) -> List[str]:
    def norm(u: str) -> str:
        return u.strip().rstrip("/").lower()
    return [w.url for w in workers if w.url != url and norm(w.url) == norm(url)]


def check_smoke_answer(status: int, body: bytes, answer: str = "text") -> Optional[str]:
    """None if a smoke answer is well-formed (HTTP 200, JSON object with a non-empty string
    text: SGLang's /generate `text`, or with `answer` "choices" OpenAI's choices[0].text, as
    vLLM's /v1/completions answers), else the reason."""
    if status != 200:
        return f"HTTP {status}: {first_line(body)}"
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return f"not JSON: {body[:200].decode('utf-8', 'replace')!r}"
    text = answer_text(doc, answer)
    if text is None:
        return "no string choices[0].text in the answer" if answer == "choices" else \
            "no string 'text' field in the answer"
    if not text:
        return f"HTTP 200 with no text: {first_line(body)}"
    return None


def first_line(body: bytes) -> str:
    """The first non-empty line of an answer's body, at most 200 characters."""
    text = body.decode("utf-8", "replace").strip()
    return (text.splitlines() or [""])[0].strip()[:200]


# --------------------------------------------------------------------------- the client


class TunnelError(Exception):
    """A router call through router.via could not be made; str() says why and what to do."""


class Router:
    """One router, by its URL (as written in the inventory's router.urls).

    `via` and `tunnel`: router.via's host name and its tunnel (fleetpatch.router_via,
    built by drain.router_of); every call then goes through the SSH connection to that
    host. Anything with ``request(address, port, method, target, data, headers,
    timeout) -> (status, body)`` that raises TunnelError will do.

    `proxy`: router.proxy, the HTTP proxy every call goes through. Without it the
    calls go direct, whatever http_proxy/https_proxy the laptop's environment sets:
    a router on a private address is not reached through the operator's proxy."""

    def __init__(self, url: str, *, http_timeout: float = DEFAULT_HTTP_TIMEOUT, api: Optional[RouterApi] = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 via: Optional[str] = None, tunnel: Any = None, proxy: Optional[str] = None):
        self.url = url.rstrip("/")
        self.proxy = proxy
        self.http_timeout = http_timeout
        self._api = api
        self._clock, self._sleep = clock, sleep
        if bool(via) != (tunnel is not None):
            raise ValueError("a router reached through a host needs both via and tunnel")
        self.via, self._tunnel = via, tunnel

    @property
    def label(self) -> str:
        """The router as messages name it: its URL, and the host or proxy it is reached through."""
        if self.proxy:
            return f"{self.url} (through proxy {without_userinfo(self.proxy)})"
        return f"{self.url} (via {self.via})" if self.via else self.url

    # -- HTTP
    def _call(self, method: str, path: str, body: Optional[dict] = None,
              timeout: Optional[float] = None) -> Tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        if self._tunnel is not None:
            return self._call_via(method, path, data, timeout or self.http_timeout)
        import urllib.error  # only a run with a router pays for urllib's imports
        import urllib.request

        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with http_opener(self.proxy).open(req, timeout=timeout or self.http_timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise RouterError(self.label, f"{method} {path}: cannot reach the router ({reason}); is it running, "
                                        "and is router.urls in the inventory right?") from None

    def _call_via(self, method: str, path: str, data: Optional[bytes], timeout: float) -> Tuple[int, bytes]:
        p = urllib.parse.urlsplit(self.url)
        headers = {"Host": p.netloc}
        if data is not None:
            headers["Content-Type"] = "application/json"
        try:
            return self._tunnel.request(p.hostname, p.port or 80, method, (p.path or "") + path, data,
                                        headers, timeout)
        except TunnelError as e:
            raise RouterError(self.label, f"{method} {path}: cannot reach the router through {self.via}: {e}"
                              ) from None

    def _json(self, method: str, path: str) -> Tuple[int, Any]:
        status, raw = self._call(method, path)
        try:
            return status, json.loads(raw.decode("utf-8")) if raw else None
        except (UnicodeDecodeError, ValueError):
            return status, None

    # -- API
    def detect(self) -> RouterApi:
        """Which worker API the router speaks (REST preferred when it has both)."""
        status, doc = self._json("GET", "/workers")
        if status == 200:
            try:
                kind, workers = parse_worker_list(doc)
            except ValueError:
                kind, workers = None, []
            if kind == REST:
                ids = None
                if workers:
                    ids = "url" if all(w.id == w.url for w in workers) else "uuid"
                self._api = RouterApi(REST, ids)
                return self._api
        status2, doc2 = self._json("GET", "/list_workers")
        if status2 == 200:
            try:
                kind, _ = parse_worker_list(doc2)
            except ValueError:
                kind = None
            if kind == LEGACY:
                self._api = RouterApi(LEGACY)
                return self._api
        raise RouterError(self.label, f"does not answer like an sglang-router (GET /workers: HTTP {status}, "
                                    f"GET /list_workers: HTTP {status2}); is this the router's URL, not a worker's?")

    @property
    def api(self) -> RouterApi:
        return self._api or self.detect()

    def list_workers(self) -> List[Worker]:
        path = "/workers" if self.api.kind == REST else "/list_workers"
        status, doc = self._json("GET", path)
        if status != 200:
            raise RouterError(self.label, f"GET {path}: HTTP {status}")
        try:
            _, workers = parse_worker_list(doc)
        except ValueError as e:
            raise RouterError(self.label, f"GET {path}: unexpected answer ({e})") from None
        return workers

    def find(self, worker_url: str) -> Optional[Worker]:
        return find_worker(self.list_workers(), worker_url)

    def require_listed(self, worker_url: str) -> Worker:
        """The listed worker, or a RouterError saying what is listed (for check-patch)."""
        workers = self.list_workers()
        w = find_worker(workers, worker_url)
        if w is not None:
            return w
        near = _near_misses(workers, worker_url)
        hint = (f"; it lists {', '.join(near)} - server.url must be exactly the URL the router lists"
                if near else f"; it lists {', '.join(x.url for x in workers) or 'no workers'}. If a fleetpatch "
                             "run left it out (it failed verification, or the run died while the worker was out), "
                             "`fleetpatch rollback` of that patch puts it back, as does a deploy with --break-lock "
                             "after a dead run; else server.url must be the URL the router lists")
        raise RouterError(self.label, f"worker {worker_url} is not in its list{hint}")

    def remove(self, worker_url: str, timeout: float = 30.0) -> Optional[Worker]:
        """Take the worker out and wait until the list no longer shows it.

        Returns the worker as it was listed (None: it was not listed, nothing done)."""
        w = self.find(worker_url)
        if w is None:
            return None
        if self.api.kind == REST:
            path = "/workers/" + urllib.parse.quote(w.id or w.url, safe="")
            status, raw = self._call("DELETE", path)
        else:
            path = "/remove_worker?url=" + urllib.parse.quote(worker_url, safe="")
            status, raw = self._call("POST", path)
        if status not in (200, 202):
            raise RouterError(self.label, f"{'DELETE' if self.api.kind == REST else 'POST'} {path}: HTTP {status} "
                                        f"{raw[:200].decode('utf-8', 'replace')}")
        deadline = self._clock() + timeout
        while True:
            if self.find(worker_url) is None:
                return w
            if self._clock() >= deadline:
                raise RouterError(self.label, f"worker {worker_url} still listed {timeout:g} s after its removal "
                                            "was accepted; check the router's log")
            self._sleep(0.05)

    def add(self, worker_url: str, timeout: float = 60.0) -> Worker:
        """Put the worker in and wait until the router lists it healthy.

        Already listed healthy: nothing is sent (a duplicate POST fails silently in 0.3.x).
        On timeout the router may still add it later: it retries in the background."""
        w = self.find(worker_url)
        if w is not None and w.healthy is not False:
            return w
        if w is None:
            if self.api.kind == REST:
                status, raw = self._call("POST", "/workers", {"url": worker_url})
                what = "POST /workers"
            else:  # blocks until the worker's /health is OK
                what = "POST /add_worker"
                status, raw = self._call("POST", "/add_worker?url=" + urllib.parse.quote(worker_url, safe=""),
                                         timeout=max(timeout, self.http_timeout))
            if status not in (200, 202):
                raise RouterError(self.label, f"{what} {worker_url}: HTTP {status} "
                                            f"{raw[:200].decode('utf-8', 'replace')}")
        deadline = self._clock() + timeout
        while True:
            w = self.find(worker_url)
            if w is not None and w.healthy is not False:
                return w
            if self._clock() >= deadline:
                state = "listed but unhealthy" if w is not None else "not listed"
                raise RouterError(self.label, f"worker {worker_url} {state} {timeout:g} s after it was added "
                                            "(the router keeps retrying in the background; is the worker's "
                                            "/health answering 200 from the router's machine?)")
            self._sleep(0.05)


def http_opener(proxy: Optional[str]):
    """urllib's opener for the laptop's HTTP calls: through `proxy` when the inventory
    names one (router.proxy), else direct. Never the environment's http_proxy/https_proxy,
    which urlopen's default opener would use."""
    import urllib.request

    return urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy, "https": proxy} if proxy else {}))


def without_userinfo(url: str) -> str:
    """A URL as messages show it: no user or password."""
    p = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(p._replace(netloc=p.netloc.rpartition("@")[2]))


def worker_loads(worker_url: str, timeout: float = DEFAULT_HTTP_TIMEOUT) -> Tuple[int, int]:
    """(running, waiting) from the worker itself: GET /v1/loads, else the deprecated GET /get_load."""
    import urllib.error
    import urllib.request

    base = worker_url.rstrip("/")
    last = None
    for path in ("/v1/loads", "/get_load"):
        try:
            with http_opener(None).open(base + path, timeout=timeout) as r:
                return parse_worker_loads(json.loads(r.read().decode("utf-8")))
        except urllib.error.HTTPError as e:
            last = f"GET {path}: HTTP {e.code}"
            if e.code != 404:
                break
        except (ValueError, UnicodeDecodeError) as e:
            last = f"GET {path}: unexpected answer ({e})"
            break
        except (urllib.error.URLError, OSError) as e:
            last = f"GET {path}: {getattr(e, 'reason', e)}"
            break
    raise FleetpatchError(f"worker {worker_url}: cannot read its load ({last})")


def capacity_problem(router_url: str, workers: List[Worker], taking_out: List[str],
                     max_unavailable: Optional[int] = None) -> Optional[str]:
    """Why taking the workers `taking_out` (URLs) out of this router at once is refused, or None.

    Never the last healthy worker; never more than `max_unavailable` out (counting
    listed workers already unhealthy as out)."""
    listed = {w.url for w in workers}
    out = [u for u in dict.fromkeys(taking_out) if u in listed]
    healthy = [w.url for w in workers if w.healthy is not False]
    unhealthy = len(workers) - len(healthy)
    left = [u for u in healthy if u not in out]
    if out and not left:
        return (f"router {router_url}: taking out {len(out)} worker{'s' if len(out) != 1 else ''} at once would "
                f"leave it no healthy worker ({len(healthy)} healthy of {len(workers)} listed); use a smaller "
                "batch or add workers")
    if max_unavailable is not None and len(out) + unhealthy > max_unavailable:
        return (f"router {router_url}: {len(out)} worker{'s' if len(out) != 1 else ''} out at once"
                + (f" plus {unhealthy} already unhealthy" if unhealthy else "")
                + f" is more than --max-unavailable {max_unavailable}")
    return None


class Routers:
    """Every router in front of one worker: out of all of them, back into all of them.

    `remove` is all-or-nothing: if one router fails, the worker is put back into
    those it had already left, and the first error is raised."""

    def __init__(self, urls, **kw):
        self.routers = [Router(u, **kw) for u in urls]

    def remove(self, worker_url: str, timeout: float = 30.0) -> List[Tuple[Router, Worker]]:
        done: List[Tuple[Router, Worker]] = []
        try:
            for r in self.routers:
                w = r.remove(worker_url, timeout)
                if w is None:
                    raise RouterError(r.label, f"worker {worker_url} is not in its list; it must be listed "
                                             "before fleetpatch takes it out (check-patch shows the list)")
                done.append((r, w))
        except BaseException:
            for r, _ in done:
                try:
                    r.add(worker_url, timeout)
                except RouterError:
                    pass  # the first error is the one to report
            raise
        return done

    def add(self, worker_url: str, timeout: float = 60.0) -> List[Worker]:
        return [r.add(worker_url, timeout) for r in self.routers]


# --------------------------------------------------------------------------- inventory section


@dataclass(frozen=True)
class RouterConf:
    urls: Tuple[str, ...]
    via: Optional[str] = None          # an inventory host to reach the routers' API through
    proxy: Optional[str] = None        # an HTTP proxy to reach the routers' API through (else direct)
    # the via host's inventory record (and its gateway's), set by the inventory: what the tunnel dials
    via_hosts: Dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def via_host(self):
        return self.via_hosts.get(self.via) if self.via else None


@dataclass(frozen=True)
class SmokeConf:
    prompt: str = "The capital of France is"
    max_new_tokens: int = 8


Fail = Callable[[Optional[str], str], Exception]   # (dotted key, reason) -> the error to raise


def _url(fail: Fail, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise fail(key, f"expected an http:// or https:// URL, got {value!r}")
    p = urllib.parse.urlsplit(value)
    if p.scheme not in ("http", "https") or not p.netloc or any(c.isspace() for c in value):
        raise fail(key, f"expected an http:// or https:// URL, got {value!r}")
    try:
        p.port
    except ValueError:
        raise fail(key, f"bad port in {value!r}") from None
    return value


def check_router_section(fail: Fail, key: str, node: Any) -> Dict[str, Any]:
    """Types and unknown keys of a `router:` mapping as written -> {'urls': [...], 'via': ...}.

    `fail(key, reason)` builds the error (inventory.py passes its InventoryError maker)."""
    if not isinstance(node, dict):
        raise fail(key, f"expected a mapping with 'urls:' (and optionally 'via:' or 'proxy:'), "
                        f"got {type(node).__name__}")
    out: Dict[str, Any] = {}
    for k, value in node.items():
        sub = f"{key}.{k}"
        if k == "urls":
            if value is None:
                out["urls"] = None
                continue
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not value:
                raise fail(sub, "expected a list of one or more router URLs, e.g. [http://10.0.0.5:30080]")
            urls: List[str] = []
            for i, u in enumerate(value):
                u = _url(fail, f"{sub}[{i}]", u)
                if u.rstrip("/") in (x.rstrip("/") for x in urls):
                    raise fail(f"{sub}[{i}]", f"{u!r} is listed twice")
                urls.append(u)
            out["urls"] = urls
        elif k == "via":
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise fail(sub, f"expected the name of an inventory host, got {value!r}")
            out["via"] = value
        elif k == "proxy":
            out["proxy"] = None if value is None else _url(fail, sub, value)
        else:
            raise fail(sub, "unknown key; known keys here: urls, via, proxy")
    return out


def check_smoke_section(fail: Fail, key: str, node: Any) -> Dict[str, Any]:
    """A `server.smoke:` mapping -> {'prompt': str, 'max_new_tokens': int}, keys optional."""
    if not isinstance(node, dict):
        raise fail(key, "expected a mapping like {prompt: \"The capital of France is\", max_new_tokens: 4}")
    out: Dict[str, Any] = {}
    for k, value in node.items():
        sub = f"{key}.{k}"
        if k == "prompt":
            if not isinstance(value, str) or not value.strip():
                raise fail(sub, f"expected a non-empty string, got {value!r}")
        elif k == "max_new_tokens":
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
                raise fail(sub, f"expected an integer from 1 to 4096, got {value!r}")
        else:
            raise fail(sub, "unknown key; known keys here: prompt, max_new_tokens")
        out[k] = value
    return out


def build_router_conf(fail: Fail, host: str, router: Optional[dict], server_url: Optional[str],
                      written_at: Dict[str, str], url_key: Optional[str] = None) -> Optional[RouterConf]:
    """The merged router section of one host (None: no router), requiring server.url with it.

    `written_at` says where each key of the section was written ("defaults.router", …)."""
    def at(key: str) -> str:
        return written_at.get(key, f"hosts.{host}.router")

    if not router or not router.get("urls"):
        for key in ("via", "proxy"):
            if router and "urls" in router and router.get(key):
                raise fail(f"{at('urls')}.urls", f"required when router.{key} is set")
        return None
    if router.get("via") and router.get("proxy"):
        raise fail(f"{at('proxy')}.proxy", f"router.via ({router['via']}) already says how the routers are "
                                           "reached (through that host's SSH connection); set one of via and proxy")
    if not server_url:
        key = url_key or f"hosts.{host}.server.url"
        raise fail(key, "required when a router section applies to the host: the worker's URL exactly as the "
                        f"router lists it (set it under {key.rsplit('.', 1)[0]})")
    if router.get("via"):
        for i, u in enumerate(router["urls"]):
            if urllib.parse.urlsplit(u).scheme != "http":
                raise fail(f"{at('urls')}.urls[{i}]", f"{u!r}: a router reached through router.via "
                                                       f"({router['via']}) must be an http:// URL (the SSH "
                                                       "tunnel carries plain HTTP; the SSH connection encrypts it)")
    return RouterConf(urls=tuple(router["urls"]), via=router.get("via"), proxy=router.get("proxy"))
