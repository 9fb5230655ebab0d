"""A Hugging Face hub on a loopback port, for huggingface_hub's real client (`HF_ENDPOINT`).

It answers what `snapshot_download` and `hf_hub_download` ask of the real hub:

- `GET /api/models/{repo}/revision/{rev}`: the model's info, `sha` its commit;
- `GET /api/models/{repo}/tree/{rev}?recursive=True`: every file and folder, a file with its
  size and git blob id (`oid`), an LFS file also with `lfs: {oid: sha256, size, pointerSize}`;
- `HEAD` / `GET /{repo}/resolve/{rev}/{path}`: the file, with `X-Repo-Commit`, an `ETag` (the
  blob id, or for LFS files the sha256, also as `X-Linked-Etag` with `X-Linked-Size`, as the
  hub sends them for a file stored in LFS).

Its repo holds Kokoro's layout (`config.json`, `kokoro-v1_0.pth`, `voices/*.pt`), the English
packs being copies of the registry's real packs saved as `torch.save` saves the hub's, so what
a model server voices with them is real speech. Every request is recorded (`requests`), and a
file can be served `cut` (a short body, the headers honest: the client sees it) or `lying`
(the short body announced as the whole file by the resolve route, the listing still right).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from model_server.engine_choice import HUB_REPO
from model_server.engines.voices import load_packaged
from model_server.engines.weights import packaged_voices_file
from tests.support.servers import RunningServer, serve

COMMIT = "0123456789abcdef0123456789abcdef01234567"
# English names for the registry's packs; jm_kumo (the registry's best English reader) is
# af_heart, so af_heart's audio can be compared with jm_kumo's, sample for sample
ENGLISH = {
    "af_heart": "jm_kumo",
    "af_bella": "jf_alpha",
    "am_michael": "jf_nezumi",
    "bf_emma": "jf_gongitsune",
    "bm_george": "jf_tebukuro",
}
OTHERS = {"jf_alpha": "jf_alpha", "zf_xiaobei": "jf_nezumi"}  # in the repo, not English


def saved_pack(pack: np.ndarray) -> bytes:
    """A pack as the hub's voices/*.pt hold it: `torch.save` of a float32 tensor."""
    import torch

    out = io.BytesIO()
    torch.save(torch.from_numpy(np.ascontiguousarray(pack, dtype=np.float32)), out)
    return out.getvalue()


def kokoro_repo() -> dict[str, bytes]:
    registry = load_packaged(packaged_voices_file().read_bytes())
    files = {
        "config.json": b'{"note": "a stand-in: the onnx engine never fetches it"}\n',
        "kokoro-v1_0.pth": b"weights the onnx engine never fetches",
    }
    for name, source in {**ENGLISH, **OTHERS}.items():
        files[f"voices/{name}.pt"] = saved_pack(registry[source])
    return files


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _is_lfs(path: str) -> bool:
    return path.endswith((".pt", ".pth"))


@dataclass
class FakeHub:
    files: dict[str, bytes]
    repo: str = HUB_REPO
    commit: str = COMMIT
    cut: set[str] = field(default_factory=set)
    lying: set[str] = field(default_factory=set)
    requests: list[tuple[str, str]] = field(default_factory=list)

    def downloads(self) -> list[str]:
        """The files fetched whole (GET of resolve), in order."""
        prefix = f"/{self.repo}/resolve/"
        return [
            p.split("/", 5)[-1] for m, p in self.requests if m == "GET" and p.startswith(prefix)
        ]

    def entry(self, path: str) -> dict[str, object]:
        data = self.files[path]
        item: dict[str, object] = {
            "type": "file",
            "oid": _git_blob_id(data),
            "size": len(data),
            "path": path,
        }
        if _is_lfs(path):
            lfs = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            item["lfs"] = lfs
        return item

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.middleware("http")
        async def record(request: Request, call_next):  # type: ignore[no-untyped-def]
            self.requests.append((request.method, request.url.path))
            return await call_next(request)

        def not_found(code: str) -> Response:
            return JSONResponse({"error": code}, 404, headers={"X-Error-Code": code})

        @app.get("/api/models/{org}/{name}/revision/{revision}")
        async def model_info(org: str, name: str, revision: str) -> Response:
            if f"{org}/{name}" != self.repo:
                return not_found("RepoNotFound")
            if revision not in ("main", self.commit):
                return not_found("RevisionNotFound")
            siblings = [{"rfilename": p} for p in sorted(self.files)]
            body = {"id": self.repo, "sha": self.commit, "private": False, "siblings": siblings}
            return JSONResponse(body)

        @app.get("/api/models/{org}/{name}/tree/{revision}")
        async def tree(org: str, name: str, revision: str) -> Response:
            if f"{org}/{name}" != self.repo or revision not in ("main", self.commit):
                return not_found("RevisionNotFound")
            folders = sorted({p.rsplit("/", 1)[0] for p in self.files if "/" in p})
            items: list[dict[str, object]] = [
                {"type": "directory", "oid": _git_blob_id(f.encode()), "size": 0, "path": f}
                for f in folders
            ]
            items += [self.entry(p) for p in sorted(self.files)]
            return JSONResponse(items)

        @app.api_route("/{org}/{name}/resolve/{revision}/{path:path}", methods=["GET", "HEAD"])
        async def resolve(
            org: str, name: str, revision: str, path: str, request: Request
        ) -> Response:
            if f"{org}/{name}" != self.repo:
                return not_found("RepoNotFound")
            if revision not in ("main", self.commit):
                return not_found("RevisionNotFound")
            if path not in self.files:
                return not_found("EntryNotFound")
            data = self.files[path]
            entry = self.entry(path)
            announced = data
            if path in self.cut or path in self.lying:
                data = data[: len(data) // 2]
            if path in self.lying:
                announced = data
            headers = {"X-Repo-Commit": self.commit, "Accept-Ranges": "bytes"}
            if _is_lfs(path):
                sha256 = str(entry["lfs"]["oid"])  # type: ignore[index]
                headers["ETag"] = f'"{sha256}"'
                headers["X-Linked-Etag"] = f'"{sha256}"'
                headers["X-Linked-Size"] = str(len(announced))
            else:
                headers["ETag"] = f'"{entry["oid"]}"'
            if request.method == "HEAD":
                headers["Content-Length"] = str(len(announced))
                return Response(b"", headers=headers)
            return Response(data, headers=headers, media_type="application/octet-stream")

        return app


@contextmanager
def serve_hub(hub: FakeHub) -> Iterator[RunningServer]:
    with serve(hub.app()) as running:
        yield running
