"""Where the compile time of `st.simulate` on cifar10-resnet20 goes.

Tiny fake CIFAR-10 files (standard pickle format) in a temp dir; batch 32,
4 workers on a 1 : 2.6 cluster; ASP (one gradient per update) and BSP (4
vmapped gradient slots). Each case runs in a fresh interpreter, so nothing is
inherited from another case's compiled code, and is split into:

  build     `tasks.get` (pickle load, channel statistics, device copy)
  init      first `task.init_params` call (trace + compile + run)
  eval      `engine.core.evaluate.lower(...).compile()`
  chunk     `engine.core.run_chunk.lower(...)` (trace + MLIR) and `.compile()` (XLA)
  s/update  steady state: the compiled chunk's wall (and process CPU) seconds per update
  simulate  a whole `st.simulate` in its own fresh interpreter, wall time and
            the sum of its trace/lower and XLA compile times (`jax_log_compiles`)

for conv_impl 'patches' (the CPU default) and 'lax' (native convolutions).
`--attribute` also compiles pieces of the chunk on their own (forward, value
and grad, grad inside a scan, vmapped over slots) to say what dominates.
On a shared machine read the CPU columns: wall times move with others' load.
Ends with one JSON line. Target: simulate compile < 60 s on a 2-core CPU.

    python benchmarks/cifar_compile.py [--quick] [--attribute] [--impls patches,lax]

Measured (2 cores, lightly loaded; before = the concatenated patches and
flax's initialisers): st.simulate compile ASP 12.5 -> 6.1 s, BSP 13.8 -> 6.1 s;
CPU of init + eval + chunk compile 20.3 -> 8.1 s; s/update ASP 0.18 -> 0.16,
BSP 0.69 -> 0.62; 'lax' compiles like 'patches' now but runs 20x slower in
the replay's scan (3.2 s ASP, 13.9 s BSP per update).
"""

import argparse
import json
import logging
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BATCH, WORKERS = 32, 4
TARGET_S = 60.0  # compile seconds of one st.simulate on a 2-core CPU
CLUSTER = [1.0, 1.0, 2.6, 2.6]


