"""A loopback HTTP server that speaks the part of the Hugging Face Hub API that snapshot downloads use.

It serves package directories from disk: the tree listing, revision info, the file-resolve
endpoint (HEAD + GET with the commit, etag and size headers), and a repo's refs and commit listing
(every published commit of a repo on `main`, newest first, paginated with a Link header as the Hub does). It is a test peer, not a mock of
runtime code: the runtime's real huggingface_hub client talks HTTP to it.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlparse


def git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


PINNED_REVISION = "0123456789abcdef" * 2 + "01234567"  # a full 40-hex commit the tests pin their loopback repos at


class HubServer:
    def __init__(self) -> None:
        self.repos: dict[tuple[str, str], Path] = {}
        self.requests: list[str] = []
        self.unavailable = 0  # the next this-many repository listings answer 503 (a Hub that is briefly down)
        self.listing_delay_s = 0.0  # a slow Hub: each repository listing answers after this long
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add(self, repo_id: str, revision: str, root: Path) -> None:
        self.repos[(repo_id, revision)] = Path(root)

    def commits(self, repo_id: str) -> list[str]:
        return [revision for repo, revision in reversed(list(self.repos)) if repo == repo_id]

    def __enter__(self) -> "HubServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _files(self, root: Path) -> list[Path]:
        return sorted(p for p in root.rglob("*") if p.is_file())

    def _entry(self, root: Path, path: Path) -> dict:
        data = path.read_bytes()
        entry = {"type": "file", "oid": git_blob_oid(data), "size": len(data), "path": path.relative_to(root).as_posix()}
        if path.suffix == ".safetensors":
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None, head: bool = False) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _json(self, status: int, value: object) -> None:
                self._send(status, json.dumps(value).encode(), {"Content-Type": "application/json"})

            def _not_found(self, head: bool = False) -> None:
                self._send(404, b'{"error":"Repository not found"}', {"X-Error-Code": "RepoNotFound", "Content-Type": "application/json"}, head)

            def _commit_page(self, repo: str, commits: list[str], page: int) -> None:
                size = 2  # small pages, so the client's pagination is exercised
                items = [
                    {"id": c, "title": f"commit {c[:8]}", "message": "", "authors": [{"user": "test"}], "date": "2026-01-01T00:00:00.000Z"}
                    for c in commits[page * size : (page + 1) * size]
                ]
                headers = {"Content-Type": "application/json"}
                if (page + 1) * size < len(commits):
                    headers["Link"] = f'<{hub.endpoint}/api/models/{repo}/commits/main?p={page + 1}>; rel="next"'
                self._send(200, json.dumps(items).encode(), headers)

            def _route(self, head: bool) -> None:
                hub.requests.append(f"{self.command} {self.path}")
                if hub.listing_delay_s and "/tree/" in self.path:
                    time.sleep(hub.listing_delay_s)
                if hub.unavailable > 0 and "/tree/" in self.path:
                    hub.unavailable -= 1
                    hub.requests[-1] += " -> 503"
                    return self._send(503, b'{"error":"Service Unavailable"}', {"Content-Type": "application/json"}, head)
                url = urlparse(self.path)
                parts = [unquote(p) for p in url.path.strip("/").split("/")]
                if parts[:2] == ["api", "models"] and len(parts) >= 5 and parts[4] in ("commits", "refs"):
                    repo = "/".join(parts[2:4])
                    commits = hub.commits(repo)
                    if not commits:
                        return self._not_found()
                    if parts[4] == "refs":
                        return self._json(200, {"branches": [{"name": "main", "ref": "refs/heads/main", "targetCommit": commits[0]}], "tags": [], "converts": []})
                    return self._commit_page(repo, commits, int(dict(parse_qsl(url.query)).get("p", "0")))
                if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("tree", "revision"):
                    repo, kind, revision = "/".join(parts[2:4]), parts[4], parts[5]
                    root = hub.repos.get((repo, revision))
                    if root is None:
                        return self._not_found()
                    if kind == "revision":
                        return self._json(200, {"id": repo, "sha": revision, "siblings": [{"rfilename": p.relative_to(root).as_posix()} for p in hub._files(root)]})
                    return self._json(200, [hub._entry(root, p) for p in hub._files(root)])
                if len(parts) >= 5 and parts[2] == "resolve":
                    repo, revision, rel = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                    root = hub.repos.get((repo, revision))
                    path = root / rel if root else None
                    if path is None or not path.is_file():
                        return self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, head)
                    data = path.read_bytes()
                    entry = hub._entry(root, path)
                    etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
                    headers = {"X-Repo-Commit": revision, "ETag": f'"{etag}"', "Content-Type": "application/octet-stream"}
                    if "lfs" in entry:
                        headers["X-Linked-Etag"] = f'"{etag}"'
                        headers["X-Linked-Size"] = str(len(data))
                    return self._send(200, data, headers, head)
                self._not_found(head)

            def do_GET(self) -> None:
                self._route(head=False)

            def do_HEAD(self) -> None:
                self._route(head=True)

        return Handler
