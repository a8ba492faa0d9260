"""Publishing a finished dataset folder to the Hugging Face Hub in one commit, after checking it, so an interrupted
upload never leaves half a dataset; the token is never printed or written (docs/commands.md, "Publishing")."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from opsynth.atomic import TMP_PREFIX
from opsynth.errors import OpsynthError, UsageError
from opsynth.reasons import one_line

STATE_DIR = ".opsynth"
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
TOKEN_LIKE = re.compile(r"hf_[A-Za-z0-9]{8,}")


@dataclass(frozen=True)
class PublishPlan:
    folder: Path
    files: tuple[str, ...]  # paths relative to the folder, as they land in the repository
    total_bytes: int
    rows: int
    commit_message: str


def mask(text: str, token: str) -> str:
    """`text` with the token, and anything that looks like a Hugging Face token, replaced by `***`."""
    return TOKEN_LIKE.sub("***", text.replace(token, "***") if token else text)


def card_metadata(folder: Path) -> dict:
    """The card's metadata, as the Hub reads it (`huggingface_hub.DatasetCard`)."""
    from huggingface_hub import DatasetCard

    path = folder / "README.md"
    if not path.read_text(encoding="utf-8").startswith("---\n"):
        raise UsageError(f"{path} has no YAML front matter; regenerate the card with opsynth generate")
    try:
        return DatasetCard.load(path).data.to_dict()
    except Exception as e:  # the YAML does not parse, or is not a mapping
        raise UsageError(f"{path}: its YAML front matter does not parse ({one_line(e)})") from None


def plan_publish(folder_path: str) -> PublishPlan:
    """Check that the folder is a finished opsynth dataset the Hub can serve, and list what to upload."""
    folder = Path(folder_path)
    if not folder.is_dir():
        raise UsageError(f"{folder_path}: no such folder; give the --out folder of a finished opsynth generate run")
    if not (folder / "stats.json").exists() or not (folder / "README.md").exists():
        raise UsageError(
            f"{folder_path} holds no finished opsynth dataset (no stats.json / README.md); "
            "finish it by running the same opsynth generate command again"
        )
    meta = card_metadata(folder)
    missing = [key for key in ("configs", "license", "dataset_info") if key not in meta]
    if missing:
        raise UsageError(f"{folder / 'README.md'}: card metadata lacks {', '.join(missing)}; regenerate the card")
    stats = json.loads((folder / "stats.json").read_text())
    from datasets import load_dataset

    try:
        rows = len(load_dataset(str(folder), split="train"))
        for config in meta["configs"]:  # every config the card lists must load, as a Hub visitor would load it
            if config.get("config_name") not in (None, "default"):
                load_dataset(str(folder), config["config_name"], split="train")
    except Exception as e:
        raise UsageError(f"{folder_path} does not load with datasets ({type(e).__name__}: {e})") from None
    if rows != stats["counts"]["rows"]:
        raise UsageError(f"{folder_path}: datasets loads {rows} rows but stats.json says {stats['counts']['rows']}")
    files = sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and STATE_DIR not in p.relative_to(folder).parts and not p.name.startswith(TMP_PREFIX)
    )
    cfg = stats["config"]
    message = f"Add {rows} opsynth tasks ({cfg['preset']}, seed {cfg['seed']}, {stats['device']})"
    total = sum((folder / f).stat().st_size for f in files)
    return PublishPlan(folder, tuple(files), total, rows, message)


def publish(
    folder: str,
    repo_id: str,
    private: bool = False,
    revision: str | None = None,
    dry_run: bool = False,
    endpoint: str | None = None,
    log=print,
) -> PublishPlan:
    if not REPO_ID.match(repo_id):
        raise UsageError(f"--repo-id {repo_id!r}: expected ORG/NAME, e.g. --repo-id my-org/cuda-tasks-6k")
    plan = plan_publish(folder)
    log(f"{plan.rows} rows, {len(plan.files)} files, {plan.total_bytes / 2**20:.1f} MiB for datasets/{repo_id}")
    if dry_run:
        for f in plan.files:
            log(f"  {f}")
        log("dry run: nothing uploaded")
        return plan

    from huggingface_hub import CommitOperationAdd, HfApi, get_token

    from opsynth.outputs.card import card_for

    token = get_token()
    if not token:
        raise UsageError("no Hugging Face token: run `hf auth login` or set HF_TOKEN, then publish again")
    api = HfApi(endpoint=endpoint, token=token)
    try:
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        if revision and revision != "main":
            api.create_branch(repo_id, branch=revision, repo_type="dataset", exist_ok=True)
        # The card's load example names the repository, not the local folder.
        card = card_for(plan.folder, repo_id).encode()
        operations = [
            CommitOperationAdd(path_in_repo=f, path_or_fileobj=card if f == "README.md" else str(plan.folder / f))
            for f in plan.files
        ]
        info = api.create_commit(
            repo_id, operations, commit_message=plan.commit_message, repo_type="dataset", revision=revision
        )
    except Exception as e:  # a server's error body is printed; one that echoes the request's headers holds the token
        message = mask(f"{type(e).__name__}: {e}", token)
        raise OpsynthError(f"publishing to datasets/{repo_id} failed: {message}") from None
    log(f"published in one commit: {info.commit_url}")
    return plan
