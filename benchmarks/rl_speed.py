"""Updates per second of the compiled replay of synchronous RL vs a plain on-policy RL loop in JAX.

`rl_sync` on `rl-digits` (4 actors; a schedule from `st.simulate_schedule` on a
1 : 1 : 1.5 : 3 cluster: every update trains on one rollout of each actor, all
generated on the current version):
  ours   `st.engine.replay` of that schedule (one compiled chunk: `eval_every` = the
         number of updates), which also builds the initial parameters (the task's
         supervised warm start) and evaluates twice (at update 0 and at the end);
  plain  the loop a user would write: the same model, generation and update in ONE
         jitted `lax.scan` over updates; per update, for each actor a (vmapped):
             idx     = task.prompt_indices(data_key, a, u)
             rollout = task.generate(params, generation_key(data_key, a, u), idx)
             g_a     = grad of task.loss(params, rollout, stop_gradient(task.logp(params, rollout)))
         the mean of the g_a over actors, one `optax.adam(1e-3)` step (the task's own
         optimizer, as the replay uses it); timed with the same initial parameters and
         the same two evaluations around it, so both do the same work.
Compile is excluded: each is run once untimed (the warm-up compiles it), then both are
timed interleaved `--reps` times (the machine is shared: loads change within seconds);
a ratio is the median of the ratios of adjacent pairs, in wall-clock time and in CPU
time of the process. `chunks` compares the compiled parts alone: ours' replay chunk
(`engine.core.run_chunk` on a prepared plan, no schedule, no evaluation) vs plain's
scan. The final parameters of ours and plain are compared and checked. They are the
same mathematics in two programs: the replay averages the slots of an update in the
schedule's arrival order and builds Adam as the task's optimizer spec (a chain with the
learning rate in its state), plain averages in actor order with `optax.adam`; each
update rounds differently in float32 and the difference accumulates over updates
(measured before the check existed: 1 ulp after 1 update, 2.7e-7 to 5.4e-7 of the largest
|parameter| per update at 16 to 80 updates). They are held to 1e-6 x updates x the
largest |parameter|; beyond it the script exits 1 after its JSON line, with one line on
stderr.
Target: ours >= 0.8x plain. Prints ratios measured in this run; ends with one JSON line.

    python benchmarks/rl_speed.py [--quick] [--reps N] [--updates N] [--objective decoupled_ppo]
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

import staleness as st
from _report import Agreement, difference, finish
from staleness.engine import core
from staleness.engine import run as _run
from staleness.engine.plan import chunk_inputs, make_plan
from staleness.engine.rollout import generation_key

NUM_ACTORS = 4
CLUSTER = [1.0, 1.0, 1.5, 3.0]
RTOL = 1e-6   # ours vs plain final parameters, per update, of the largest |parameter| (see the docstring)


def clock(fn):
    """(wall seconds, CPU seconds of this process) of fn()."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def plain_loop(task, n, seed=0, lr=1e-3):
    """(run, train): `train(task, params)` is the plain on-policy loop (one jitted
    `lax.scan` of n updates, compiled here); `run()` is what is timed: initial
    parameters, an evaluation, the loop, an evaluation (as the replay does).
    Returns the final parameters."""
    init_key, data_key = core.keys(seed)
    tx = optax.adam(lr)
    actors = jnp.arange(task.num_workers)

    @jax.jit
    def train(task, params):
        def step(carry, u):
            params, state = carry

            def actor(a):
                idx = task.prompt_indices(data_key, a, u)
                rollout = task.generate(params, generation_key(data_key, a, u), idx)
                prox = lax.stop_gradient(task.logp(params, rollout))
                return jax.value_and_grad(task.loss)(params, rollout, prox)

            losses, grads = jax.vmap(actor)(actors)
            updates, state = tx.update(jax.tree.map(lambda g: g.mean(0), grads), state, params)
            return (optax.apply_updates(params, updates), state), losses.mean()

        (params, _), losses = lax.scan(step, (params, tx.init(params)), jnp.arange(n))
        return params, losses

    def run():
        params = task.init_params(init_key)
        jax.device_get(core.evaluate(task, params))
        params, losses = train(task, params)
        jax.device_get(core.evaluate(task, params))
        return jax.device_get(params)

    return run, train


def ours(task, sched, n):
    """`st.engine.replay` of `sched`: one chunk, evaluations at 0 and n. Returns the final params."""
    return lambda: st.engine.replay(sched, task, eval_every=n).params


def chunk_only(task, sched, n, seed=0):
    """ours' compiled chunk alone, on a prepared plan and carry (built before timing),
    called as `st.engine.replay` calls it (so its compiled program is the replay's)."""
    opt = _run.resolve_optimizer(None, None, n, task)
    local, _, _ = _run.local_setup([sched], task, None)
    plan = make_plan(sched, n)
    consts = {"data_key": core.keys(seed)[1], "rule": jnp.int32(0)}
    xs = core.pad_chunk(chunk_inputs(task, plan, 0, consts["data_key"]), min(plan.chunk, plan.num_updates))
    rules = (st.lr.get("constant"),)

    def run():
        carry = core.init_carry(task, seed, opt, plan.ring)
        jax.block_until_ready(carry)
        t, c = time.perf_counter(), time.process_time()
        carry, _ = core.run_chunk(task, carry, xs, consts, opt=opt.tx, rules=rules, slot_mode="vmap", local=local,
                                  padded=plan.padded_updates)
        jax.block_until_ready(carry)
        return time.perf_counter() - t, time.process_time() - c

    return run


