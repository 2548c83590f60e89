"""Fixtures shared by every test folder.

`qdrant_server`: a Qdrant REST endpoint served from this process, backed by qdrant-client's local
mode, so the *real* remote client path (httpx, deadlines, retries, shard keys, replication) runs in
CI without a Qdrant binary. Faults are injected by pausing it (connections accepted, nothing
answered: a silent or overloaded server) or stopping it (connection refused), then bringing it
back on the same port. Local mode has no shards: shard keys and replication are recorded and
echoed back in the collection info, and every request body is kept in `requests` for assertions.

Property tests (Hypothesis) run derandomized under CI (`CI` set, as `.ci/run` is run): the same
examples on every run, so a green CI never depends on a random draw; a falsifying example found
locally is pinned in its test with `@example`.

test/libero tests the LIBERO workbench (heisd_libero), a package beside the node: it is collected
only where the workbench is importable (`make test` installs both; a ROS 2 workspace's `colcon test`
tests the node package alone), and the header of the run says when it is left out.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

WORKBENCH_INSTALLED = importlib.util.find_spec("heisd_libero") is not None
collect_ignore = [] if WORKBENCH_INSTALLED else ["libero"]


def pytest_report_header(config) -> str | None:
    return None if WORKBENCH_INSTALLED else "heisd_libero (the LIBERO workbench) is not installed: test/libero not collected"


def _dump(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_dump(v) for v in value]
    return value


class QdrantEmulator:
    """Minimal Qdrant REST API (the endpoints heisd_ros.store.client uses) over local mode."""

    def __init__(self, tls: tuple[str, str] | None = None) -> None:
        from qdrant_client import QdrantClient

        self.local = QdrantClient(location=":memory:")
        self.tls = tls
        """(certificate PEM, key PEM): serve https with them."""
        self.requests: list[tuple[str, str, Any]] = []
        """(method, path, JSON body) of every request answered."""
        self.headers: list[dict[str, str]] = []
        """Headers of every request received (lower-case names)."""
        self.shard_keys: dict[str, list[Any]] = {}
        self.created: dict[str, dict] = {}
        self._answering = threading.Event()
        self._answering.set()
        self._server: ThreadingHTTPServer | None = None
        self._lock = threading.Lock()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.start()

    # -- fault injection -----------------------------------------------------------------------
    def start(self) -> None:
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                emulator.headers.append({k.lower(): v for k, v in self.headers.items()})
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if not emulator._answering.wait(30.0):  # paused: hold the connection, answer nothing
                    self.close_connection = True
                    return
                status, body = emulator.handle(self.command, self.path.split("?")[0], json.loads(raw) if raw else None)
                data = json.dumps({"result": body, "status": "ok", "time": 0.0} if status == 200 else
                                  {"status": {"error": str(body)}, "time": 0.0}).encode()  # fmt: skip
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up while the server was paused
                    self.close_connection = True

            do_GET = do_PUT = do_POST = do_DELETE = _serve

        ThreadingHTTPServer.allow_reuse_address = True
        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        if self.tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*self.tls)
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self._server = server

    def stop(self) -> None:
        """Close the port: connections are refused until start()."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def pause(self) -> None:
        """Keep accepting connections but answer nothing (a silent, overloaded server)."""
        self._answering.clear()

    def resume(self) -> None:
        self._answering.set()

    def close(self) -> None:
        self.resume()
        self.stop()
        self.local.close()

    # -- the API -------------------------------------------------------------------------------
    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        from qdrant_client import models as qm

        with self._lock:
            self.requests.append((method, path, body))
            for pattern, verb, fn in self._routes(qm):
                m = re.fullmatch(pattern, path)
                if m and verb == method:
                    try:
                        return 200, _dump(fn(m.group(1), body))
                    except (ValueError, KeyError) as err:
                        return 400, err
            return 404, f"no route {method} {path}"

    def _routes(self, qm: Any) -> list[tuple[str, str, Callable[[str, Any], Any]]]:
        c = r"/collections/([^/]+)"
        local = self.local
        return [
            (c + "/exists", "GET", lambda n, b: {"exists": local.collection_exists(n)}),
            (c, "GET", self._info),
            (c, "PUT", self._create),
            (c + "/index", "PUT", lambda n, b: local.create_payload_index(
                n, b["field_name"], field_schema=qm.CreateFieldIndex.model_validate(b).field_schema)),
            (c + "/points", "PUT", lambda n, b: local.upsert(n, points=qm.PointsList.model_validate(b).points)),
            (c + "/points/count", "POST", lambda n, b: local.count(
                n, count_filter=qm.CountRequest.model_validate(b).filter)),
            (c + "/points/query", "POST", self._query),
            (c + "/points/scroll", "POST", self._scroll),
            (c + "/facet", "POST", lambda n, b: local.facet(
                n, key=b["key"], limit=b.get("limit", 10), facet_filter=qm.FacetRequest.model_validate(b).filter)),
            (c + "/shards", "GET", lambda n, b: {"shard_keys": [{"key": k} for k in self.shard_keys.get(n, [])]}),
            (c + "/shards", "PUT", self._create_shard_key),
        ]  # fmt: skip

    def _create(self, name: str, body: dict) -> bool:
        from qdrant_client import models as qm

        req = qm.CreateCollection.model_validate(body)
        self.created[name] = body
        self.shard_keys.setdefault(name, [])
        return self.local.create_collection(name, vectors_config=req.vectors, hnsw_config=req.hnsw_config)

    def _info(self, name: str, body: Any) -> Any:
        info = self.local.get_collection(name).model_dump(mode="json")
        made = self.created.get(name, {})
        for key in ("sharding_method", "replication_factor", "shard_number"):
            if made.get(key) is not None:
                info["config"]["params"][key] = made[key]
        return info

    def _create_shard_key(self, name: str, body: dict) -> bool:
        self.shard_keys.setdefault(name, []).append(body["shard_key"])
        return True

    def _query(self, name: str, body: dict) -> Any:
        from qdrant_client import models as qm

        req = qm.QueryRequest.model_validate(body)
        return self.local.query_points(name, query=req.query, using=req.using, query_filter=req.filter,
                                       limit=req.limit or 10, with_payload=req.with_payload or False,
                                       with_vectors=req.with_vector or False)  # fmt: skip

    def _scroll(self, name: str, body: dict) -> Any:
        from qdrant_client import models as qm

        req = qm.ScrollRequest.model_validate(body)
        points, nxt = self.local.scroll(name, scroll_filter=req.filter, limit=req.limit or 10, offset=req.offset,
                                        with_payload=req.with_payload or False, with_vectors=req.with_vector or False)  # fmt: skip
        return {"points": _dump(points), "next_page_offset": nxt}


@pytest.fixture
def qdrant_factory():
    """make(tls=None) -> a new emulated Qdrant server; all are closed after the test."""
    made: list[QdrantEmulator] = []

    def make(**kwargs: Any) -> QdrantEmulator:
        made.append(QdrantEmulator(**kwargs))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture
def qdrant_server(qdrant_factory):
    """A fresh emulated Qdrant server (see the module docstring); closed after the test."""
    return qdrant_factory()
