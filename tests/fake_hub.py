"""A local HTTP server that serves model files the way the Hugging Face hub does, for
huggingface_hub's own client and plain HTTP: the revision API (``/api/models/<repo>/revision/<rev>``:
the commit and the file list), the tree API (``.../tree/<rev>?recursive=...``: every file with its size
and hashes as the hub advertises them: ``oid`` the git blob sha1 of a regular file; for an LFS file
(``LFS_PATTERNS``, or over 10 MB) an ``lfs`` object with the content's sha256, and ``oid`` the sha1 of
its pointer; folders as ``directory`` entries), ``HEAD`` and ``GET`` on ``/<repo>/resolve/<rev>/<file>``
(``X-Repo-Commit``, ``ETag``, and for LFS files ``X-Linked-Etag`` / ``X-Linked-Size``; byte ranges, so
interrupted files resume), and the hub's error codes (``X-Error-Code: GatedRepo`` / ``RepoNotFound`` /
``EntryNotFound`` / ``RevisionNotFound``, ``X-Error-Message``).  Beside the hub it serves GitHub's raw
file host under ``/github/`` (``/github/<owner>/<name>/<commit>/<path>``, byte ranges too) from the
repositories keyed ``github.com/<owner>/<name>``, at any commit (``requests`` shows which was asked).

Faults for the tests: ``gated`` (repositories that answer 401 GatedRepo), ``forbidden`` (403),
``tokens`` (when set, the only bearer tokens it accepts: another answers 401 "Invalid credentials"),
``cut`` (file -> bytes: the next GET of that file sends that many bytes and drops the connection,
once), ``failing`` (files whose GET answers 500 while listed), ``gone`` (files listed but answering
404), ``corrupt`` (file -> content served in place of the listed one, whose hashes stay advertised),
``slow`` (file -> seconds between 8 KB pieces).  Every request is logged in ``requests`` as
``(method, path, Range header)``, the paths of those that carried a token in ``authorized``; ``sent``
counts the body bytes sent of each file.
"""
from __future__ import annotations

import fnmatch
import hashlib
import http.server
import json
import threading
import time
import urllib.parse

COMMIT = "0123456789abcdef0123456789abcdef01234567"
#: what the hub's default .gitattributes stores with LFS (its template), and TorchScript archives
#: (Cosmos tokenizers' repositories add ``*.jit``)
LFS_PATTERNS = ("*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gz", "*.h5", "*.joblib", "*.lfs",
                "*.mlmodel", "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot", "*.parquet", "*.pb",
                "*.pickle", "*.pkl", "*.pt", "*.pth", "*.rar", "*.safetensors", "*.tar", "*.tflite", "*.tgz",
                "*.wasm", "*.xz", "*.zip", "*.zst", "*tfevents*", "*.jit")
GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in LFS_PATTERNS).encode()
PIECE = 8192  # what a slow file sends at a time


