import pyarrow.parquet as pq
import yaml

from opsynth.outputs.card import render_card, size_category
from opsynth.outputs.schema import TASK_SCHEMA
from opsynth.outputs.shards import shard_name, write_shards


def _rows(n):
    return [
        {"ops": '["torch.relu"]', "data_source": "torch#1", "code": f"# {i}", "id": f"{i:016x}", "num_ops": 1,
         "input_shapes": [{"dtype": "float32", "shape": [i, 8]}], "eager_ms": 1.0, "compile_ms": None,
         "device_name": "cpu", "kb_ast_similarity": 0.3,
         "kb_ast_similarity_normalized": 0.4, "kb_minhash_jaccard": 0.1,
         "kb_nearest": "level1/1_x", "seed": i, "generator_version": "t"}
        for i in range(n)
    ]  # fmt: skip


def test_hub_shard_names():
    assert shard_name("train", 0, 3) == "train-00000-of-00003.parquet"


def test_shards_are_bounded_and_replace_older_ones(tmp_path):
    write_shards(_rows(25), TASK_SCHEMA, tmp_path, "train", max_rows=10, row_group_rows=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == [shard_name("train", i, 3) for i in range(3)]
    meta = pq.ParquetFile(tmp_path / shard_name("train", 0, 3)).metadata
    assert meta.num_rows == 10 and meta.num_row_groups == 3
    assert pq.read_schema(tmp_path / shard_name("train", 0, 3)).equals(TASK_SCHEMA)
    write_shards(_rows(5), TASK_SCHEMA, tmp_path, "train", max_rows=10, row_group_rows=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == [shard_name("train", 0, 1)]


def test_shards_and_row_groups_are_bounded_by_bytes(tmp_path):
    rows = _rows(40)
    for r in rows:
        r["code"] = "x" * 1000
    paths = write_shards(rows, TASK_SCHEMA, tmp_path, "train", max_rows=100, row_group_rows=100,
                         max_bytes=5_000, max_row_group_bytes=2_500)  # fmt: skip
    assert len(paths) == 10  # about 1.2 kB a row: 4 rows fit under 5 kB
    meta = pq.ParquetFile(paths[0]).metadata
    assert meta.num_rows == 4 and meta.num_row_groups == 2
    assert sum(pq.ParquetFile(p).metadata.num_rows for p in paths) == 40


def test_an_empty_split_has_one_readable_shard_or_none_where_asked(tmp_path):
    (path,) = write_shards([], TASK_SCHEMA, tmp_path, "train", max_rows=10, row_group_rows=4)
    assert pq.read_table(path).num_rows == 0
    write_shards(_rows(3), TASK_SCHEMA, tmp_path, "rejected", max_rows=10, row_group_rows=4)
    assert write_shards([], TASK_SCHEMA, tmp_path, "rejected", 10, 4, keep_empty=False) == []
    assert not list(tmp_path.glob("rejected-*"))  # the earlier shards of the split are gone too


def test_card_front_matter_is_hub_yaml():
    stats = {
        "config": {"preset": "ops6k", "seed": 1, "workload": "tiny", "runtime_window_ms": [0.1, 5.0],
                   "compile_check": True, "kernelbench": "embedded", "similarity_threshold": 0.9,
                   "jaccard_threshold": 0.85},
        "counts": {"rows": 1500, "candidates": 1800, "accepted": 1600, "accepted_not_selected": 90},
        "device": "cpu", "versions": {"opsynth": "x", "torch": "2.13"},
        "rows_per_data_source": {"torch#1": 1500, "torch#2": 0},
        "released_mixture_percent": {"torch#1": 3.4, "torch#2": 83.77},
        "funnel": {"execute": {"in": 1800, "kept": 1600, "dropped": {"timeout": 200}},
                   "select": {"in": 1600, "kept": 1590, "dropped": {"duplicate": 10}}},
    }  # fmt: skip
    info = {"num_examples": 1500, "num_bytes": 10_000, "download_size": 4_000}
    card = render_card(stats, {"default": info, "rejected": {**info, "num_examples": 300}})
    meta = yaml.safe_load(card.split("---")[1])
    assert meta["license"] and meta["size_categories"] == ["1K<n<10K"] and "cuda" in meta["tags"]
    assert [c["config_name"] for c in meta["configs"]] == ["default", "rejected"]
    default_info = meta["dataset_info"][0]
    assert [f["name"] for f in default_info["features"]][:3] == ["ops", "data_source", "code"]
    assert default_info["splits"] == [{"name": "train", "num_bytes": 10_000, "num_examples": 1500}]
    assert "timeout: 200" in card and "arXiv:2602.24286" in card
    # The title says what was made; the selection's row keeps the rows, and says what was beyond the quota.
    assert meta["pretty_name"] == "opsynth tasks: 1500 rows from torch#1 (recipe ops6k, seed 1)"
    assert "| select | 1600 | 1500 | duplicate: 10, beyond the quota (accepted, not needed): 90 |" in card
    assert "exhausted" not in card and "was asked for" not in card
    stats["requested_quota_per_data_source"] = {"torch#1": 1600}
    stats["exhausted_data_sources"] = {
        "torch#1": {"after_round": 3, "round_candidates": 1785, "round_rows": 13, "rows": 108, "moved_to": "torch#2",
                    "moved_rows": 96}
    }  # fmt: skip
    card = render_card(stats, {"default": info, "rejected": {**info, "num_examples": 300}})
    assert "torch#1 was asked for 1600 rows but stopped at 108: in round 3 only 13 of its 1785" in card
    assert size_category(999) == "n<1K" and size_category(10_000) == "10K<n<100K"
    assert "executions on the device" not in card  # none counted: a run checkpointed before they were
    stats["counts"] |= {"executions": 1900, "executions_per_row": 1.267, "ceiling_stops": 120, "memory_retries": 4}
    stats["gpu_busy"] = {"per_gpu": [0.8], "executing_s": 500.0}
    card = render_card(stats, {"default": info, "rejected": {**info, "num_examples": 300}})
    assert ("1900 executions on the device (1.267 per row; 120 of them first tries stopped at a first timed forward"
            " over their ceiling; 4 tasks run again alone, out of memory beside the others); GPU busy 80 % from the"
            " first execution to the last (NVML, over 500 s).") in card  # fmt: skip
    stats["gpu_busy"]["host_cores"] = 0.716
    card = render_card(stats, {"default": info, "rejected": {**info, "num_examples": 300}})
    assert "GPU busy 80 % from the first execution to the last (NVML, over 500 s; the host's cores 72 % busy" in card


def test_two_folders_of_the_same_name_do_not_share_a_datasets_cache(tmp_path):
    from datasets import load_dataset

    from opsynth.atomic import write_text_atomic
    from opsynth.outputs.card import split_info
    from opsynth.outputs.schema import REJECTED_SCHEMA

    stats = {
        "config": {"preset": "ops6k", "seed": 1, "workload": "tiny", "runtime_window_ms": [0.1, 5.0],
                   "compile_check": True, "kernelbench": "embedded", "similarity_threshold": 0.9,
                   "jaccard_threshold": 0.85},
        "counts": {"rows": 0, "candidates": 0, "accepted": 0}, "device": "cpu",
        "versions": {"opsynth": "x", "torch": "2.13"}, "rows_per_data_source": {}, "released_mixture_percent": {},
        "funnel": {},
    }  # fmt: skip
    lengths = []
    for parent, n in (("first", 3), ("second", 7)):
        folder = tmp_path / parent / "out"
        tasks = write_shards(_rows(n), TASK_SCHEMA, folder / "data", "train", 10, 4)
        rejected = write_shards([], REJECTED_SCHEMA, folder / "rejected", "rejected", 10, 4)
        card = render_card(stats, {"default": split_info(tasks), "rejected": split_info(rejected)})
        write_text_atomic(folder / "README.md", card)
        lengths.append(len(load_dataset(str(folder), split="train")))
        assert "config_name: rejected" not in card and "no `rejected` config" in card  # it would not load
    assert lengths == [3, 7]


def test_rows_stream_one_shard_at_a_time(tmp_path):
    # Rows come from a generator; by the time row 12 is made, the first 10 are already on disk.
    seen_on_disk = []

    def rows():
        for i, row in enumerate(_rows(25)):
            if i == 11:
                seen_on_disk.append(len(list(tmp_path.glob(".tmp-train-*.parquet"))))
            yield row

    paths = write_shards(rows(), TASK_SCHEMA, tmp_path, "train", max_rows=10, row_group_rows=4)
    assert seen_on_disk == [1]
    assert [p.name for p in paths] == [shard_name("train", i, 3) for i in range(3)]
    assert not list(tmp_path.glob(".tmp-*"))
