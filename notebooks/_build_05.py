"""Generate notebook 05 (the policy explorer) from the cell sources below.

    python notebooks/_build_05.py          # rewrite notebooks/05-*.ipynb
    python notebooks/_build_05.py --check  # exit 1 if the committed notebook differs from what this writes

Same format as `notebooks/_build.py` (whose writer it uses). Edit the sources
here, not the .ipynb file. The explorer's logic (settings, runs, figure, table,
command line) is `staleness.explorer`; this notebook holds the widgets.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

SETUP = '''import os

import numpy as np
import pandas as pd
import matplotlib.pyplot as plt

import staleness as st
from staleness import explorer

# Small settings by default (CI runs this notebook top to bottom in under a minute);
# set the environment variable STALENESS_FULL=1 for the full size.
FULL = os.environ.get("STALENESS_FULL", "0") == "1"
pd.set_option("display.precision", 3)'''

NB05 = [
    ("md", """# 05 · Policy explorer

Pick two synchronization policies, a task, a learning rate and lr rule, a cluster and a set
of seeds; the explorer trains every policy × seed and draws, side by side:

- **the curves**: held-out accuracy (or loss) and loss against simulated time, one colour per
  policy, the median over the seeds with a min–max band;
- **the staleness histogram** of applied gradients (seeds pooled), both policies overlaid;
- **the worker timelines** of each policy's first seed (blue: compute, orange: waiting at the gate);
- **the table**: final metric, its median over seeds with an interval (`staleness.stats.interval`:
  the min–max range below 5 seeds, a bootstrap 95 % interval from 5 on), staleness and waiting;
- **the command line** that reproduces the current settings: `staleness compare ...`, ready to
  copy into a shell (it writes the same runs, tables and plots to `runs/compare/`).

Controls:

- *policy A / policy B*: bsp, asp, ssp, dssp, dssp (no cap), softsync (B may be *none*), each with
  *s* (SSP's bound, DSSP's `s_L`), *r_max* (DSSP) and *n* (n-softsync)
- *task* (small built-in tasks), *seeds* (how many) and *first seed*
- *lr* (fixed; `staleness compare` would otherwise tune it per policy) and *lr rule* (how a gradient's
  weight depends on its staleness)
- *fast workers* of 8 (the rest are slow), *slow s/iteration* (a fast worker takes 1 s), *jitter*
  (lognormal σ) and *straggler rate* (probability per iteration of a 10 s, 4× slowdown)

