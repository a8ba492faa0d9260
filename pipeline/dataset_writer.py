"""The end of a run: the rounds' spools merged into the dataset's shards (the rows by id, the rejections in
candidate order), then stats.json, the figures and the card, stats.json last, since its presence says the
folder is finished."""

from __future__ import annotations

import json
import time
from pathlib import Path

from opsynth.atomic import write_text_atomic
from opsynth.config import MAX_ROWS_PER_SHARD, ROW_GROUP_ROWS, VERSION
from opsynth.filters.execution import device_name
from opsynth.operator_catalog import catalog_version
from opsynth.options import GenerateOptions
from opsynth.outputs.card import split_info, write_card
from opsynth.outputs.figures import FigureData, write_figures
from opsynth.outputs.schema import REJECTED_SCHEMA, TASK_SCHEMA, rejected_row, task_row
from opsynth.outputs.shards import write_shards
from opsynth.outputs.stats import build_stats
from opsynth.pipeline.rounds import REJECTED_SPOOL, SELECTED_SPOOL, checkpointed, merged
from opsynth.pipeline.run_state import RunState
from opsynth.pipeline.sessions import SessionClock, read_sessions
from opsynth.records import Candidate, Rejection


def generator_version() -> str:
    return f"opsynth {VERSION}; catalog {catalog_version()}"


def write_dataset(options: GenerateOptions, state: RunState, requested_quota: dict[str, int], started: float,
                  work_root: str, session: SessionClock) -> dict:  # fmt: skip
    """Write the finished run's folder from its rounds (`state`); its stats. The session is recorded finished
    before the card and figures, which are written from the stats."""
    out = Path(options.out)
    version = generator_version()
    figure_data = FigureData()
    task_rows = (
        figure_data.add(task_row(c, version))
        for c in merged(state.round_dirs, SELECTED_SPOOL, lambda c: c.id, Candidate.from_json)
    )
    task_shards = write_shards(task_rows, TASK_SCHEMA, out / "data", "train", MAX_ROWS_PER_SHARD, ROW_GROUP_ROWS)
    rejected_rows = (
        rejected_row(x)
        for x in merged(state.round_dirs, REJECTED_SPOOL, lambda x: x.candidate.order, Rejection.from_json)
    )
    rejected_shards = write_shards(
        rejected_rows,
        REJECTED_SCHEMA,
        out / "rejected",
        "rejected",
        MAX_ROWS_PER_SHARD,
        ROW_GROUP_ROWS,
        keep_empty=False,
    )
    verdicts_and_phases = checkpointed(work_root, state.round_dirs)
    session.write(finished=True)  # its work done but for writing what follows
    stats = build_stats(
        options=options,
        quota=state.selector.quota,
        requested_quota=requested_quota,
        exhausted=state.exhausted,
        rows_per_source=state.selector.rows,
        accepted_total=state.accepted_total,
        not_needed=state.not_needed,
        dropped=state.dropped,
        rounds=state.rounds,
        checkpointed=verdicts_and_phases,
        wall_s=time.monotonic() - started,
        sessions=read_sessions(work_root),
        device=device_name(options.device),
        generator_version=version,
    )
    write_figures(out, figure_data, stats)
    write_card(out / "README.md", stats, {"default": split_info(task_shards), "rejected": split_info(rejected_shards)})
    write_text_atomic(out / "stats.json", json.dumps(stats, indent=2, sort_keys=True))
    return stats
