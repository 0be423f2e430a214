"""JSON summaries for benchmarks/gpu_check.sh (one line each on stdout).

    python benchmarks/_gpu_check.py devices
    python benchmarks/_gpu_check.py junit FILE.xml
    python benchmarks/_gpu_check.py replay RUN_DIR     # the recorded run vs its replay in the engine
    python benchmarks/_gpu_check.py cifar DIR          # fake CIFAR-10 files for the ResNet-20 workload
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


def replay(run_dir: str) -> dict:
    """The real run's trace replayed in the engine (slot_mode='map') vs the run's own parameters."""
    from staleness.runtime.replay import replay_trace

    rep, cmp = replay_trace(run_dir)
    return {"updates": int(rep.schedule.num_updates), "bitwise": bool(cmp.bitwise),
            "max_abs_diff": float(cmp.max_abs_diff)}


def cifar(root: str) -> dict:
    sys.path.insert(0, str(Path(__file__).parent))
    from cifar_compile import write_fake_cifar

    write_fake_cifar(Path(root), per_batch=1000, test=500)
    return {"cifar_dir": root}


if __name__ == "__main__":
    what, *args = sys.argv[1:]
    print(json.dumps({"devices": devices, "junit": junit, "replay": replay, "cifar": cifar}[what](*args)))