Each policy's seeds train in one compiled `st.sweep` call; finished runs are kept, so a change
re-runs only the policies it affects (a new learning rate does not even recompile). The figure,
table and command line are ordinary outputs of the explorer's cell, shown through display
handles that a change updates in place; a static view of the executed notebook shows them."""),
    ("code", SETUP + '''
import io
import traceback

import ipywidgets as widgets
from IPython.display import Image, Pretty, display

MAX_TIME = 200.0 if FULL else 80.0      # simulated seconds per run
SEEDS = 5 if FULL else 3                # seeds per policy at the start
NUM_WORKERS = 8
DEFAULTS = explorer.Settings(max_time=MAX_TIME, seeds=tuple(range(SEEDS)))
cache = {}   # built tasks and finished sweeps (explorer.run)'''),
    ("code", '''style = {"description_width": "110px"}
layout = widgets.Layout(width="330px")


def slider(kind, value, lo, hi, label, **kw):
    return kind(value=value, min=lo, max=hi, description=label, style=style, layout=layout,
                continuous_update=False, **kw)


def dropdown(options, value, label):
    return widgets.Dropdown(options=options, value=value, description=label, style=style, layout=layout)


def policy_controls(kind, options):
    return {"kind": dropdown(options, kind, "policy"),
            "s": slider(widgets.IntSlider, 3, 0, 20, "s (SSP) / s_L"),
            "r_max": slider(widgets.IntSlider, 12, 0, 24, "r_max (DSSP)"),
            "n": slider(widgets.IntSlider, 4, 1, NUM_WORKERS, "n (softsync)")}


LRS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]
policy_a = policy_controls("dssp", explorer.POLICY_KINDS)
policy_b = policy_controls("bsp", ("none",) + explorer.POLICY_KINDS)
training = {
    "task": dropdown(explorer.TASKS, DEFAULTS.task, "task"),
    "seeds": slider(widgets.IntSlider, SEEDS, 1, 8, "seeds"),
    "first_seed": widgets.BoundedIntText(value=0, min=0, max=999, description="first seed", style=style,
                                         layout=layout),
    "lr": widgets.SelectionSlider(options=LRS, value=DEFAULTS.lr, description="lr", style=style, layout=layout,
                                  continuous_update=False),
    "lr_rule": dropdown(explorer.LR_RULES, DEFAULTS.lr_rule, "lr rule"),
}
cluster = {
    "fast": slider(widgets.IntSlider, 4, 0, NUM_WORKERS, "fast workers"),
    "slow_seconds": slider(widgets.FloatSlider, 2.6, 1.0, 6.0, "slow s/iteration", step=0.1),
    "jitter": slider(widgets.FloatSlider, 0.1, 0.0, 1.0, "jitter σ", step=0.05),
    "straggler_rate": slider(widgets.FloatSlider, 0.02, 0.0, 0.1, "straggler rate", step=0.005,
                             readout_format=".3f"),
}
cli = widgets.Text(description="copy as CLI", style={"description_width": "80px"},
                   layout=widgets.Layout(width="100%"))
status = widgets.Label()


def column(title, group):
    return widgets.VBox([widgets.HTML(f"<b>{title}</b>"), *group.values()])


ui = widgets.VBox([
    widgets.HBox([column("policy A", policy_a), column("policy B", policy_b)]),
    widgets.HBox([column("training", training), column("cluster", cluster)]),
    cli, status])'''),
    ("code", '''def policy(group):
    """The policy spec of one policy column, or None (B: none)."""
    v = {k: w.value for k, w in group.items()}
    if v["kind"] == "none":
        return None
    return explorer.policy_spec(v["kind"], v["s"], v["r_max"], v["n"], NUM_WORKERS)


def settings():
    """The controls' current setting (explorer.Settings: checked, canonical specs)."""
    t = {k: w.value for k, w in training.items()}
    specs = tuple(p for p in (policy(policy_a), policy(policy_b)) if p is not None)
    return explorer.Settings(
        task=t["task"], policies=specs, lr=t["lr"], lr_rule=t["lr_rule"], max_time=MAX_TIME,
        seeds=tuple(range(t["first_seed"], t["first_seed"] + t["seeds"])),
        cluster=explorer.cluster_spec(num_workers=NUM_WORKERS, **{k: w.value for k, w in cluster.items()}))


def enable():
    """Grey out the parameters the chosen policies do not use."""
    for group in (policy_a, policy_b):
        kind = group["kind"].value
        group["s"].disabled = kind not in ("ssp", "dssp", "dssp (no cap)")
        group["r_max"].disabled = kind not in ("dssp", "dssp (no cap)")
        group["n"].disabled = kind != "softsync"


def render():
    """Run the current setting (cached runs are reused); returns (settings, PNG, table)."""
    s = settings()
    results = explorer.run(s, cache)
    fig = explorer.figure(s, results)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return s, Image(buf.getvalue()), explorer.table(s, results)'''),
    ("code", '''# Not ipywidgets.interactive_output (nor any Output widget): its capture makes a headless
# runner (nbclient, hence nbmake) echo each captured output back to the kernel on the shell
# socket while it waits on that same socket for the cell's reply, which can hang the cell
# under CPU load. Display handles need no echo: a change updates them in place.
state = {"renders": 0, "settings": None, "error": None, "hold": False}


