"""DSP vs GPipe (and DDG, backprop): ratios measured in one run.

1. K = 4 devices (virtual CPU devices unless accelerators are present): batches
   per tick and ticks per wall second of DSP(1,1,1,0) and GPipe(4) running the
   same residual MLP on digits with stage k on device k; their product is
   batches per wall second.
2. Simulated throughput (batches per simulated second, `simulate_timing`) with
   stage 2 made 2x slower, and with random stragglers: DSP relative to GPipe,
   with the recompute charged in full (recompute_cost=1) and overlapped (0).
3. Memory: bytes each stage keeps between a forward and its backward
   (DSP: m_k inputs; stashing adds m_k weight copies; DDG: m_k stored graphs).
4. Test accuracy on digits after the same number of batches for backprop,
   GPipe, DDG and DSP (momentum SGD 0.9, the same learning rate for all).

Ends with one JSON line. On virtual CPU devices the K "devices" share the
host's cores, so wall-clock ratios measure overhead, not parallel speed-up.

    python benchmarks/pipeline_speed.py [--batches 600] [--lr 0.005] [--device-batches 200]
"""

from __future__ import annotations

import argparse
import json
import os
import time

K = 4

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    import jax

    jax.config.update("jax_num_cpu_devices", K)  # no effect on GPU/TPU hosts

import jax  # noqa: E402

import staleness.pipeline as pp  # noqa: E402
from staleness import cluster as C  # noqa: E402
from staleness.engine.result import DivergenceError  # noqa: E402


def devices_part(ptask, n: int) -> dict:
    out = {}
    for spec in ("dsp:1,1,1,0", "gpipe:4"):
        r = pp.run_devices(ptask, spec, n, lr=0.005, eval_every=n)
        bpt = n / r.config["ticks"]
        out[spec] = {"batches_per_tick": bpt, "ticks_per_s": r.config["ticks_per_s"],
                     "batches_per_s": bpt * r.config["ticks_per_s"], "compile_s": r.config["compile_s"],
                     "devices": r.config["devices"]}
        print(f"  {spec:12s} on {len(r.config['devices'])} devices: {bpt:.3f} batches/tick, "
              f"{r.config['ticks_per_s']:.1f} ticks/s -> {bpt * r.config['ticks_per_s']:.1f} batches/s "
              f"(compile {r.config['compile_s']:.1f} s)")
    return out


def timing_part(n: int) -> dict:
    out = {}
    clusters = {"2x_slower_stage2": C.heterogeneous([1.0, 1.0, 2.0, 1.0]),
                "stragglers_5pct_4x": C.constant(K).stragglers(0.05, 4.0, 3.0)}
    for name, cl in clusters.items():
        for rc in (1.0, 0.0):
            tp = {spec: pp.simulate_timing(pp.make_plan(pp.parse(spec), K, n), cl, seed=0,
                                           recompute_cost=rc).throughput
                  for spec in ("gpipe:4", "dsp:1,1,1,0", "dsp:2,2,2,0", "ddg", "backprop")}
            key = f"{name}_recompute{rc:g}"
            out[key] = {**tp, "dsp_over_gpipe": tp["dsp:1,1,1,0"] / tp["gpipe:4"],
                        "dsp222_over_gpipe": tp["dsp:2,2,2,0"] / tp["gpipe:4"]}
            print(f"  {key:32s} " + "  ".join(f"{s}={v:.3f}" for s, v in tp.items())
                  + f"  DSP/GPipe={tp['dsp:1,1,1,0'] / tp['gpipe:4']:.2f}")
    return out


def memory_part(ptask) -> dict:
    """Bytes each stage keeps between its forward and backward of a batch (the queues)."""
    import jax.numpy as jnp

    from staleness.engine import core
    from staleness.tasks.optim import get as get_optimizer
    from staleness.pipeline import sim
    from staleness.pipeline import stage as S

    out = {}
    params = ptask.init_stage_params(core.keys(0)[0])
    ctx = S.Context(ptask, core.keys(0)[1], jnp.float32(0.1))
    for spec in ("gpipe:4", "dsp:1,1,1,0", "dsp:1,1,1,0+stash", "ddg"):
        plan = pp.make_plan(pp.parse(spec), K, 1)
        _, carry = sim.init(ptask, plan, get_optimizer("momentum:0.9"), params, ctx)
        out[spec] = sim.stored_bytes(carry)
        print(f"  {spec:18s} lags {list(plan.lags)}: stored KiB per stage "
              + " ".join(f"{b / 1024:.1f}" for b in out[spec]))
    return out


def accuracy_part(ptask, n: int, lr: float) -> dict:
    out = {}
    for spec in ("backprop", "gpipe:4", "ddg", "dsp:1,1,1,0"):
        try:
            r = pp.simulate(ptask, spec, n, lr=lr, eval_every=n)
            out[spec] = {"accuracy": r.final["accuracy"], "loss": r.final["loss"],
                         "sim_time_s": r.schedule.end_time, "status": r.status}
        except DivergenceError as e:
            out[spec] = {"accuracy": float("nan"), "status": "diverged", "error": str(e)}
        print(f"  {spec:12s} accuracy {out[spec]['accuracy']:.3f} after {n} batches "
              f"({out[spec].get('sim_time_s', float('nan')):.0f} simulated s at 1 s/batch/stage)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=600, help="batches for the accuracy comparison")
    ap.add_argument("--device-batches", type=int, default=200, help="batches per device run")
    ap.add_argument("--lr", type=float, default=0.005)
    args = ap.parse_args()
    ptask = pp.tasks.get("digits-resmlp", num_stages=K, batch_size=32)
    t0 = time.perf_counter()
    print(f"1. K = {K} devices ({jax.devices()[0].platform}), digits-resmlp, batch 32:")
    dev = devices_part(ptask, args.device_batches)
    print("2. simulated throughput (batches per simulated second; 1 s per batch per stage):")
    sim_tp = timing_part(2000)
    print("3. memory: what each stage stores between forward and backward (batch 32):")
    mem = memory_part(ptask)
    print(f"4. test accuracy after {args.batches} batches (momentum 0.9, lr {args.lr:g}):")
    acc = accuracy_part(ptask, args.batches, args.lr)
    d, g = dev["dsp:1,1,1,0"], dev["gpipe:4"]
    summary = {
        "benchmark": "pipeline_speed", "stages": K, "platform": jax.devices()[0].platform,
        "devices": {"dsp_batches_per_tick": d["batches_per_tick"], "gpipe_batches_per_tick": g["batches_per_tick"],
                    "dsp_ticks_per_s": d["ticks_per_s"], "gpipe_ticks_per_s": g["ticks_per_s"],
                    "dsp_over_gpipe_batches_per_s": d["batches_per_s"] / g["batches_per_s"]},
        "simulated": {k: {"dsp_over_gpipe": v["dsp_over_gpipe"], "dsp222_over_gpipe": v["dsp222_over_gpipe"]}
                      for k, v in sim_tp.items()},
        "stored_bytes_per_stage": mem,
        "accuracy": {k: v["accuracy"] for k, v in acc.items()},
        "accuracy_batches": args.batches, "lr": args.lr, "wall_s": time.perf_counter() - t0,
    }
    print(f"DSP/GPipe on devices: {d['batches_per_tick'] / g['batches_per_tick']:.1f}x batches per tick, "
          f"{summary['devices']['dsp_over_gpipe_batches_per_s']:.2f}x batches per wall second; simulated with a "
          f"2x slower stage: {sim_tp['2x_slower_stage2_recompute1']['dsp_over_gpipe']:.2f}x")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
