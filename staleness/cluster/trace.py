"""Reading recorded per-iteration compute times from a CSV into a Cluster."""

from __future__ import annotations

import csv
import math
import os

from staleness.cluster.bases import Trace
from staleness.cluster.model import Cluster

__all__ = ["from_trace_csv"]


def from_trace_csv(path: str | os.PathLike) -> Cluster:
    """Per-iteration compute seconds recorded from real workers.

    The CSV has a header with (at least) the columns ``worker``, ``iteration``
    and ``seconds``. Worker ids must be 0..W-1, all present; each worker's
    iterations must be 0..n_w-1 exactly once (in any row order); seconds must
    be finite and > 0. Iteration i of worker w takes
    ``seconds[w][i % n_w]``: traces wrap around cyclically.
    """
    fn = "from_trace_csv"
    p = os.fspath(path)
    try:
        f = open(p, newline="")
    except OSError as e:
        raise ValueError(f"{fn}: path = {p!r} cannot be read: {e.strerror}") from None
    with f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{fn}: {p!r} is empty; expected a header 'worker,iteration,seconds'")
        cols = [h.strip().lower() for h in header]
        missing = [c for c in ("worker", "iteration", "seconds") if c not in cols]
        if missing:
            raise ValueError(f"{fn}: {p!r} header {header!r} lacks column(s) {', '.join(missing)}; "
                             f"need worker,iteration,seconds")
        iw, ii, isec = cols.index("worker"), cols.index("iteration"), cols.index("seconds")
        data: dict[int, dict[int, float]] = {}
        for row in reader:
            line = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) < len(cols):
                raise ValueError(f"{fn}: {p!r} line {line}: {row!r} has {len(row)} fields, expected {len(cols)}")
            try:
                w, it, s = int(row[iw]), int(row[ii]), float(row[isec])
            except ValueError:
                raise ValueError(f"{fn}: {p!r} line {line}: {row!r} is not numeric "
                                 f"(worker and iteration must be integers, seconds a number)") from None
            if w < 0 or it < 0:
                raise ValueError(f"{fn}: {p!r} line {line}: worker = {w} and iteration = {it} must be integers >= 0")
            if not (math.isfinite(s) and s > 0):
                raise ValueError(f"{fn}: {p!r} line {line}: seconds = {row[isec]!r} must be a finite number > 0")
            d = data.setdefault(w, {})
            if it in d:
                raise ValueError(f"{fn}: {p!r} line {line}: worker {w} iteration {it} appears twice")
            d[it] = s
    if not data:
        raise ValueError(f"{fn}: {p!r} has a header but no rows")
    W = max(data) + 1
    absent = [w for w in range(W) if w not in data]
    if absent:
        raise ValueError(f"{fn}: {p!r} has no rows for worker(s) {absent[:10]}"
                         f"{'...' if len(absent) > 10 else ''}; worker ids must be 0..{W - 1}, all present")
    traces = []
    for w in range(W):
        d = data[w]
        n = len(d)
        if max(d) != n - 1:
            gap = next(i for i in range(n) if i not in d)
            raise ValueError(f"{fn}: {p!r} worker {w} lacks iteration {gap}; each worker's iterations must be 0..n-1")
        traces.append(tuple(d[i] for i in range(n)))
    return Cluster(W, Trace(p, tuple(traces)))