def write_fake_cifar(root: Path, per_batch: int = 100, test: int = 100, seed: int = 0) -> Path:
    """Five training batches of `per_batch` random images and a test batch, CIFAR-10 layout."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for name, n in [*((f"data_batch_{i}", per_batch) for i in range(1, 6)), ("test_batch", test)]:
        images = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n).tolist()
        with open(root / name, "wb") as f:
            pickle.dump({b"data": images, b"labels": labels}, f)
    return root


class CompileLog(logging.Handler):
    """Collects `jax_log_compiles` records: seconds per (phase, function)."""

    PAT = re.compile(r"Finished (tracing|jaxpr to MLIR module conversion|XLA compilation) (?:of )?(\S+).* in "
                     r"([0-9.]+) sec")

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        m = self.PAT.search(record.getMessage())
        if m:
            phase = {"tracing": "trace", "XLA compilation": "xla"}.get(m.group(1), "mlir")
            self.records.append((phase, m.group(2), float(m.group(3))))

    def total(self, phase=None, name=None):
        return sum(s for p, n, s in self.records if (phase is None or p == phase) and (name is None or name in n))


def _setup_jax():
    import jax

    jax.config.update("jax_log_compiles", True)
    log = CompileLog()
    for name in ("jax._src.pjit", "jax._src.interpreters.pxla", "jax._src.dispatch", "jax"):
        logging.getLogger(name).addHandler(log)
        logging.getLogger(name).propagate = False
    return jax, log


CPU_S = {}  # label -> process CPU seconds (all threads) of the last _timed(label=...) call


def _timed(fn, label=None):
    """(fn(), wall seconds); with a label, also records the process CPU seconds in CPU_S
    (steadier than wall time on a shared machine: other users' load does not count)."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    if label is not None:
        CPU_S[label] = time.process_time() - c0
    return out, time.perf_counter() - t0


def case(impl: str, policy: str, data_dir: str, updates: int, chunk: int, attribute: bool) -> dict:
    """Components of one (conv_impl, policy) replay, in this (fresh) process."""
    jax, log = _setup_jax()
    import staleness as st
    from staleness import tasks
    from staleness.engine import core
    from staleness.engine.plan import make_plan
    from staleness.engine.run import chunk_inputs, resolve_optimizer

    out = {"impl": impl, "policy": policy}
    task, out["build_s"] = _timed(lambda: tasks.get("cifar10-resnet20", batch_size=BATCH, num_workers=WORKERS,
                                                    data_dir=data_dir, conv_impl=impl))
    sched = st.simulate_schedule(st.policies.parse(policy), st.cluster.heterogeneous(CLUSTER),
                                 num_updates=updates, seed=0)
    opt = resolve_optimizer(None, None, sched.num_updates, task)
    plan = make_plan(sched, chunk)
    consts = {"data_key": core.keys(0)[1], "rule": jax.numpy.int32(0)}
    rules = (st.lr.get("constant"),)
    mark = len(log.records)
    carry, out["init_s"] = _timed(lambda: jax.block_until_ready(core.init_carry(task, 0, opt, plan.ring)), "init")
    out["init_xla_s"] = sum(s for p, _, s in log.records[mark:] if p == "xla")
    ev = core.evaluate.lower(task, carry.params)
    out["eval_compile_s"] = _timed(ev.compile, "eval")[1]
    xs = core.pad_chunk(chunk_inputs(task, plan, 0, consts["data_key"]), min(plan.chunk, plan.num_updates))
    lowered, out["chunk_lower_s"] = _timed(lambda: core.run_chunk.lower(task, carry, xs, consts, opt=opt.tx,
                                                                       rules=rules, slot_mode="vmap"), "lower")
    compiled, out["chunk_xla_s"] = _timed(lowered.compile, "xla")
    out["cpu_s"] = {k: round(v, 2) for k, v in CPU_S.items()}
    out["stablehlo_lines"] = lowered.as_text().count("\n")
    out["slots"], out["ring"] = plan.slots, plan.ring
    times, cpus = [], []
    for k in range(min(plan.num_chunks, 3)):  # the first call, then two steady ones
        xs = chunk_inputs(task, plan, k, consts["data_key"])
        t0, c0 = time.perf_counter(), time.process_time()
        carry, losses = compiled(task, carry, xs, consts)
        jax.block_until_ready(losses)
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        if sum(times) > 60:  # native convolutions in a scan on CPU: ~15 s per gradient
            break
    steady = slice(1, None) if len(times) > 1 else slice(None)
    out["s_per_update"] = float(np.median(times[steady])) / chunk
    out["cpu_s_per_update"] = float(np.median(cpus[steady])) / chunk
    out["finite"] = bool(np.isfinite(np.asarray(losses)[plan.chunk_view(k)["mask"]]).all())
    if attribute:
        out["parts"] = attribute_parts(jax, task, carry.params, xs, consts)
    return out


def attribute_parts(jax, task, params, xs, consts) -> dict:
    """XLA compile seconds of pieces of one update, each compiled on its own."""
    import jax.numpy as jnp

    from staleness.engine import core

    index = xs[2][0]                                    # [C, μ]
    batch = task.batch(index[0], consts["data_key"], 0, 0)
    parts = {}

    def comp(name, fn, *args):
        lowered = jax.jit(fn).lower(*args)
        parts[name] = round(_timed(lowered.compile)[1], 2)

    comp("forward", lambda t, p, b: t.loss(p, b), task, params, batch)
    comp("value_and_grad", lambda t, p, b: jax.value_and_grad(t.loss)(p, b), task, params, batch)

    def scanned(t, p, ix):
        def body(p, i):
            loss, g = core.gradient(t, p, consts["data_key"], 0, 0, i)
            return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), loss
        return jax.lax.scan(body, p, ix)

    comp("grad_in_scan", scanned, task, params, index[:1])
    c = index.shape[0]
    if c > 1:
        def vm(t, p, ix):
            def body(p, ix):
                stale = jax.tree.map(lambda a: jnp.broadcast_to(a, (c,) + a.shape), p)
                loss, g = jax.vmap(lambda q, i: core.gradient(t, q, consts["data_key"], 0, 0, i))(stale, ix)
                return jax.tree.map(lambda a, b: a - 0.01 * b.mean(0), p, g), loss
            return jax.lax.scan(body, p, ix[None])
        comp(f"vmap{c}_grad_in_scan", vm, task, params, index)
    return parts


def simulate_case(impl: str, policy: str, data_dir: str, updates: int, chunk: int) -> dict:
    """A whole st.simulate (what a user runs), wall time and its compile times."""
    jax, log = _setup_jax()
    import staleness as st
    from staleness import tasks

    task = tasks.get("cifar10-resnet20", batch_size=BATCH, num_workers=WORKERS, data_dir=data_dir, conv_impl=impl)
    t0, c0 = time.perf_counter(), time.process_time()
    res = st.simulate(task, policy, st.cluster.heterogeneous(CLUSTER), num_updates=updates, seed=0, eval_every=chunk)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    per_fn = {}
    for phase, name, sec in log.records:
        per_fn[name] = per_fn.get(name, 0.0) + sec
    top = dict(sorted(((k, round(v, 2)) for k, v in per_fn.items()), key=lambda kv: -kv[1])[:6])
    return {"impl": impl, "policy": policy, "simulate_s": wall, "simulate_cpu_s": cpu,
            "simulate_xla_s": log.total("xla"), "simulate_trace_mlir_s": log.total("trace") + log.total("mlir"), "compiles": len(log.records),
            "top_compile_s": top, "accuracy": float(res.history["accuracy"].iloc[-1])}


