"""Folders that always resume: a second run into a folder is refused, files being written are never read as
state, a damaged or edited checkpoint is named and run again (never trusted), and a round whose records do not
account for its candidates runs again: each resumed run ends with the dataset of an uninterrupted one."""

import json
import os
import shutil
from pathlib import Path

from opsynth.bench.faults import RUN_ARGS, dataset_rows, unfinished_copy
from opsynth.commands.cli import main
from opsynth.pipeline.run_folder import FolderLock


def _generate(out: Path) -> int:
    return main(["generate", "--out", str(out), *RUN_ARGS])


def test_damaged_checkpoints_are_named_and_run_again_never_trusted(tiny_reference, tmp_path, capsys):
    out = unfinished_copy(tiny_reference, tmp_path / "out")
    state = out / ".opsynth"
    checkpoints = sorted((state / "progress").glob("round-*/batch-*.jsonl"))  # each round's in its own folder
    assert len(checkpoints) >= 3
    edited, cut = checkpoints[0], checkpoints[1]
    lines = edited.read_text().splitlines()
    record = json.loads(lines[0])
    record["candidate"]["code"] = "# never executed\n" + record["candidate"]["code"]  # still valid JSON
    edited.write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    cut.write_text(cut.read_text()[: len(cut.read_text()) // 2])  # cut mid-line
    garbled = edited.parent / "batch-garbled.jsonl"
    garbled.write_bytes(b"\x00{not json\n")
    # What a full disk leaves: empty files under temporary names, where a `*.json` lookup would find them.
    (edited.parent / ".tmp-batch-0.jsonl").write_text("")
    (state / "sessions" / ".tmp-20260101T000000-1.json").write_text("")
    (state / "sessions" / "20260101T000000-2.json").write_text('{"wall_s": ')
    capsys.readouterr()

    assert _generate(out) == 0
    err = capsys.readouterr().err
    for path in (edited, cut, garbled):
        assert f"checkpoint {path}: " in err and "damaged record(s) ignored; their candidates run again" in err
    assert dataset_rows(out) == dataset_rows(tiny_reference)
    assert all("never executed" not in code for _, code in dataset_rows(out))


def test_a_round_whose_records_miss_candidates_runs_again(tiny_reference, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(tiny_reference, out)
    (out / "stats.json").unlink()
    (accepted,) = (out / ".opsynth" / "round-00000").glob("accepted-*.jsonl")
    accepted.write_text("".join(accepted.read_text().splitlines(keepends=True)[1:]))  # a record lost
    capsys.readouterr()

    assert _generate(out) == 0
    assert "round 0: its records are damaged or miss some of its" in capsys.readouterr().err
    assert dataset_rows(out) == dataset_rows(tiny_reference)


def test_a_second_run_into_a_folder_is_refused_naming_the_first(tiny_reference, tmp_path, capsys):
    out = unfinished_copy(tiny_reference, tmp_path / "out")
    before = sorted(p.name for p in (out / ".opsynth" / "sessions").iterdir())
    with FolderLock(out / ".opsynth", out):  # as a run in another process holds it
        assert _generate(out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"in use by another opsynth run (process {os.getpid()})" in err
    assert sorted(p.name for p in (out / ".opsynth" / "sessions").iterdir()) == before, "it wrote nothing"
    assert _generate(out) == 0  # the first run gone, the folder resumes
    assert dataset_rows(out) == dataset_rows(tiny_reference)


def test_a_damaged_config_is_named_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    (out / ".opsynth").mkdir(parents=True)
    (out / ".opsynth" / "config.json").write_text('{"seed": 5, ')
    assert _generate(out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config.json is damaged" in err


def test_a_folder_of_an_earlier_state_format_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    (out / ".opsynth").mkdir(parents=True)
    (out / ".opsynth" / "config.json").write_text(json.dumps({"seed": 5, "num_samples": 12}))  # 0.1.0's layout
    assert _generate(out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "a run of an earlier opsynth (state format 0" in err
    assert sorted(p.name for p in (out / ".opsynth").iterdir()) == ["config.json", "lock"], "nothing written"


def test_a_damaged_stats_file_is_written_again(tiny_reference, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(tiny_reference, out)
    (out / "stats.json").write_text("{")
    assert _generate(out) == 0
    assert json.loads((out / "stats.json").read_text())["counts"]["rows"] == 12
    assert dataset_rows(out) == dataset_rows(tiny_reference)


def test_damaged_outputs_of_a_rounds_stages_are_redone(tiny_reference, tmp_path, capsys):
    """The CPU stages' output of an interrupted round cut mid-line, and an accepted record of a finished round
    edited to stay valid JSON: the first stages run again, the second round runs again."""
    cut = unfinished_copy(tiny_reference, tmp_path / "cut")
    (prepared,) = (cut / ".opsynth" / "round-00000").glob("prepared-*.jsonl")
    prepared.write_text(prepared.read_text()[:1000])
    capsys.readouterr()
    assert _generate(cut) == 0
    assert "the output of its CPU stages is damaged; running them again" in capsys.readouterr().err
    assert dataset_rows(cut) == dataset_rows(tiny_reference)

    edited = tmp_path / "edited"
    shutil.copytree(tiny_reference, edited)
    (edited / "stats.json").unlink()
    (accepted,) = (edited / ".opsynth" / "round-00000").glob("accepted-*.jsonl")
    lines = accepted.read_text().splitlines()
    record = json.loads(lines[0])
    record["code"] = "# never executed\n" + record["code"]
    accepted.write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    capsys.readouterr()
    assert _generate(edited) == 0
    assert "round 0: its records are damaged or miss some of its" in capsys.readouterr().err
    assert dataset_rows(edited) == dataset_rows(tiny_reference)
