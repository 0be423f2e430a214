"""JSON summaries for benchmarks/gpu_check.sh (one line each on stdout).

    python benchmarks/_gpu_check.py devices
    python benchmarks/_gpu_check.py junit FILE.xml
    python benchmarks/_gpu_check.py replay RUN_DIR [TOLERANCE]   # the recorded run vs its replay in the engine
    python benchmarks/_gpu_check.py cifar DIR          # fake CIFAR-10 files for the ResNet-20 workload

`replay` checks the replay's final parameters against the recorded run's and exits 1 (after
its JSON line) when max |difference| exceeds the tolerance: on CPU 0, bitwise (README: "Trace
replays are bitwise on CPU"; a run recorded under --sync collective: 1e-6, the tolerance of
`staleness replay --check`, float32 rounding of its all-reduce). On an accelerator nothing is
documented (staleness.runtime.replay: "the per-gradient kernels may differ between the
standalone and the scanned program (autotuning, fusion), so compare with a tolerance"): the
tolerance is 1e-4 of the largest |parameter|, float32 rounding (eps 1.2e-7) of kernels that
differ, accumulated over the check's up to 500 updates (500 x 1.2e-7 = 6e-5). A TOLERANCE
argument replaces either.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def devices() -> dict:
    import jax

    d = jax.devices()
    return {"backend": jax.default_backend(), "devices": [str(x) for x in d], "kind": d[0].device_kind,
            "jax": jax.__version__}


def junit(path: str) -> dict:
    s = ET.parse(path).getroot()
    s = s if s.tag == "testsuite" else s[0]
    return {k: int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}


ACCELERATOR_RTOL = 1e-4   # replay vs real run off CPU, of the largest |parameter| (see the module docstring)


def replay(run_dir: str, tolerance: str | None = None) -> None:
    """The real run's trace replayed in the engine (slot_mode='map') vs the run's own parameters:
    the JSON line, then exit 1 if they differ beyond the tolerance (the module docstring)."""
    import jax
    import numpy as np

    import staleness as st
    from staleness.cli.run_cmd import COLLECTIVE_TOLERANCE
    from staleness.runtime.replay import replay_trace

    sys.path.insert(0, str(Path(__file__).parent))
    from _report import BITWISE, Agreement, difference, finish

    recorded = st.Result.load(run_dir)
    rep, _ = replay_trace(recorded)
    diff = difference(recorded.params, rep.params)
    backend = jax.default_backend()
    collective = rep.config.get("recorded_sync") == "collective"
    if tolerance is not None:
        tol, why = float(tolerance), "given"
    elif backend == "cpu":
        tol, why = ((COLLECTIVE_TOLERANCE, "a collective run's all-reduce, as replay --check") if collective
                    else (BITWISE, "bitwise on CPU"))
    else:
        scale = max((float(np.max(np.abs(x))) for x in jax.tree.leaves(recorded.params) if np.size(x)), default=0.0)
        tol, why = ACCELERATOR_RTOL * scale, f"{ACCELERATOR_RTOL:g} x max |parameter| {scale:.3g} on {backend}"
    check = Agreement(f"the engine's replay of {run_dir}", "its recorded real run", diff, tol,
                      what="max |final parameter difference|", why=why)
    finish({"updates": int(rep.schedule.num_updates), "backend": backend, "bitwise": diff == 0.0,
            "max_abs_diff": diff, "tolerance": tol}, [check])


def cifar(root: str) -> dict:
    sys.path.insert(0, str(Path(__file__).parent))
    from cifar_compile import write_fake_cifar

    write_fake_cifar(Path(root), per_batch=1000, test=500)
    return {"cifar_dir": root}


if __name__ == "__main__":
    what, *args = sys.argv[1:]
    if what == "replay":   # prints its own JSON line, and fails beyond the tolerance
        replay(*args)
    else:
        print(json.dumps({"devices": devices, "junit": junit, "cifar": cifar}[what](*args)))
