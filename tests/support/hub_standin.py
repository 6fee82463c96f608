"""A stand-in for the Hugging Face model hub on loopback, counting what it is asked.

No real hub is reachable from the test machines, so this is the one double of the model cache
proof. It serves local model folders as hub repositories, in the shape huggingface_hub 2.x
reads (`HF_ENDPOINT=http://127.0.0.1:PORT` points the client, and vLLM through it, here):

- `GET /api/models/{repo}/revision/{rev}`      repo_info: `sha` (the commit) and `siblings`
- `GET /api/models/{repo}/tree/{rev}[/{dir}]`  list_repo_tree / list_repo_files (one page)
- `POST /api/models/{repo}/paths-info/{rev}`   get_paths_info
- `HEAD|GET /{repo}/resolve/{rev}/{file}`      file metadata (`X-Repo-Commit`, `ETag`,
  `X-Linked-Etag`/`X-Linked-Size` for LFS files) and content (`Range` honoured)

Unknown repos, revisions and files answer 404 with the hub's `X-Error-Code` (`RepoNotFound`,
`RevisionNotFound`, `EntryNotFound`), which the client turns into its own exceptions (an
optional file such as `generation_config.json` is then skipped, as on the real hub). Files
count as LFS like on the hub (weights, and anything of 10 MiB or more): their ETag is the
SHA-256 of the content, other files' the git blob SHA-1. The commit is a digest of the whole
folder, so it changes when any file does.

Every request is recorded (`requests`: method, path, status, bytes sent); `downloads()` counts
the file bodies served. Tests check it against the real client: `huggingface_hub`'s own
`snapshot_download` must reproduce the folder byte for byte
(tests/engine/test_model_cache.py). Standard library only; also a CLI:
`PYTHONPATH=tests python -m support.hub_standin --repo org/name=DIR --port 0`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from support import http_thread

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")
LFS_MIN_SIZE = 10 * 1024 * 1024
MAIN = "main"


@dataclass(frozen=True)
class RepoFile:
    path: str
    size: int
    blob_oid: str  # git blob SHA-1
    sha256: str
    lfs: bool

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.blob_oid

    def tree_entry(self) -> dict[str, object]:
        entry: dict[str, object] = {
            "type": "file", "oid": self.blob_oid, "size": self.size, "path": self.path,
        }
        if self.lfs:
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": 134}
        return entry


@dataclass
class Repo:
    repo_id: str
    folder: Path
    files: dict[str, RepoFile] = field(default_factory=dict)
    commit: str = ""

    @classmethod
    def load(cls, repo_id: str, folder: Path) -> Repo:
        repo = cls(repo_id, folder)
        digest = hashlib.sha1(repo_id.encode())
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            rel = path.relative_to(folder).as_posix()
            if rel.startswith(".") or "/." in rel:
                continue  # hidden files (.cache/ of a local download) are not part of a repo
            data = path.read_bytes()
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            lfs = rel.endswith(LFS_SUFFIXES) or len(data) >= LFS_MIN_SIZE
            repo.files[rel] = RepoFile(rel, len(data), blob, hashlib.sha256(data).hexdigest(), lfs)
            digest.update(rel.encode() + b"\0" + blob.encode())
        repo.commit = digest.hexdigest()
        return repo

    def revision_ok(self, revision: str) -> bool:
        return revision in (MAIN, self.commit)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    status: int
    body_bytes: int


class HubStandIn:
    """`with HubStandIn({"org/name": folder}) as hub:` → `hub.endpoint`, `hub.requests`."""

    def __init__(self, repos: dict[str, Path], host: str = "127.0.0.1", port: int = 0) -> None:
        self.repos = {rid: Repo.load(rid, Path(folder)) for rid, folder in repos.items()}
        self.host, self.port = host, port
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- what it was asked ------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        assert self._server is not None, "not started"
        return f"http://{self.host}:{self._server.server_address[1]}"

    def snapshot(self) -> list[Request]:
        with self._lock:
            return list(self.requests)

    def downloads(self, since: int = 0) -> dict[str, int]:
        """File bodies served (GET .../resolve/... answered 200 or 206), per file."""
        out: dict[str, int] = {}
        for r in self.snapshot()[since:]:
            if r.method == "GET" and "/resolve/" in r.path and r.status in (200, 206):
                name = r.path.split("/resolve/", 1)[1].split("/", 1)[1]
                out[name] = out.get(name, 0) + 1
        return out

    def bytes_served(self, since: int = 0) -> int:
        return sum(r.body_bytes for r in self.snapshot()[since:])

    def _record(self, method: str, path: str, status: int, sent: int) -> None:
        with self._lock:
            self.requests.append(Request(method, path, status, sent))

    # -- routing ----------------------------------------------------------------------------
    def _repo_and_rest(self, parts: list[str]) -> tuple[Repo | None, list[str]]:
        if len(parts) >= 2:
            repo = self.repos.get(f"{parts[0]}/{parts[1]}")
            if repo is not None:
                return repo, parts[2:]
        return None, parts

    def handle(self, method: str, raw_path: str, headers: dict[str, str], body: bytes
               ) -> tuple[int, dict[str, str], bytes]:
        split = urlsplit(raw_path)
        parts = [unquote(p) for p in split.path.strip("/").split("/")]
        if parts[:2] == ["api", "models"]:
            repo, rest = self._repo_and_rest(parts[2:])
            if repo is None:
                return _error(404, "RepoNotFound", "Repository not found")
            return self._api(method, repo, rest, body)
        repo, rest = self._repo_and_rest(parts)
        if repo is None:
            return _error(404, "RepoNotFound", "Repository not found")
        if len(rest) >= 3 and rest[0] == "resolve":
            return self._resolve(method, repo, rest[1], "/".join(rest[2:]), headers)
        return _error(404, None, "Not found")

    def _api(self, method: str, repo: Repo, rest: list[str], body: bytes
             ) -> tuple[int, dict[str, str], bytes]:
        if len(rest) >= 2 and rest[0] in ("revision", "tree", "paths-info"):
            revision = rest[1]
            if not repo.revision_ok(revision):
                return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            if rest[0] == "revision" and method == "GET":
                return _json(
                    {
                        "_id": repo.commit[:24], "id": repo.repo_id, "modelId": repo.repo_id,
                        "sha": repo.commit, "private": False, "disabled": False,
                        "gated": False, "downloads": 0, "likes": 0, "tags": [],
                        "lastModified": "2026-12-01T00:00:00.000Z",
                        "siblings": [{"rfilename": p} for p in repo.files],
                    }
                )
            if rest[0] == "tree" and method == "GET":
                prefix = "/".join(rest[2:]).strip("/")
                return _json(_tree(repo, prefix))
            if rest[0] == "paths-info" and method == "POST":
                wanted = parse_qs(body.decode()).get("paths", [])
                if not wanted and body.startswith(b"{"):
                    wanted = list(json.loads(body).get("paths", []))
                return _json([repo.files[p].tree_entry() for p in wanted if p in repo.files])
        return _error(404, None, "Not found")

    def _resolve(self, method: str, repo: Repo, revision: str, name: str,
                 headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if method not in ("GET", "HEAD"):
            return _error(405, None, "Method not allowed")
        if not repo.revision_ok(revision):
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        entry = repo.files.get(name)
        if entry is None:
            out = _error(404, "EntryNotFound", f"{name} does not exist on {revision}")
            out[1]["X-Repo-Commit"] = repo.commit
            return out
        meta = {
            "X-Repo-Commit": repo.commit,
            "ETag": f'"{entry.etag}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if entry.lfs:
            meta["X-Linked-Etag"] = f'"{entry.etag}"'
            meta["X-Linked-Size"] = str(entry.size)
        if method == "HEAD":
            meta["Content-Length"] = str(entry.size)
            return 200, meta, b""
        data = (repo.folder / name).read_bytes()
        start, end = _range(headers.get("range"), len(data))
        if start is None:
            return 200, meta, data
        meta["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        return 206, meta, data[start:end + 1]

    # -- server -----------------------------------------------------------------------------
    def start(self) -> HubStandIn:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                lowered = {k.lower(): v for k, v in self.headers.items()}
                status, meta, data = hub.handle(self.command, self.path, lowered, body)
                self.send_response(status)
                for key, value in meta.items():
                    self.send_header(key, value)
                if "Content-Length" not in meta:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                sent = 0
                if self.command != "HEAD":
                    self.wfile.write(data)
                    sent = len(data)
                hub._record(self.command, urlsplit(self.path).path, status, sent)

            do_GET = do_HEAD = do_POST = _serve

        self._server, self._thread = http_thread.start(self.host, self.port, Handler, "hub-standin")
        return self

    def stop(self) -> None:
        http_thread.stop(self._server, self._thread)
        self._server = None

    def __enter__(self) -> HubStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _tree(repo: Repo, prefix: str) -> list[dict[str, object]]:
    """Every file under `prefix`, recursively, plus the folders on the way (as the hub lists
    with recursive=true)."""
    files = [f for p, f in repo.files.items() if not prefix or p.startswith(prefix + "/")]
    folders = sorted({"/".join(f.path.split("/")[:i]) for f in files
                      for i in range(1, f.path.count("/") + 1)})
    out: list[dict[str, object]] = [
        {"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
        for d in folders if d != prefix
    ]
    return out + [f.tree_entry() for f in files]


def _range(header: str | None, size: int) -> tuple[int | None, int]:
    if not header or not header.startswith("bytes="):
        return None, size - 1
    first, _, last = header[6:].split(",")[0].partition("-")
    if not first:  # suffix range: the last N bytes
        return max(size - int(last), 0), size - 1
    return int(first), min(int(last), size - 1) if last else size - 1


def _json(value: object) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "application/json"}, json.dumps(value).encode()


def _error(status: int, code: str | None, message: str) -> tuple[int, dict[str, str], bytes]:
    meta = {"Content-Type": "application/json", "X-Error-Message": message}
    if code:
        meta["X-Error-Code"] = code
    return status, meta, json.dumps({"error": message}).encode()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repo", action="append", required=True, metavar="ORG/NAME=DIR")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    repos = dict(item.split("=", 1) for item in args.repo)
    hub = HubStandIn({k: Path(v) for k, v in repos.items()}, args.host, args.port).start()
    print(f"HF_ENDPOINT={hub.endpoint}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        hub.stop()


if __name__ == "__main__":
    main()