def plain_only(task, train, seed=0):
    params = task.init_params(core.keys(seed)[0])
    jax.block_until_ready(params)

    def run():
        return clock(lambda: jax.block_until_ready(train(task, params)))

    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=None, help="interleaved repetitions (default 2 quick, 5 full)")
    ap.add_argument("--updates", type=int, default=None, help="updates (default 8 quick, 80 full)")
    ap.add_argument("--objective", default="decoupled_ppo")
    args = ap.parse_args()
    reps = args.reps or (2 if args.quick else 5)
    n = args.updates or (8 if args.quick else 80)
    t_start = time.perf_counter()

    task = st.tasks.get("rl-digits", num_workers=NUM_ACTORS, objective=args.objective)
    policy = st.policies.parse("rl_sync")
    sched = st.simulate_schedule(policy, st.cluster.heterogeneous(CLUSTER), num_updates=n, seed=0,
                                 sizes=_run.work_sizes(task, policy, 0))
    assert sched.num_updates == n and (sched.staleness[sched.applied] == 0).all()

    compile_s = {}
    run_ours = ours(task, sched, n)
    run_plain, train = plain_loop(task, n)
    compile_s["ours"] = clock(lambda: jax.block_until_ready(run_ours()))[0]    # warm-up: compiles
    compile_s["plain"] = clock(lambda: jax.block_until_ready(run_plain()))[0]
    chunks, plain_scan = chunk_only(task, sched, n), plain_only(task, train)
    chunk_first = chunks()[0]   # the replay's compiled program again: a run, no new compile expected
    plain_scan()

    t = {k: [] for k in ("ours", "ours_cpu", "plain", "plain_cpu", "chunks", "chunks_cpu", "scan", "scan_cpu")}
    params = {}
    for _ in range(reps):
        for name, fn in (("plain", run_plain), ("ours", run_ours)):
            w, c = clock(lambda: params.__setitem__(name, fn()))
            t[name].append(w)
            t[name + "_cpu"].append(c)
        for name, fn in (("scan", plain_scan), ("chunks", chunks)):
            w, c = fn()
            t[name].append(w)
            t[name + "_cpu"].append(c)

    med = statistics.median
    paired = lambda a, b: med([x / y for x, y in zip(t[a], t[b])])  # noqa: E731
    diff = difference(params["ours"], params["plain"])
    scale = max(float(np.max(np.abs(np.asarray(x)))) for x in jax.tree.leaves(params["plain"]))
    row = {
        "task": "rl-digits", "objective": args.objective, "policy": "rl_sync", "actors": NUM_ACTORS, "updates": n,
        "reps": reps, "quick": bool(args.quick),
        "ours_upd_per_s": n / med(t["ours"]), "plain_upd_per_s": n / med(t["plain"]),
        "vs_plain": paired("plain", "ours"), "vs_plain_cpu": paired("plain_cpu", "ours_cpu"),
        "chunks_upd_per_s": n / med(t["chunks"]), "scan_upd_per_s": n / med(t["scan"]),
        "chunks_vs_scan": paired("scan", "chunks"), "chunks_vs_scan_cpu": paired("scan_cpu", "chunks_cpu"),
        "max_abs_param_diff": diff, "max_abs_param": scale,
        "compile_s": compile_s, "chunk_first_call_s": chunk_first, "recompiled": chunk_first > 2 * med(t["chunks"]),
        "ours_s": t["ours"], "plain_s": t["plain"], "chunks_s": t["chunks"], "scan_s": t["scan"], "target": 0.8,
        "total_s": time.perf_counter() - t_start,
    }
    print(f"rl-digits rl_sync ({args.objective}, {NUM_ACTORS} actors, {n} updates, {reps} reps; compile excluded: "
          f"one untimed warm-up run each)")
    print(f"  end to end (init + 2 evals + training): ours {row['ours_upd_per_s']:.2f} upd/s | plain "
          f"{row['plain_upd_per_s']:.2f} upd/s | ours/plain {row['vs_plain']:.2f}x wall, "
          f"{row['vs_plain_cpu']:.2f}x cpu")
    print(f"  compiled parts alone: replay chunk {row['chunks_upd_per_s']:.2f} upd/s | plain scan "
          f"{row['scan_upd_per_s']:.2f} upd/s | {row['chunks_vs_scan']:.2f}x wall, "
          f"{row['chunks_vs_scan_cpu']:.2f}x cpu")
    check = Agreement("the replay (st.engine.replay)", "the plain on-policy lax.scan loop", diff, RTOL * n * scale,
                      what="max |final parameter difference|",
                      why=f"{RTOL:g} x {n} updates x max |parameter| {scale:.3g}")
    print(f"  final params: max |ours - plain| = {diff:.3g} (max |param| {scale:.3g}; tolerance {check.tolerance:.3g}: "
          f"{'within' if check.ok else 'BEYOND'})")
    print(f"  first (compiling) runs: ours {compile_s['ours']:.1f} s, plain {compile_s['plain']:.1f} s; the replay's "
          f"chunk called by hand first took {chunk_first:.1f} s (timed: {med(t['chunks']):.1f} s: "
          f"{'recompiled?' if row['recompiled'] else 'no recompile'}); "
          f"total {row['total_s']:.0f} s")
    ok = row["vs_plain"] >= 0.8
    print(f"  target ours >= 0.8x plain: {'met' if ok else 'NOT met'}")
    finish(row, [check])


if __name__ == "__main__":
    main()
