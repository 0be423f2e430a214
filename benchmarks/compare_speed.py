"""The main job's wall time: `staleness compare` with no arguments, end to end, as a user runs it.

Each repetition is a fresh interpreter (`python -m staleness compare --out TMP --no-progress`),
so it pays imports, data loading, learning-rate tuning, compilation, the 18 runs and the
plots, as a user does. Reported: wall seconds (median of the repetitions), the CPU seconds of
the child (user + system), the share the learning-rate tuning and the runs take (from the
command's own line), and the ratio to the target (45 s on an idle 2-core CPU, issue 25).
Ends with one JSON line.

    python benchmarks/compare_speed.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TARGET_S = 45.0


def one(out: Path) -> tuple[float, float, str]:
    """(wall s, child CPU s, the command's first output line) of one default comparison."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "staleness", "compare", "--out", str(out), "--no-progress"],
                          capture_output=True, text=True, timeout=1800,
                          env=dict(os.environ, MPLBACKEND="Agg", JAX_PLATFORMS="cpu"))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"compare_speed: `staleness compare` failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout.splitlines()[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="fresh runs (default 3; the median is reported)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        print(f"compare_speed: --repeat = {args.repeat} must be >= 1", file=sys.stderr)
        return 2
    walls, cpus = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeat):
            wall, cpu, head = one(Path(tmp) / f"c{k}")
            walls.append(wall)
            cpus.append(cpu)
            print(f"run {k}: {wall:.1f} s wall, {cpu:.1f} s CPU   [{head[-60:]}]", flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    med = float(np.median(walls))
    print(f"default `staleness compare`: {med:.1f} s wall (median of {args.repeat}), {np.median(cpus):.1f} s CPU, "
          f"{med / TARGET_S:.2f}x the {TARGET_S:g} s target; {os.cpu_count()} CPUs, load average {load:.2f}")
    print(json.dumps({"benchmark": "compare_speed", "wall_s": [round(w, 2) for w in walls], "wall_median_s": round(med, 2),
                      "cpu_s": [round(c, 2) for c in cpus], "target_s": TARGET_S,
                      "ratio_to_target": round(med / TARGET_S, 3), "cpus": os.cpu_count(),
                      "load_average": round(load, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