def _sub(args: list[str], timeout: float) -> dict:
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 updates instead of 20 (chunks of 5)")
    ap.add_argument("--attribute", action="store_true", help="also compile pieces of an update on their own")
    ap.add_argument("--impls", default="patches,lax")
    ap.add_argument("--policies", default="asp,bsp")
    ap.add_argument("--simulate-impls", default="patches",
                    help="conv_impls to time a whole st.simulate for ('' for none; 'lax' runs at ~15 s/update on CPU)")
    ap.add_argument("--label", default="", help="recorded in the JSON line (e.g. the code version)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per fresh interpreter")
    ap.add_argument("--case", nargs=2, metavar=("IMPL", "POLICY"), help=argparse.SUPPRESS)
    ap.add_argument("--simulate", nargs=2, metavar=("IMPL", "POLICY"), help=argparse.SUPPRESS)
    ap.add_argument("--data-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    updates, chunk = (10, 5) if args.quick else (20, 5)
    if args.case:
        print(json.dumps(case(*args.case, args.data_dir, updates, chunk, args.attribute)))
        return
    if args.simulate:
        print(json.dumps(simulate_case(*args.simulate, args.data_dir, updates, chunk)))
        return
    rows, sims = [], []
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = str(write_fake_cifar(Path(tmp) / "cifar-10-batches-py"))
        for impl in args.impls.split(","):
            for policy in args.policies.split(","):
                extra = ["--quick"] * args.quick + ["--attribute"] * args.attribute
                rows.append(_sub(["--case", impl, policy, "--data-dir", data_dir, *extra], args.timeout))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                if impl in args.simulate_impls.split(","):
                    sims.append(_sub(["--simulate", impl, policy, "--data-dir", data_dir, *extra[:1]], args.timeout))
                    print(json.dumps(sims[-1]), file=sys.stderr, flush=True)
    print(f"cifar10-resnet20, batch {BATCH}, {WORKERS} workers, {updates} updates in chunks of {chunk}; "
          f"seconds (wall; 'cpu' = process CPU seconds of the four compile steps)")
    print(f"{'impl':8} {'policy':6} {'build':>6} {'init':>6} {'eval':>6} {'lower':>6} {'xla':>6} {'compile':>7} "
          f"{'cpu':>6} {'s/upd':>7} {'cpu/upd':>7} | {'simulate':>8} {'its xla':>7} {'trace':>6}")
    for r in rows:
        s = next((s for s in sims if (s["impl"], s["policy"]) == (r["impl"], r["policy"])), {})
        comp = r["init_s"] + r["eval_compile_s"] + r["chunk_lower_s"] + r["chunk_xla_s"]
        print(f"{r['impl']:8} {r['policy']:6} {r['build_s']:6.1f} {r['init_s']:6.1f} {r['eval_compile_s']:6.1f} "
              f"{r['chunk_lower_s']:6.1f} {r['chunk_xla_s']:6.1f} {comp:7.1f} {sum(r['cpu_s'].values()):6.1f} "
              f"{r['s_per_update']:7.3f} {r['cpu_s_per_update']:7.3f} | {s.get('simulate_s', float('nan')):8.1f} "
              f"{s.get('simulate_xla_s', float('nan')):7.1f} {s.get('simulate_trace_mlir_s', float('nan')):6.1f}")
        if "parts" in r:
            print("    parts (xla s):", ", ".join(f"{k} {v}" for k, v in r["parts"].items()))
        if "top_compile_s" in s:
            print("    simulate, trace+lower+xla s by function:",
                  ", ".join(f"{k} {v}" for k, v in s["top_compile_s"].items()))
    worst = max((x["simulate_xla_s"] + x["simulate_trace_mlir_s"] for x in sims), default=float("nan"))
    print(f"slowest st.simulate compile (trace + lower + XLA): {worst:.1f} s; target < {TARGET_S} s")
    print(json.dumps({"benchmark": "cifar_compile", "label": args.label, "updates": updates, "chunk": chunk,
                      "cases": rows, "simulate": sims, "simulate_compile_max_s": worst, "target_s": TARGET_S,
                      "cpus": os.cpu_count(), "load_avg": os.getloadavg()}))


if __name__ == "__main__":
    main()
