"""Shape check on the `meta` device: build the Model and run forward with no memory and no GPU time.

A failure names the forward line (so the operator pair) that broke; checks a meta run cannot decide
(data-dependent shapes, `.item()`) are left to the execution stage. A task that passes carries what its forward
costs (filters.cost) and the graph of what it computes (filters.compute_graph), both recorded on the way.
"""

from __future__ import annotations

import traceback
import warnings

import torch

from opsynth.filters.compute_graph import ComputeGraph, graph_features
from opsynth.filters.cost import ForwardCost
from opsynth.filters.task_loading import TaskLoadError, load_task
from opsynth.reasons import KEEP, LOAD_ERROR, SHAPE_ERROR, Verdict, one_line

TASK_FILENAME = "<task>"
INCONCLUSIVE_MARKERS = ("meta", "data-dependent", "data dependent", "nonzero", "item()")


def _failing_line(error: BaseException, source: str) -> str:
    lines = source.splitlines()
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if frame.filename == TASK_FILENAME and frame.lineno and 0 < frame.lineno <= len(lines):
            return lines[frame.lineno - 1].strip()
    return ""


def check_shapes(source: str) -> Verdict:
    try:
        task = load_task(source, TASK_FILENAME)
    except TaskLoadError as e:
        return Verdict(LOAD_ERROR, str(e)[:300])
    try:
        with torch.device("meta"), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a task's own deprecation and user warnings are not the check's output
            model = task.model_class(*task.get_init_inputs())
            model.eval()
            inputs = task.get_inputs()
            try:
                with ForwardCost() as counted, ComputeGraph() as graph:
                    out = model(*inputs)
                cost, nodes = counted.cost, graph.nodes
            except Exception:  # the task's own error, if it has one, told without the counters
                out, cost, nodes = model(*inputs), None, None
    except NotImplementedError as e:
        return Verdict(KEEP, f"meta check inconclusive: {one_line(e)}")
    except Exception as e:
        text = str(e)
        if any(marker in text for marker in INCONCLUSIVE_MARKERS):
            return Verdict(KEEP, f"meta check inconclusive: {one_line(e)}")
        where = _failing_line(e, source)
        return Verdict(SHAPE_ERROR, f"{one_line(e)}" + (f" at `{where}`" if where else ""))
    tensors = [t for t in (out if isinstance(out, list | tuple) else [out]) if isinstance(t, torch.Tensor)]
    if not tensors:
        return Verdict(SHAPE_ERROR, "forward returns no tensor")
    if any(t.numel() == 0 for t in tensors):
        return Verdict(SHAPE_ERROR, "forward returns an empty tensor")
    measurements = {"output_shapes": [list(t.shape) for t in tensors]}
    if cost is not None:
        measurements |= {"cost": cost, "graph": graph_features(nodes), "graph_nodes": len(nodes)}
    return Verdict(KEEP, measurements=measurements)
