import pyarrow.parquet as pq
import yaml

from outputs.card import render_card, size_category
from outputs.schema import TASK_SCHEMA
from outputs.shards import shard_name, write_shards


def _rows(n):
    return [
        {"ops": '["torch.relu"]', "data_source": "torch#1", "code": f"# {i}", "id": f"{i:016x}", "num_ops": 1,
         "input_shapes": "[]", "eager_ms": 1.0, "compile_ms": None, "device_name": "cpu", "kb_minhash_jaccard": 0.1,
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


def test_empty_split_still_has_one_readable_shard(tmp_path):
    (path,) = write_shards([], TASK_SCHEMA, tmp_path, "rejected", max_rows=10, row_group_rows=4)
    assert pq.read_table(path).num_rows == 0


def test_card_front_matter_is_hub_yaml():
    stats = {
        "config": {"preset": "ops6k", "seed": 1, "workload": "tiny", "runtime_window_ms": [0.1, 5.0],
                   "compile_check": True, "kernelbench": "embedded", "jaccard_threshold": 0.8},
        "counts": {"rows": 1500, "candidates": 1800, "accepted": 1600},
        "device": "cpu", "versions": {"opsynth": "x", "torch": "2.13"},
        "rows_per_data_source": {"torch#1": 1500}, "released_mixture_percent": {"torch#1": 3.4},
        "funnel": {"execute": {"in": 1800, "kept": 1600, "dropped": {"timeout": 200}}},
    }  # fmt: skip
    card = render_card(stats)
    meta = yaml.safe_load(card.split("---")[1])
    assert meta["license"] and meta["size_categories"] == ["1K<n<10K"] and "cuda" in meta["tags"]
    assert [c["config_name"] for c in meta["configs"]] == ["default", "rejected"]
    assert "timeout: 200" in card and "arXiv:2602.24286" in card
    assert size_category(999) == "n<1K" and size_category(10_000) == "10K<n<100K"
