"""Generate notebook 07 (your own model, loss, data and optimizer) from the cell sources below.

    python notebooks/_build_07.py          # rewrite notebooks/07-*.ipynb
    python notebooks/_build_07.py --check  # exit 1 if a committed notebook differs from what this writes

Same format as `notebooks/_build.py` (whose writer it uses). Edit the sources
here, not the .ipynb file.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

SETUP = '''import os

import numpy as np
import pandas as pd
import matplotlib.pyplot as plt
import optax
from flax import nnx

import staleness as st
from staleness import plots

# Small settings by default (CI runs this notebook top to bottom in about a minute);
# set the environment variable STALENESS_FULL=1 for the full size.
FULL = os.environ.get("STALENESS_FULL", "0") == "1"
pd.set_option("display.precision", 3)
cluster = st.cluster.heterogeneous([1.0, 1.0, 2.6, 2.6]).jitter(0.1)   # 2 fast, 2 slow workers'''

NB07 = [
    ("md", """# 07 · Your own model, loss, data and optimizer

The question `staleness` answers is *what does staleness do to **my** training?* This
notebook brings the four pieces a researcher has — a flax model (nnx or linen), a loss,
arrays of data, and an optax optimizer — and runs them under different synchronization
policies on one simulated heterogeneous cluster:

1. a regression with an nnx model and AdamW with gradient clipping,
2. the same with a loss function of your own,
3. non-IID data: a Dirichlet label partition across workers,
4. a byte-level transformer language model (the built-in `stdlib-lm` task),
5. the same task from the command line (`--task package.module:factory`)."""),
    ("code", SETUP),
    ("md", """## 1 · A regression: nnx model, arrays, `optax.adamw` with clipping

`st.tasks.from_flax(model, loss, data, ...)` builds a `Task`: the model's parameters become
a plain pytree (nnx through `nnx.split`, merged back inside the loss), the data are
split into a training and a held-out part, and each worker draws its minibatches from the
training part. Any `optax` transformation is a server optimizer; it keeps its own learning
rate."""),
    ("code", '''class MLP(nnx.Module):
    def __init__(self, rngs):
        self.l1, self.l2 = nnx.Linear(8, 64, rngs=rngs), nnx.Linear(64, 1, rngs=rngs)

    def __call__(self, x):
        return self.l2(nnx.relu(self.l1(x)))[:, 0]


rng = np.random.default_rng(0)
x = rng.normal(size=(2000, 8)).astype(np.float32)
y = np.tanh(x @ np.linspace(-1, 1, 8)).astype(np.float32)
task = st.tasks.from_flax(MLP(nnx.Rngs(0)), "mse", (x, y), batch_size=32, num_workers=4, name="tanh-regression")
adamw = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
MAX_TIME = 400.0 if FULL else 120.0     # simulated seconds per run
runs = [st.simulate(task, p, cluster, max_time=MAX_TIME, seed=0, optimizer=adamw, num_evals=15)
        for p in ["bsp", "ssp:3", "asp"]]
plots.metric_vs_time(runs, metric="mse")'''),
    ("code", '''pd.DataFrame([r.summary(metric="mse") for r in runs])[
    ["policy", "updates", "staleness_mean", "staleness_max", "wait_fraction_mean", "final_mse"]]'''),
    ("md", """In the same simulated time ASP applies many more updates than BSP (which waits for
the slow workers every round and averages all four gradients into each update), at a mean
staleness of about the number of other workers. Whether that buys a lower error at a given
time is exactly the comparison this tool is for; `staleness compare` runs it over seeds.

## 2 · Your own loss

A loss is a name (`cross_entropy`, `mse`, `next_token`) or a function
`loss(outputs, batch)` returning a scalar or one value per example. Mistakes (a loss that
is not a scalar, labels of the wrong shape, a model with BatchNorm statistics, an nnx
class instead of an instance) are errors here, when the task is built, not deep inside a
compiled replay."""),
    ("code", '''def huber(outputs, batch):
    return optax.huber_loss(outputs, batch["y"], delta=0.5)     # [B]: averaged by the task


robust = st.tasks.from_flax(MLP(nnx.Rngs(0)), huber, (x, y), batch_size=32, num_workers=4, name="huber",
                            metrics={"mse": lambda outputs, batch: (outputs - batch["y"]) ** 2})
r = st.simulate(robust, "ssp:3", cluster, max_time=MAX_TIME, seed=0, optimizer=adamw, num_evals=5)
r.history.tail(3)'''),
    ("code", '''try:
    st.tasks.from_flax(MLP, "mse", (x, y), batch_size=32)     # the class, not an instance
except ValueError as e:
    print(type(e).__name__, "-", e)'''),
    ("md", """## 3 · Non-IID data: a Dirichlet label partition

