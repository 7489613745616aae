"""``--format csv|json`` of ``servelab runs``, ``summary`` and ``compare``: every column of the
view (or every figure of a comparison), for a pipeline to read, in the shape ``servelab sql``
writes (JSON: a list of objects, non-finite numbers as "inf"/"-inf"/"nan"; CSV: a header row,
nested values as JSON text)."""
from __future__ import annotations

import csv
import json
import sys

from .query import _jsonable


def write_records(records: list[dict], form: str, file=None) -> None:
    file = file or sys.stdout
    if form == "json":
        print(json.dumps([{k: _jsonable(v) for k, v in r.items()} for r in records], indent=1), file=file)
        return
    names = list(dict.fromkeys(k for r in records for k in r))
    writer = csv.writer(file)
    writer.writerow(names)
    for r in records:
        writer.writerow([json.dumps(_jsonable(v)) if isinstance(v, (dict, list, tuple)) else v
                         for v in (r.get(n) for n in names)])


def comparison_records(result) -> list[dict]:
    """One record per stage x metric x group of a compare.Comparison."""
    out = []
    for stage in result.stages:
        for m in stage.metrics:
            for g in result.groups:
                if g.label not in m.values:
                    continue
                lo, hi = m.intervals.get(g.label) or (None, None)
                rlo, rhi = m.ratio_intervals.get(g.label) or (None, None)
                out.append(dict(
                    stage=stage.stage, kind=stage.kind, level=stage.levels.get(g.label),
                    class_name=result.class_name, metric=m.metric, group=g.label, runs=list(g.run_ids),
                    flags=list(g.flags), value=m.values[g.label], ci_low=lo, ci_high=hi,
                    baseline=result.baseline, ratio=m.ratios.get(g.label), ratio_ci_low=rlo,
                    ratio_ci_high=rhi, within_noise=m.within_noise.get(g.label),
                    winner=m.winner == g.label))
    return out
