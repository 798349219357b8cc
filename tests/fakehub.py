"""A loopback stand-in for the Hugging Face hub: the part of its protocol huggingface_hub uses to
download one file, so tests reach it through HF_ENDPOINT with no network. (Holds no tests.)

- `GET /api/models/ORG/NAME/revision/REV`: the model info (commit sha, files with sizes and LFS
  sha256); an unknown repo or revision is a 404 with the hub's `X-Error-Code`.
- `HEAD|GET /ORG/NAME/resolve/REV/FILE`: a 302 to the "CDN" with `X-Repo-Commit`,
  `X-Linked-Etag` and `X-Linked-Size`, as the hub answers for LFS files. The CDN is this same
  server reached as `localhost` (another origin, as a real CDN is), so huggingface_hub reads the
  metadata from the redirect itself and does not forward credentials.
- `GET /cdn/SHA256`: the file's bytes, honouring `Range` (206 + `Content-Range`).

`cut_after` makes the CDN drop the connection after that many bytes of a file and then answer
nothing at all (the network gone mid-download) until `cut_after` is reset. Every request is
logged, with the bytes of file content each one was sent.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

CHUNK = 64 * 1024


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str = ""

    def __post_init__(self) -> None:
        digest = hashlib.sha1(b"".join(self.files.values()))
        self.commit = self.commit or digest.hexdigest()


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    body_bytes: int = 0


@dataclass
class FakeHub:
    repos: dict[str, Repo]
    cut_after: int | None = None
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._served = 0  # bytes of file content sent since cut_after was set
        self._blobs = {hashlib.sha256(data).hexdigest(): data for r in self.repos.values() for data in r.files.values()}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()

    def file_bytes_sent(self, data: bytes) -> int:
        """Bytes of `data`'s content sent over all requests."""
        path = f"/cdn/{hashlib.sha256(data).hexdigest()}"
        return sum(r.body_bytes for r in self.requests if r.path == path)

    def cut(self, after: int | None) -> None:
        self.cut_after, self._served = after, 0


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._route(head=True)

        def do_GET(self) -> None:
            self._route(head=False)

        def _route(self, head: bool) -> None:
            try:
                self._answer(head)
            except (BrokenPipeError, ConnectionResetError):  # the client went away: so be it
                self.close_connection = True

        def _answer(self, head: bool) -> None:
            path = urlsplit(self.path).path
            self.record = Request(self.command, path, self.headers.get("Range"))
            hub.requests.append(self.record)
            if hub.cut_after is not None and hub._served >= hub.cut_after:
                self.close_connection = True  # the network is gone: no answer at all
                return
            if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path):
                self._model_info(m[1], unquote(m[2]))
            elif m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                self._resolve(m[1], unquote(m[2]), unquote(m[3]))
            elif m := re.fullmatch(r"/cdn/([0-9a-f]{64})", path):
                self._cdn(m[1], head)
            else:
                self._send(404, b"not found", {"X-Error-Code": "EntryNotFound"})

        def _repo(self, repo_id: str, revision: str) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._send(404, b'{"error":"Repository not found"}',
                           {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"})
            elif revision not in ("main", repo.commit):
                self._send(404, b'{"error":"Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"})
            else:
                return repo
            return None

        def _model_info(self, repo_id: str, revision: str) -> None:
            if (repo := self._repo(repo_id, revision)) is None:
                return
            siblings = [
                {"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest(),
                 "lfs": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}}
                for name, data in repo.files.items()
            ]
            body = json.dumps({"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False,
                               "siblings": siblings}).encode()
            self._send(200, body, {"Content-Type": "application/json"})

        def _resolve(self, repo_id: str, revision: str, filename: str) -> None:
            if (repo := self._repo(repo_id, revision)) is None:
                return
            if filename not in repo.files:
                self._send(404, b"entry not found", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.commit})
                return
            data = repo.files[filename]
            sha = hashlib.sha256(data).hexdigest()
            self._send(302, b"", {
                "Location": f"http://localhost:{hub.port}/cdn/{sha}",
                "X-Repo-Commit": repo.commit,
                "X-Linked-Etag": f'"{sha}"',
                "X-Linked-Size": str(len(data)),
                "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
            })

        def _cdn(self, sha: str, head: bool) -> None:
            data = hub._blobs.get(sha)
            if data is None:
                self._send(404, b"no such blob")
                return
            start, end, status = 0, len(data) - 1, 200
            headers = {"ETag": f'"{sha}"', "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
            if m := re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "")):
                start, end, status = int(m[1]), min(int(m[2] or end), end), 206
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            self._send(status, data[start : end + 1], headers, head=head, cuttable=True)

        def _send(self, status: int, body: bytes, headers: dict | None = None, head: bool = False,
                  cuttable: bool = False) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if head:
                return
            for i in range(0, len(body), CHUNK):
                piece = body[i : i + CHUNK]
                if cuttable and hub.cut_after is not None:
                    piece = piece[: max(0, hub.cut_after - hub._served)]
                    hub._served += len(piece)
                self.wfile.write(piece)
                self.record.body_bytes += len(piece)
                if len(piece) < len(body[i : i + CHUNK]):  # cut: drop the connection mid-body
                    self.wfile.flush()
                    self.close_connection = True
                    return

    return Handler
