"""The search for a program's most similar reference gives exactly what scoring every reference gives: the
bounds it prunes by are never below a score, on random trees, generated tasks and the reference tasks themselves."""

import random

import numpy as np
import pyarrow.parquet as pq

from opsynth.config import COMPOSE_ATTEMPTS, WORKLOADS
from opsynth.filters.ast_search import ReferenceSet, best_match
from opsynth.filters.ast_similarity import SkeletonTable, brute_force, profile, score
from opsynth.filters.kernelbench_index import fingerprint, load_reference
from opsynth.operator_catalog.codegen import render
from opsynth.operator_catalog.compose import compose

# Few types and child counts, so that random trees share many paths and tie often.
KINDS = ("ClassDef", "FunctionDef", "Return", "If", "Name", "Call", "Attribute")


def random_tree(table: SkeletonTable, rng: random.Random, depth: int = 0) -> int:
    width = 0 if depth >= 4 else rng.choice((0, 1, 1, 2, 2, 3))
    children = tuple(random_tree(table, rng, depth + 1) for _ in range(width))
    return table.intern(rng.choice(KINDS[:4] if width else KINDS), children)


def test_random_trees_equal_brute_force():
    rng = random.Random(7)
    for _ in range(20):
        table = SkeletonTable()
        references = [profile(table, random_tree(table, rng)) for _ in range(rng.randint(1, 30))]
        bounded = ReferenceSet(table, references)
        for _ in range(20):
            p = profile(table, random_tree(table, rng))
            assert best_match(table, p, bounded) == brute_force(table, p, references)
            bounds = bounded.bounds(p)
            assert all(score(table, p, q) <= b for q, b in zip(references, bounds, strict=True))


def assert_exact(index, sources: list[str]) -> None:
    for source in sources:
        fp = fingerprint(index.table, source)
        for root, references, bounded in (
            (fp.raw_root, index.raw_profiles, index.raw_references),
            (fp.normalized_root, index.normalized_profiles, index.normalized_references),
        ):
            p = profile(index.table, root)
            assert best_match(index.table, p, bounded) == brute_force(index.table, p, references)


def test_released_rows_equal_brute_force(ops6k_examples):
    assert_exact(load_reference("embedded"), pq.read_table(ops6k_examples, columns=["code"]).column("code").to_pylist())


def test_generated_tasks_and_the_references_themselves_equal_brute_force():
    index = load_reference("embedded")
    assert_exact(
        index,
        [
            render(compose(seed, 1 + seed % 5, WORKLOADS[workload], COMPOSE_ATTEMPTS)).source
            for workload in ("tiny", "gpu")
            for seed in range(15)
        ],
    )
    for i in range(0, len(index.raw_profiles), 10):  # a reference finds itself, or an equal one before it
        found, at = best_match(index.table, index.raw_profiles[i], index.raw_references)
        assert (found, at) == brute_force(index.table, index.raw_profiles[i], index.raw_profiles)
        assert at <= i


def test_a_program_of_one_significant_subtree_scores_zero_against_the_first():
    table = SkeletonTable()
    references = [profile(table, table.intern("ClassDef", (table.intern("Return", ()),))) for _ in range(3)]
    lone = profile(table, table.intern("Return", ()))
    assert best_match(table, lone, ReferenceSet(table, references)) == (0.0, 0)
    assert not np.any(ReferenceSet(table, references).bounds(lone))


def test_a_long_run_forgets_the_programs_it_compared_and_scores_each_the_same(monkeypatch):
    """The table keeps the references' structures for good and drops those of the programs compared with them
    once they pass TRANSIENT_LIMIT, so that it does not grow with a run; the scores do not move."""
    from opsynth.filters import ast_similarity
    from opsynth.filters.decontamination import similarity

    index = load_reference("embedded")
    sources = [render(compose(seed, 1 + seed % 5, WORKLOADS["gpu"], COMPOSE_ATTEMPTS)).source for seed in range(12)]
    remembered = [similarity(source, index) for source in sources]
    monkeypatch.setattr(ast_similarity, "TRANSIENT_LIMIT", 0)  # forget before every program
    forgetting = [similarity(source, index) for source in sources]
    assert forgetting == remembered
    table = index.table
    table.forget_transient()
    assert len(table.kind) == table._kept  # the last program's structures gone, the references' all there
    assert all(best_match(table, p, index.raw_references)[0] == 1.0 for p in index.raw_profiles[::25])
