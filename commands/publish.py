"""`opsynth publish`: upload a finished dataset folder to the Hugging Face Hub in one commit."""

from __future__ import annotations

from opsynth.commands.arguments import add_command


def register(sub) -> None:
    pub = add_command(
        sub,
        "publish",
        "upload a finished dataset folder to the Hugging Face Hub in one commit",
        "examples:\n  opsynth publish out --repo-id my-org/cuda-tasks-6k --dry-run\n"
        "  opsynth publish out --repo-id my-org/cuda-tasks-6k --private\n"
        "The token comes from HF_TOKEN or `hf auth login`; it is never printed or written.",
        run,
    )
    pub.add_argument("folder", help="the --out folder of a finished opsynth generate run")
    pub.add_argument("--repo-id", required=True, help="ORG/NAME of the dataset repository (created if missing)")
    pub.add_argument("--private", action="store_true", help="create the repository private")
    pub.add_argument("--revision", help="branch to commit to (created if missing; default main)")
    pub.add_argument("--dry-run", action="store_true", help="check the folder and list what would be uploaded")


def run(args) -> int:
    from opsynth.outputs.publish import publish

    publish(args.folder, args.repo_id, private=args.private, revision=args.revision, dry_run=args.dry_run)
    return 0
