"""The MinHash of a program's tokens that KernelBench decontamination compares: MINHASH_PERMUTATIONS
permutations over its MINHASH_SHINGLE-grams of tokens."""

from __future__ import annotations

from datasketch import MinHash

from opsynth.config import MINHASH_PERMUTATIONS, MINHASH_SHINGLE


def token_minhash(tokens: list[str], seed: int) -> MinHash:
    k = MINHASH_SHINGLE
    shingles = {" ".join(tokens[i : i + k]).encode() for i in range(max(1, len(tokens) - k + 1))}
    mh = MinHash(num_perm=MINHASH_PERMUTATIONS, seed=seed)
    mh.update_batch(sorted(shingles))
    return mh