def shown(s):
    state["renders"] += 1
    state["settings"] = s
    cli.value = s.cli()


def on_change(change):
    if state["hold"]:
        return
    enable()
    status.value = "simulating…"
    try:
        s, image, tbl = render()
        command.update(Pretty(s.cli()))
        figure.update(image)
        numbers.update(tbl)
        shown(s)
    except Exception as e:  # a callback's exception would only reach the kernel's log: show it here
        state["error"] = e
        status.value = f"error: {e!r}"
        figure.update(Pretty(traceback.format_exc()))
    else:
        state["error"] = None
        status.value = ""


def set_controls(values):
    """Set several controls ({widget: value}) from code with one re-run at the end."""
    state["hold"] = True
    try:
        for w, v in values.items():
            w.value = v
    finally:
        state["hold"] = False
    on_change(None)


enable()
s, image, tbl = render()   # the defaults, shown as this cell's own outputs
display(ui)
command = display(Pretty(s.cli()), display_id=True)
figure = display(image, display_id=True)
numbers = display(tbl, display_id=True)
shown(s)
for group in (policy_a, policy_b, training, cluster):
    for w in group.values():
        w.observe(on_change, names="value")'''),
    ("md", """The cell below checks the explorer's callback the way a moved control calls it: it sets
the learning rate (re-run, no recompile) and turns policy B off (nothing to re-run), checks
that the outputs above followed, and sets both back at once (`set_controls`: several
controls, one re-run; the runs are cached, so only the figure is redrawn). A broken
callback fails here, in CI, instead of only in the kernel's log."""),
    ("code", '''def check():
    if state["error"] is not None:
        raise state["error"]


check()
renders = state["renders"]
training["lr"].value = 0.1
check()
assert state["renders"] == renders + 1 and state["settings"].lr == 0.1, "the lr control did not re-render"
assert "--lr 0.1" in cli.value, cli.value
policy_b["kind"].value = "none"
check()
assert state["settings"].policies == ("dssp:3:12",) and policy_b["s"].disabled, state["settings"]
set_controls({policy_b["kind"]: "bsp", training["lr"]: DEFAULTS.lr})
check()
assert state["renders"] == renders + 3, state["renders"]
assert state["settings"] == DEFAULTS, (state["settings"], DEFAULTS)
print(state["renders"], "renders; back at the defaults:")
print(cli.value)'''),
    ("md", """Things to try:

- **constant speeds** (jitter 0, straggler rate 0) with SSP at any `s` against *bsp*: after a
  short start the fast workers wait for the slow ones, and the update rate is BSP's. Switch A
  to *dssp (no cap)* or *asp* to see the fast workers keep going, and τ grow.
- **stragglers** (raise the rate): BSP and SSP(0–3) stall whenever any worker straggles;
  a larger `s` or DSSP's `r_max` absorbs the episodes.
- **the learning rate**: BSP averages 8 gradients per update, so it tolerates (and needs) a
  larger lr than ASP; a comparison at one lr favours one of them. Move *lr* and watch the order
  of the curves change; `staleness compare` without `--lr` tunes each policy's lr for you.
- **softsync** with n = 8 (plain async) against n = 1, lr rule *constant* vs *per_gradient*:
  the staleness is ≈ n, and α0/τ shrinks each stale gradient's step.
- **more seeds** (5 or more): the table's interval becomes a bootstrap 95 % interval of the
  median; two policies whose intervals overlap are not distinguishable at this budget."""),
]

NOTEBOOKS = {"05-policy-explorer.ipynb": NB05}


def main(argv=None) -> int:
    """Write (or with --check, compare) notebook 05 with `_build.py`'s writer."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("notebooks_build", HERE / "_build.py")
    build_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_module)
    return build_module.main(argv, NOTEBOOKS, "notebooks/_build_05.py")


if __name__ == "__main__":
    sys.exit(main())
