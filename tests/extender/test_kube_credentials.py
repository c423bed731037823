"""RestKube re-reads its credentials: a kubeconfig's tokenFile rotated under it is picked up on
the first 401 (the request is sent once more) and at least every REFRESH_S; a source that
cannot be read keeps the last good token."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from extender import kube
from extender.kube import ApiError, RestKube


class Api(http.server.ThreadingHTTPServer):
    valid = "token-a"
    seen: list[str]


class Handler(http.server.BaseHTTPRequestHandler):
    server: Api

    def do_GET(self) -> None:
        got = self.headers.get("Authorization", "")
        self.server.seen.append(got)
        ok = got == f"Bearer {self.server.valid}"
        body = b'{"kind":"NodeList","items":[]}' if ok else b'{"kind":"Status","code":401}'
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def api() -> Iterator[Api]:
    server = Api(("127.0.0.1", 0), Handler)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def kubeconfig(tmp_path: Path, port: int) -> Path:
    (tmp_path / "token").write_text("token-a\n")
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"tokenFile": str(tmp_path / "token")}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


def test_a_rotated_token_file_is_picked_up_on_the_first_401(api: Api, tmp_path: Path) -> None:
    k = RestKube.from_kubeconfig(str(kubeconfig(tmp_path, api.server_port)))
    assert k.request("GET", "/api/v1/nodes").status == 200
    (tmp_path / "token").write_text("token-b\n")  # kubelet rotated the projected token
    api.valid = "token-b"  # and the old one expired
    assert k.request("GET", "/api/v1/nodes").status == 200
    assert api.seen[-2:] == ["Bearer token-a", "Bearer token-b"]


def test_a_watch_refused_with_401_reads_the_token_again_for_its_retry(api: Api, tmp_path: Path) -> None:
    k = RestKube.from_kubeconfig(str(kubeconfig(tmp_path, api.server_port)))
    (tmp_path / "token").write_text("token-b\n")
    api.valid = "token-b"
    with pytest.raises(ApiError):
        list(k.stream("/api/v1/nodes", {"watch": "1"}))
    assert k.headers["Authorization"] == "Bearer token-b"


def test_tokens_are_re_read_every_refresh_period(api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube, "REFRESH_S", 0.0)
    k = RestKube.from_kubeconfig(str(kubeconfig(tmp_path, api.server_port)))
    (tmp_path / "token").write_text("token-b\n")
    k.request("GET", "/api/v1/nodes")
    assert api.seen == ["Bearer token-b"]  # before any 401


def test_an_unreadable_source_keeps_the_last_good_token(api: Api, tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, api.server_port)
    k = RestKube.from_kubeconfig(str(path))
    path.write_text("{not: yaml: at all")
    assert not k.refresh_credentials()
    assert k.request("GET", "/api/v1/nodes").status == 200
    assert api.seen == ["Bearer token-a"]


def test_a_refused_token_that_did_not_change_is_not_retried(api: Api, tmp_path: Path) -> None:
    k = RestKube.from_kubeconfig(str(kubeconfig(tmp_path, api.server_port)))
    api.valid = "someone-else"
    assert k.request("GET", "/api/v1/nodes").status == 401
    assert len(api.seen) == 1
