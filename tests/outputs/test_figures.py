"""The card's figures gather their histograms as the rows stream past, in bins fixed beforehand: what a run
holds for them does not grow with its rows, and the figures count each row where its value falls."""

import json
import random

import numpy as np

from opsynth.outputs.figures import SIMILARITY_EDGES, FigureData, write_figures


def _rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"data_source": "torch#2", "ops": json.dumps(["torch.relu", "nn.Conv2d"]),
         "eager_ms": rng.lognormvariate(0.7, 0.6) if i % 50 else None,
         "kb_ast_similarity": rng.choice([0.0, 0.3, 0.58, 1.0, rng.random()]) if i % 40 else None}
        for i in range(n)
    ]  # fmt: skip


def test_the_figures_data_stays_the_same_size_however_many_rows_pass():
    small, large = FigureData(), FigureData()
    for row in _rows(2_000, 1):
        small.add(row)
    for row in _rows(40_000, 2):
        large.add(row)
    assert len(large.similarity) == len(small.similarity) == len(SIMILARITY_EDGES) - 1
    assert len(large.eager_fine) < 400  # bins the rows' range spans, not rows
    assert sum(large.eager_fine.values()) == sum(1 for r in _rows(40_000, 2) if r["eager_ms"])


def test_each_row_counts_in_the_bin_of_its_value():
    rows = _rows(20_000, 3)
    data = FigureData()
    for row in rows:
        data.add(row)
    scores = [r["kb_ast_similarity"] for r in rows if r["kb_ast_similarity"] is not None]
    assert data.similarity == np.histogram(scores, bins=SIMILARITY_EDGES)[0].tolist()  # numpy's bins exactly
    eager = np.array([r["eager_ms"] for r in rows if r["eager_ms"]])
    edges, counts = data.eager_histogram()
    fine = 10 ** (1 / 100)  # a fine bin's width, as a factor
    assert edges[0] <= eager.min() <= edges[0] * fine and edges[-1] / fine <= eager.max() <= edges[-1]
    exact = np.histogram(eager, bins=edges)[0]
    # a row may count in the next bin only where its value lies within a fine bin of the edge between them
    near_edge = sum(int(np.sum((eager > e / fine) & (eager < e * fine))) for e in edges[1:-1])
    assert sum(counts) == len(eager) and int(np.abs(np.array(counts) - exact).sum()) <= 2 * near_edge
    assert FigureData().eager_histogram() is None


def test_the_figures_are_drawn_from_the_counts(tmp_path):
    data = FigureData()
    for row in _rows(500, 4):
        data.add(row)
    stats = {"config": {"runtime_window_ms": [1.0, 100.0], "similarity_threshold": 0.9}, "device": "one GPU",
             "rows_per_data_source": {"torch#2": 500}}  # fmt: skip
    paths = write_figures(tmp_path, data, stats)
    assert all((tmp_path / p).stat().st_size > 1000 for p in paths)
