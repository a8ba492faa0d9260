"""The elements that flow through the Beam graph: candidate seeds, candidates, and rejections.

They are frozen and picklable; a stage never mutates its input, it returns an updated copy. Written to the run's
work files, each record is sealed with a hash of itself, so one damaged or edited afterwards is found on reading
and its work redone, never trusted.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields, replace
from typing import Any

from opsynth.reasons import NOT_NEEDED

DIGEST = "sha256"  # the key of a written record's hash of the rest of it


class DamagedRecord(ValueError):
    """A work-file record that does not match its hash: cut short, garbled or edited."""


def _digest(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def sealed(record: dict) -> dict:
    """A record's JSON form with its hash, as work files hold it."""
    return {**record, DIGEST: _digest(record)}


def unsealed(record: dict) -> dict:
    """A record read back, without its hash; raises DamagedRecord where the hash does not match."""
    if not isinstance(record, dict):
        raise DamagedRecord("not a record")
    rest = {k: v for k, v in record.items() if k != DIGEST}
    if record.get(DIGEST) != _digest(rest):
        raise DamagedRecord("its hash does not match")
    return rest


def candidate_seed(run_seed: int, data_source: str, index: int) -> int:
    """The seed of one candidate: a stable 63-bit hash of the run seed, its data source and its index."""
    digest = hashlib.sha256(f"{run_seed}:{data_source}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@dataclass(frozen=True)
class CandidateSpec:
    """What one candidate is made from: its place in its data source's stream and its seed."""

    data_source: str  # torch#k or transformers
    index: int  # position in that data source's stream of candidates (selection keeps the lowest)
    seed: int


@dataclass(frozen=True)
class Candidate:
    data_source: str
    index: int
    seed: int
    ops: tuple[str, ...] = ()
    code: str = ""
    input_shapes: tuple[dict, ...] = ()
    dedup_key: str = ""
    batch_scale: float = 1.0  # shape calibration's factor on the sampled batch
    measurements: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return hashlib.sha256(self.code.encode()).hexdigest()[:16]

    @property
    def order(self) -> tuple[str, int]:
        return (self.data_source, self.index)

    def measured(self, values: dict[str, Any]) -> Candidate:
        return replace(self, measurements={**self.measurements, **values}) if values else self

    def to_json(self) -> dict:
        """Its fields as JSON writes them. Not `dataclasses.asdict`, whose deep copies took most of the time of
        writing a round's records; its measurements are copied one level down, the rest is immutable or JSON."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"measurements": dict(self.measurements)}

    @classmethod
    def from_json(cls, d: dict) -> Candidate:
        return cls(**{**d, "ops": tuple(d["ops"]), "input_shapes": tuple(d["input_shapes"])})


@dataclass(frozen=True)
class Rejection:
    candidate: Candidate
    reason: str  # one of opsynth.reasons.REASONS
    stage: str  # the stage that dropped it
    detail: str = ""

    def to_json(self) -> dict:
        return {
            "candidate": self.candidate.to_json(),
            "reason": self.reason,
            "stage": self.stage,
            "detail": self.detail,
        }

    @classmethod
    def from_json(cls, d: dict) -> Rejection:
        return cls(Candidate.from_json(d["candidate"]), d["reason"], d["stage"], d["detail"])


def executed_candidates(accepted: list[Candidate], rejected: list[Rejection]) -> list[Candidate]:
    """The candidates of a round that its execution stage ran: those it accepted and those it rejected (but
    not those it did not need, `opsynth.reasons.NOT_NEEDED`)."""
    return [*accepted, *(x.candidate for x in rejected if x.stage == "execute" and x.reason != NOT_NEEDED)]
