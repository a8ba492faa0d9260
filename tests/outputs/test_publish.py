"""Publishing, against a local stand-in for the Hub's HTTP API that records what it is sent."""

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from opsynth.commands.cli import main
from opsynth.errors import UsageError
from opsynth.outputs.publish import publish

TOKEN = "hf_test_token_that_must_never_be_printed"


class _FakeHub(BaseHTTPRequestHandler):
    commits: ClassVar[list] = []  # (path, NDJSON lines) of every commit received
    created: ClassVar[list] = []  # bodies of every repository creation

    def _reply(self, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        assert self.headers.get("Authorization") == f"Bearer {TOKEN}"
        if self.path == "/api/repos/create":
            body = json.loads(data)
            self.created.append(body)
            self._reply({"url": f"http://{self.headers['Host']}/datasets/{body['organization']}/{body['name']}"})
        elif self.path == "/api/validate-yaml":
            self._reply({"errors": [], "warnings": []})
        elif "/preupload/" in self.path:
            files = json.loads(data)["files"]
            self._reply({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]})
        elif "/commit/" in self.path:
            lines = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
            self.commits.append((self.path, lines))
            self._reply({"commitUrl": f"http://{self.headers['Host']}/datasets/acme/x/commit/abc", "commitOid": "abc"})
        else:
            self.send_error(404)

    def log_message(self, *args):
        pass


@pytest.fixture()
def hub(monkeypatch):
    _FakeHub.commits, _FakeHub.created = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture()
def dataset_folder(tiny_reference):
    """A finished run's folder: the test session's small CPU run, which publishing only reads."""
    return tiny_reference


def test_upload_is_one_commit_of_every_file_but_the_run_state(dataset_folder, hub, capsys):
    plan = publish(str(dataset_folder), "acme/x", private=True, endpoint=hub)
    (created,) = _FakeHub.created
    assert (created["name"], created.get("organization"), created["type"]) == ("x", "acme", "dataset")
    assert len(_FakeHub.commits) == 1
    path, lines = _FakeHub.commits[0]
    assert path == "/api/datasets/acme/x/commit/main"
    uploaded = {line["value"]["path"]: line["value"] for line in lines if line["key"] == "file"}
    assert set(uploaded) == set(plan.files)
    assert {"README.md", "stats.json", "data/train-00000-of-00001.parquet"} <= set(uploaded)
    assert not any(p.startswith(".opsynth") for p in uploaded)
    # the card as written, its load example naming the repository rather than the local folder
    card = base64.b64decode(uploaded["README.md"]["content"]).decode()
    local = (dataset_folder / "README.md").read_text()
    assert 'load_dataset("acme/x", split="train")' in card and "acme/x" not in local
    assert card == local.replace(json.dumps(str(dataset_folder)), '"acme/x"')
    captured = capsys.readouterr()
    assert TOKEN not in captured.out + captured.err


def test_dry_run_works_offline_and_uploads_nothing(dataset_folder, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert main(["publish", str(dataset_folder), "--repo-id", "acme/x", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run: nothing uploaded" in out and "data/train-00000-of-00001.parquet" in out


@pytest.mark.parametrize("repo_id", ["no-slash", "a/b/c", "/x", "acme/"])
def test_bad_repo_ids_are_usage_errors(dataset_folder, repo_id):
    with pytest.raises(UsageError, match="ORG/NAME"):
        publish(str(dataset_folder), repo_id, dry_run=True)


def test_folders_that_are_not_finished_datasets_are_refused(tmp_path, capsys):
    assert main(["publish", str(tmp_path / "missing"), "--repo-id", "acme/x", "--dry-run"]) == 2
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "README.md").write_text("hello")
    assert main(["publish", str(tmp_path / "half"), "--repo-id", "acme/x", "--dry-run"]) == 2
    assert "finished" in capsys.readouterr().err


def test_no_token_is_a_usage_error(dataset_folder, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # no cached login either
    with pytest.raises(UsageError, match="hf auth login"):
        publish(str(dataset_folder), "acme/x", endpoint="http://127.0.0.1:9")


class _EchoingHub(BaseHTTPRequestHandler):
    """A server whose error body repeats the request's headers, the token among them."""

    def do_POST(self):
        body = json.dumps({"error": f"bad request; headers were: {dict(self.headers)}"}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_server_that_echoes_the_token_never_gets_it_printed(dataset_folder, monkeypatch):
    from opsynth.errors import OpsynthError

    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoingHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    try:
        with pytest.raises(OpsynthError) as failed:
            publish(str(dataset_folder), "acme/x", endpoint=f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
    assert "Bearer ***" in str(failed.value), str(failed.value)
    assert TOKEN not in str(failed.value) and "hf_test" not in str(failed.value)


def test_every_config_the_card_lists_must_load(dataset_folder, tmp_path, capsys):
    """This small run rejected nothing: its card lists no rejected config (`datasets` cannot load a split of no
    rows) and it publishes. A card that lists one whose shard is empty is refused."""
    import shutil

    import pyarrow.parquet as pq
    import yaml

    from opsynth.outputs.schema import REJECTED_SCHEMA

    card = (dataset_folder / "README.md").read_text()
    assert not list((dataset_folder / "rejected").glob("*.parquet")) and "config_name: rejected" not in card
    assert main(["publish", str(dataset_folder), "--repo-id", "acme/x", "--dry-run"]) == 0
    broken = tmp_path / "broken"
    shutil.copytree(dataset_folder, broken)
    pq.write_table(REJECTED_SCHEMA.empty_table(), broken / "rejected" / "rejected-00000-of-00001.parquet")
    _, front, body = card.split("---", 2)
    meta = yaml.safe_load(front)
    meta["configs"].append({"config_name": "rejected", "data_files": [{"split": "train", "path": "rejected/*"}]})
    (broken / "README.md").write_text("---\n" + yaml.safe_dump(meta, sort_keys=False) + "---" + body)
    capsys.readouterr()
    assert main(["publish", str(broken), "--repo-id", "acme/x", "--dry-run"]) == 2
    assert "does not load with datasets" in capsys.readouterr().err