Federated and heterogeneous studies give each worker its own slice of the data.
`partition="dirichlet:ALPHA"` splits every class among the workers with proportions drawn
from Dirichlet(α) (Hsu et al. 2019): small α, strongly skewed workers. The Result records
the partition, each worker's number of examples and the mean total-variation distance
between a worker's label distribution and the whole set's (`label_skew`)."""),
    ("code", '''import flax.linen as nn

digits = st.tasks.data.digits()                    # 1437 training and 360 test images
mlp = nn.Sequential([nn.Dense(64), nn.relu, nn.Dense(10)])   # a linen model this time
rows = []
for part in ["iid", "dirichlet:1.0", "dirichlet:0.1"]:
    t = st.tasks.from_flax(mlp, "cross_entropy", (digits.x_train.reshape(-1, 64), digits.y_train),
                           test=(digits.x_test.reshape(-1, 64), digits.y_test), batch_size=32, num_workers=4,
                           partition=part, name="digits")
    res = st.simulate(t, "asp", cluster, max_time=MAX_TIME, seed=0, optimizer="sgd:lr=0.1", num_evals=4)
    rows.append({"partition": part, "label_skew": res.config["label_skew"],
                 "worker_examples": res.config["worker_examples"], "final_accuracy": res.final["accuracy"]})
pd.DataFrame(rows)'''),
    ("md", """## 4 · A language model

`stdlib-lm` is a small decoder-only transformer trained on bytes of the Python standard
library's own source files (every machine has them offline), with held-out files for the
`loss` (nats per byte) and `bits_per_byte` metrics, and AdamW as its default optimizer.
Here: one layer and a short context, so it trains in seconds; `STALENESS_FULL=1` uses the
task's defaults."""),
    ("code", '''lm = st.tasks.get("stdlib-lm", num_workers=4, batch_size=16,
                  **({} if FULL else dict(num_layers=1, d_model=64, context=32, corpus_bytes=400_000)))
print(lm, "\\n", lm.param_count, "parameters; default optimizer", lm.optimizer)
LM_TIME = 600.0 if FULL else 150.0
lm_runs = [st.simulate(lm, p, cluster, max_time=LM_TIME, seed=0, num_evals=6) for p in ["bsp", "ssp:2", "asp"]]
lm_runs.append(st.simulate(lm, "asp", cluster, max_time=LM_TIME, seed=0, num_evals=6, lr_rule="per_gradient"))
plots.metric_vs_time(lm_runs, metric="bits_per_byte")'''),
    ("md", """The staleness-aware rule `per_gradient` (α/τ, Rudra) composes with AdamW: it weights
each gradient by its staleness before the optimizer sees it (`staleness.engine.update`)."""),
    ("md", """## 5 · From the command line

Any factory that returns a `Task` is a task on the command line, as
`package.module:factory` (the factory gets `num_workers`, `batch_size`, `partition` and
`seed` if it takes them). The cell below writes such a module and simulates it; `compare`,
`run` (real devices) and `replay` take the same name."""),
    ("code", '''import pathlib
import subprocess
import sys
import tempfile

tmp = pathlib.Path(tempfile.mkdtemp())
(tmp / "mytasks.py").write_text(\'\'\'
import numpy as np
import flax.linen as nn
import staleness as st

def regression(num_workers=4, batch_size=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(1000, 8)).astype(np.float32)
    y = (x @ np.linspace(-1, 1, 8)).astype(np.float32)
    model = nn.Sequential([nn.Dense(32), nn.relu, nn.Dense(1), lambda h: h[:, 0]])
    return st.tasks.from_flax(model, "mse", (x, y), batch_size=batch_size, num_workers=num_workers,
                              name="my-regression")
\'\'\')
proc = subprocess.run([sys.executable, "-m", "staleness", "simulate", "--task", "mytasks:regression",
                       "--policy", "asp", "--cluster", "1,1,2.6,2.6", "--updates", "200", "--no-progress",
                       "--optimizer", "adamw:lr=1e-3"],
                      env=dict(os.environ, PYTHONPATH=str(tmp)), capture_output=True, text=True)
print(proc.stdout[-600:] or proc.stderr[-600:])'''),
]

NOTEBOOKS = {"07-your-own-model.ipynb": NB07}


def main(argv=None) -> int:
    """Write (or with --check, compare) notebook 07 with `_build.py`'s writer."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("notebooks_build", HERE / "_build.py")
    build_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_module)
    return build_module.main(argv, NOTEBOOKS, "notebooks/_build_07.py")


if __name__ == "__main__":
    sys.exit(main())