def git_blob_sha1(data: bytes) -> str:
    """Git's object id of a file: sha1 over ``blob <size>\\0`` and the content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs(path: str, data: bytes) -> bool:
    name = path.rsplit("/", 1)[-1]
    return len(data) > 10 * 2**20 or any(fnmatch.fnmatch(name, p) for p in LFS_PATTERNS)


def tree_entry(path: str, data: bytes) -> dict:
    """A file as the tree API lists it."""
    if not is_lfs(path, data):
        return {"type": "file", "oid": git_blob_sha1(data), "size": len(data), "path": path}
    sha256 = hashlib.sha256(data).hexdigest()
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(data)}\n".encode()
    return {"type": "file", "oid": git_blob_sha1(pointer), "size": len(data), "path": path,
            "lfs": {"oid": sha256, "size": len(data), "pointerSize": len(pointer)}}


def tree(files: dict[str, bytes], recursive: bool) -> list[dict]:
    folders = sorted({"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)})
    entries = [{"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
               for d in folders] + [tree_entry(p, d) for p, d in sorted(files.items())]
    return entries if recursive else [e for e in entries if "/" not in e["path"]]


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, bytes]]):
        self.repos = repos  # repo -> {path: content}
        self.gated: set[str] = set()
        self.forbidden: set[str] = set()
        self.tokens: set[str] | None = None
        self.cut: dict[str, int] = {}
        self.failing: set[str] = set()
        self.gone: set[str] = set()
        self.corrupt: dict[str, bytes] = {}
        self.slow: dict[str, float] = {}
        self.sent: dict[str, int] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.authorized: list[str] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _error(self, status: int, code: str | None, message: str | None = None):
                body = json.dumps({"error": message or code or str(status)}).encode()
                self.send_response(status)
                if code:
                    self.send_header("X-Error-Code", code)
                if message:
                    self.send_header("X-Error-Message", message)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _route(self):
                url = urllib.parse.urlparse(self.path)
                path, query = url.path, urllib.parse.parse_qs(url.query)
                hub.requests.append((self.command, path, self.headers.get("Range")))
                if self.headers.get("Authorization"):
                    hub.authorized.append(path)
                if path.startswith("/github/"):  # raw.githubusercontent.com/OWNER/NAME/COMMIT/PATH
                    owner, name, commit, rest = (path[len("/github/"):].split("/", 3) + ["", "", ""])[:4]
                    return "raw", f"github.com/{owner}/{name}", commit, urllib.parse.unquote(rest)
                if path.startswith("/api/models/") and "/tree/" in path:
                    repo, _, rev = path[len("/api/models/"):].partition("/tree/")
                    recursive = query.get("recursive", ["false"])[0].lower() == "true"
                    return "tree", repo, urllib.parse.unquote(rev), recursive
                if path.startswith("/api/models/"):
                    repo, _, rev = path[len("/api/models/"):].partition("/revision/")
                    return "api", repo, urllib.parse.unquote(rev) or "main", None
                if "/resolve/" in path:
                    repo, _, rest = path[1:].partition("/resolve/")
                    rev, _, name = rest.partition("/")
                    return "file", repo, urllib.parse.unquote(rev), urllib.parse.unquote(name)
                return None, None, None, None

            def _check(self, repo, rev):
                auth = self.headers.get("Authorization") or ""
                if hub.tokens is not None and auth and auth.removeprefix("Bearer ") not in hub.tokens:
                    self._error(401, None, "Invalid credentials in Authorization header")
                elif repo in hub.gated:
                    self._error(401, "GatedRepo", f"Access to model {repo} is restricted. You must have access to "
                                                  "it and be authenticated to access it. Please log in.")
                elif repo in hub.forbidden:
                    self._error(403, None, "Please enable access to public gated repositories in your "
                                           "fine-grained token settings to view this repository.")
                elif repo not in hub.repos:
                    self._error(404, "RepoNotFound", "Repository not found")
                elif rev not in ("main", COMMIT):
                    self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                else:
                    return True
                return False

            def do_GET(self):
                kind, repo, rev, arg = self._route()
                if kind is None:
                    return self._error(404, "EntryNotFound")
                if kind == "raw":  # GitHub answers a missing file or repository alike: 404, no codes
                    if repo not in hub.repos or len(rev) != 40:
                        return self._error(404, None)
                    return self._file(repo, arg, send=True)
                if not self._check(repo, rev):
                    return
                if kind in ("api", "tree"):
                    files = hub.repos[repo]
                    body = json.dumps(
                        {"id": repo, "sha": COMMIT, "siblings": [{"rfilename": f} for f in files]} if kind == "api"
                        else tree(files, arg)).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self._file(repo, arg, send=True)

            def do_HEAD(self):
                kind, repo, rev, name = self._route()
                if kind != "file":
                    return self._error(404, "EntryNotFound")
                if self._check(repo, rev):
                    self._file(repo, name, send=False)

            def _file(self, repo, name, send):
                data = hub.repos[repo].get(name)
                if data is None or name in hub.gone:
                    return self._error(404, "EntryNotFound", "Entry not found")
                if send and name in hub.failing:
                    return self._error(500, None, "Internal Error")
                entry = tree_entry(name, data)
                body = hub.corrupt.get(name, data)
                start = 0
                wanted = self.headers.get("Range")
                if send and wanted and wanted.startswith("bytes="):
                    start = int(wanted[len("bytes="):].split("-")[0] or 0)
                    if start >= len(body):
                        return self._error(416, None, "Requested Range Not Satisfiable")
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", COMMIT)
                if "lfs" in entry:
                    self.send_header("ETag", f'"{entry["lfs"]["oid"]}"')
                    self.send_header("X-Linked-Etag", f'"{entry["lfs"]["oid"]}"')
                    self.send_header("X-Linked-Size", str(len(data)))
                else:
                    self.send_header("ETag", f'"{entry["oid"]}"')
                self.send_header("Content-Length", str(len(body) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                if not send:
                    return
                cut = hub.cut.pop(name, None)
                rest = body[start:] if cut is None else body[start:start + cut]
                delay = hub.slow.get(name, 0)
                step = PIECE if delay else max(len(rest), 1)
                try:
                    for at in range(0, len(rest), step):
                        piece = rest[at:at + step]
                        self.wfile.write(piece)
                        self.wfile.flush()
                        hub.sent[name] = hub.sent.get(name, 0) + len(piece)
                        if delay:
                            time.sleep(delay)
                except (BrokenPipeError, ConnectionResetError):  # the client went away
                    self.close_connection = True
                    return
                if cut is not None:  # part of the file, then the connection drops
                    self.close_connection = True

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
