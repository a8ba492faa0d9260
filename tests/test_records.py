"""Records as work files hold them: JSON that reads back to the same record, and a copy that leaves the record
it came from alone."""

import json

from opsynth.records import Candidate, Rejection, sealed, unsealed


def _candidate() -> Candidate:
    return Candidate("torch#2", 7, 70, ("nn.Linear", "torch.relu"), "class Model: ...", ({"shape": [4, 8],
                     "dtype": "float32"},), "k7", 0.5, {"eager_ms": 1.5, "phases": {"load": 0.1}})  # fmt: skip


def test_a_candidate_and_a_rejection_read_back_from_their_json_as_they_were():
    c = _candidate()
    assert Candidate.from_json(json.loads(json.dumps(c.to_json()))) == c
    x = Rejection(c, "runtime_below_window", "execute", "eager 0.2 ms")
    assert Rejection.from_json(unsealed(json.loads(json.dumps(sealed(x.to_json()))))) == x


def test_changing_a_candidates_json_leaves_the_candidate_alone():
    c = _candidate()
    d = c.to_json()
    d["measurements"]["eager_ms"] = 9.0
    d["ops"] = ()
    assert c.measurements["eager_ms"] == 1.5 and c.ops == ("nn.Linear", "torch.relu")
