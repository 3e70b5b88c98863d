"""A local HTTP server that serves model files the way the Hugging Face hub does, for
huggingface_hub's own client: the revision API (``/api/models/<repo>/revision/<rev>``:
the commit and the file list) and the tree API (``.../tree/<rev>``: the files), ``HEAD`` and ``GET`` on ``/<repo>/resolve/<rev>/<file>``
(commit, ETag and size headers; byte ranges, so interrupted files resume), and the
hub's error codes (``X-Error-Code: GatedRepo`` / ``RepoNotFound``).

Faults for the tests: ``gated`` (repositories that answer 401 GatedRepo), ``cut``
(file -> bytes: the next GET of that file sends that many bytes and drops the
connection, once), ``failing`` (files whose GET answers 500 while listed).  Every
request is logged in ``requests`` as ``(method, path, Range header)``.
"""
from __future__ import annotations

import hashlib
import http.server
import json
import threading
import urllib.parse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, bytes]]):
        self.repos = repos  # repo -> {path: content}
        self.gated: set[str] = set()
        self.cut: dict[str, int] = {}
        self.failing: set[str] = set()
        self.requests: list[tuple[str, str, str | None]] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _error(self, status: int, code: str):
                body = json.dumps({"error": code}).encode()
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _route(self):
                path = urllib.parse.urlparse(self.path).path
                hub.requests.append((self.command, path, self.headers.get("Range")))
                if path.startswith("/api/models/") and "/tree/" in path:
                    repo, _, rev = path[len("/api/models/"):].partition("/tree/")
                    return "tree", repo, rev, None
                if path.startswith("/api/models/"):
                    repo, _, rev = path[len("/api/models/"):].partition("/revision/")
                    return "api", repo, rev, None
                if "/resolve/" in path:
                    repo, _, rest = path[1:].partition("/resolve/")
                    rev, _, name = rest.partition("/")
                    return "file", repo, rev, urllib.parse.unquote(name)
                return None, None, None, None

            def _check(self, repo):
                if repo in hub.gated:
                    self._error(401, "GatedRepo")
                    return False
                if repo not in hub.repos:
                    self._error(404, "RepoNotFound")
                    return False
                return True

            def do_GET(self):
                kind, repo, rev, name = self._route()
                if kind is None or not self._check(repo):
                    if kind is None:
                        self._error(404, "EntryNotFound")
                    return
                if kind in ("api", "tree"):
                    files = hub.repos[repo]
                    body = json.dumps(
                        {"id": repo, "sha": COMMIT, "siblings": [{"rfilename": f} for f in files]} if kind == "api"
                        else [{"type": "file", "path": f, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                              for f, d in files.items()]).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self._file(repo, name, send=True)

            def do_HEAD(self):
                kind, repo, rev, name = self._route()
                if kind != "file" or not self._check(repo):
                    if kind != "file":
                        self._error(404, "EntryNotFound")
                    return
                self._file(repo, name, send=False)

            def _file(self, repo, name, send):
                data = hub.repos[repo].get(name)
                if data is None:
                    self._error(404, "EntryNotFound")
                    return
                if send and name in hub.failing:
                    self._error(500, "ServerError")
                    return
                start = 0
                wanted = self.headers.get("Range")
                if send and wanted and wanted.startswith("bytes="):
                    start = int(wanted[len("bytes="):].split("-")[0] or 0)
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                if not send:
                    return
                cut = hub.cut.pop(name, None)
                if cut is not None:  # part of the file, then the connection drops
                    self.wfile.write(data[start:start + cut])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(data[start:])

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
