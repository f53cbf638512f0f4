"""A local server that speaks the Hugging Face Hub's HTTP protocol, for the real ``huggingface_hub`` client.

What the client (huggingface_hub 2.x: ``HfApi.model_info``, ``list_repo_tree``, ``hf_hub_download``) asks:

- ``GET /api/models/ORG/NAME[/revision/REV]``: model info (``id``, ``sha``, ``siblings``);
- ``GET /api/models/ORG/NAME/tree/REV?recursive=...``: the file list with sizes (``lfs`` for weights);
- ``HEAD|GET /ORG/NAME/resolve/REV/FILE``: the file, with ``ETag``, ``X-Repo-Commit``, ``Content-Length`` and
  ``Range`` requests answered with 206;
- errors as the Hub sends them: ``X-Error-Code`` ``RepoNotFound`` / ``RevisionNotFound`` / ``EntryNotFound``
  (404) and ``GatedRepo`` (401 without the right ``Authorization: Bearer`` token).

And what a hostile or broken Hub does, per repository: a ``main`` that moves (``FakeHub.push``: the older commit
stays reachable by its sha), sizes in the file list that are not the files' (``listed_sizes``), a body longer than
the size it declares (``extra``: sent without Content-Length, then the connection closes), a model info that comes
only after ``silent_s``, a file body that trickles (``trickle``), comes at a set pace (``pace``) or never comes
(``stall``), and a redirect loop
(``redirect_loop``). Whatever waits ends once ``FakeHub.release`` is set (at the end of each test).

Every request is recorded (method, path, headers), so a test can say what was never fetched.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

# huggingface_hub fetches its AI-agent registry once a process (for its user agent) before the first request it
# makes: not a request of the code under test, so it is answered 404 (the client then detects no agent) and not
# recorded
AGENT_REGISTRY = "/api/agent-harnesses"


@dataclass
class Repo:
    files: dict[str, bytes]
    sha: str
    gated: bool = False
    older: dict[str, dict[str, bytes]] = field(default_factory=dict)  # earlier commits' files, by sha
    listed_sizes: dict[str, int] = field(default_factory=dict)  # what the file list says, where not the truth
    extra: dict[str, bytes] = field(default_factory=dict)  # sent after the file on a GET, beyond its declared size
    silent_s: float = 0.0  # the model info comes after this long
    trickle: set[str] = field(default_factory=set)  # files whose body comes a byte every 0.2 s
    pace: dict[str, int] = field(default_factory=dict)  # files whose body comes this many bytes every 0.2 s
    stall: set[str] = field(default_factory=set)  # files whose GET sends its headers, then nothing
    redirect_loop: bool = False  # every request is redirected to itself
    xet: bool = False  # files announce Xet storage, as the Hub's do: a Xet client fetches them from a CAS, not here

    def at(self, revision: str) -> dict[str, bytes] | None:
        """The files at ``revision`` (``main``, the head's sha or an older one), None for an unknown one."""
        return self.files if revision in ("main", self.sha) else self.older.get(revision)


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case


@dataclass
class FakeHub:
    """The repositories served and the requests seen; ``token`` opens gated ones; the first GET of each file in
    ``cut_once`` stops halfway (the connection closes), as a dropped download does."""

    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    token: str = "hf_test_token_for_gated"
    cut_once: set[str] = field(default_factory=set)
    release: threading.Event = field(default_factory=threading.Event)
    sent: dict[str, int] = field(default_factory=dict)  # body bytes written per file GET (the last one)

    def add(self, repo_id: str, files: dict[str, bytes], gated: bool = False) -> Repo:
        sha = hashlib.sha1(repo_id.encode() + b"".join(sorted(files.values()))).hexdigest()
        self.repos[repo_id] = Repo(dict(files), sha, gated)
        return self.repos[repo_id]

    def push(self, repo_id: str, files: dict[str, bytes]) -> str:
        """A new commit on ``main`` holding ``files``; the previous one stays reachable by its sha. The new sha."""
        repo = self.repos[repo_id]
        repo.older[repo.sha] = repo.files
        repo.files = dict(files)
        repo.sha = hashlib.sha1(repo.sha.encode() + b"".join(sorted(files.values()))).hexdigest()
        return repo.sha

    def add_folder(self, repo_id: str, folder: Path, extra: dict[str, bytes] | None = None, gated: bool = False
                   ) -> Repo:
        files = {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}
        return self.add(repo_id, {**files, **(extra or {})}, gated)

    def fetched(self, method: str = "GET") -> list[str]:
        """The files fetched with ``method`` (path in the repository), in order."""
        return [r.path.split("/resolve/", 1)[1].split("/", 1)[1] for r in self.requests
                if r.method == method and "/resolve/" in r.path]


class QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-answer (an interrupted or refused download: what the tests do) is no error: the
    standard server prints its traceback to stderr, where it hid CI's real output."""

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def bind(hub: FakeHub, port: int = 0) -> ThreadingHTTPServer:
    """A server for ``hub`` bound to 127.0.0.1:``port`` (0: a free one) but not listening yet: until ``serve``,
    connections are refused, as by a machine without the Hub."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def do_HEAD(self):
            self.answer(head=True)

        def do_GET(self):
            self.answer(head=False)

        def error(self, status: int, code: str, message: str = "") -> None:
            body = json.dumps({"error": message or code}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message or code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def json(self, value) -> None:
            body = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def repo(self, repo_id: str) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self.error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}.")
                return None
            if repo.gated and self.headers.get("Authorization") != f"Bearer {hub.token}":
                self.error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to it "
                                             "and be authenticated to access it.")
                return None
            return repo

        def revision(self, repo: Repo, revision: str) -> dict[str, bytes] | None:
            files = repo.at(revision)
            if files is None:
                self.error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return files

        def sha(self, repo: Repo, revision: str) -> str:
            return repo.sha if revision in ("main", repo.sha) else revision

        def answer(self, head: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            if path == AGENT_REGISTRY:  # the client's own fetch, once a process, whichever request comes first
                self.error(404, "EntryNotFound", "no agent registry here")
                return
            hub.requests.append(Request(self.command, path, {k.lower(): v for k, v in self.headers.items()}))
            parts = path.strip("/").split("/")
            looping = next((r for r_id, r in hub.repos.items() if r.redirect_loop and r_id in path), None)
            if looping is not None:
                self.send_response(302)
                self.send_header("Location", self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                repo_id = "/".join(parts[2:4])
                rest = parts[4:]
                repo = self.repo(repo_id)
                if repo is None:
                    return
                if rest[:1] == ["tree"] and len(rest) >= 2:
                    files = self.revision(repo, rest[1])
                    if files is not None:
                        self.json([self.entry(name, data, repo.listed_sizes.get(name))
                                   for name, data in sorted(files.items())])
                    return
                hub.release.wait(repo.silent_s)
                if not rest or (rest[0] == "revision" and len(rest) == 2 and self.revision(repo, rest[1])):
                    revision = rest[1] if rest else "main"
                    self.json({"id": repo_id, "modelId": repo_id, "sha": self.sha(repo, revision), "private": False,
                               "gated": "manual" if repo.gated else False,
                               "siblings": [{"rfilename": name} for name in sorted(repo.at(revision))]})
                elif rest and rest[0] != "revision":
                    self.error(404, "NotFound")
                return
            if len(parts) >= 5 and parts[2] == "resolve":
                repo = self.repo("/".join(parts[:2]))
                files = None if repo is None else self.revision(repo, parts[3])
                if files is None:
                    return
                name = "/".join(parts[4:])
                if name not in files:
                    self.error(404, "EntryNotFound", f"{name} does not exist")
                    return
                self.file(repo, files[name], self.sha(repo, parts[3]), name, head)
                return
            self.error(404, "NotFound")

        @staticmethod
        def entry(name: str, data: bytes, listed: int | None) -> dict:
            oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            size = len(data) if listed is None else listed
            item = {"type": "file", "oid": oid, "size": size, "path": name}
            if name.endswith((".safetensors", ".bin", ".pth", ".pt")):
                item["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": size, "pointerSize": 134}
            return item

        def file(self, repo: Repo, data: bytes, sha: str, name: str, head: bool) -> None:
            start = 0
            wanted = self.headers.get("Range", "")
            if wanted.startswith("bytes=") and not head:
                start = int(wanted[len("bytes="):].split("-")[0] or 0)
            self.send_response(206 if start else 200)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("X-Repo-Commit", sha)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            if repo.xet:  # its CAS token route: nothing serves it here (a Xet transfer fails, one over HTTP works)
                self.send_header("X-Xet-Hash", hashlib.sha256(data).hexdigest())
                self.send_header("X-Xet-Refresh-Route", f"http://{self.headers['Host']}/api/xet-read-token/{sha}")
            extra = repo.extra.get(name, b"") if not head else b""
            if extra:  # a body longer than declared: no length, the end of the connection ends it
                self.close_connection = True
                self.send_header("Connection", "close")
            else:
                self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if head:
                return
            if name in repo.stall:
                hub.release.wait(120)
                self.close_connection = True
                return
            paced = 1 if name in repo.trickle else repo.pace.get(name)
            if extra or paced:
                self.send_slowly(name, data[start:] + extra, paced)
                return
            if name in hub.cut_once:
                hub.cut_once.discard(name)
                self.wfile.write(data[start:start + (len(data) - start) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(data[start:])

        def send_slowly(self, name: str, body: bytes, paced: int | None) -> None:
            """``body`` in pieces of ``paced`` bytes every 0.2 s (at once in 64 kB pieces without), counted in
            ``hub.sent``, until the client hangs up or ``hub.release`` sends the rest at once."""
            # Counted here, then stored: the next test's ``fake_hub`` clears ``hub.sent`` while a client of this
            # one may still be reading
            sent = hub.sent[name] = 0
            try:
                while sent < len(body):
                    if paced and not hub.release.wait(0.2):
                        chunk = body[sent:sent + paced]
                    else:
                        chunk = body[sent:sent + (1 << 16)]
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    sent += len(chunk)
                    hub.sent[name] = sent
            except OSError:  # the client stopped reading
                self.close_connection = True

    server = QuietServer(("127.0.0.1", port), Handler, bind_and_activate=False)
    server.daemon_threads = True
    server.server_bind()
    return server


def serve(server: ThreadingHTTPServer) -> str:
    """Start answering on ``server`` (from ``bind``) in a daemon thread; its URL."""
    server.server_activate()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"
