"""Membership, defined: several layers' down intervals combine (issue 37).

A worker is up only when every layer has it up: its down time is the union of
the down intervals every layer gives it (`staleness.cluster.membership`). Here:
the bug where one layer's rejoin ended another layer's outage, schedules with
failures and joins pinned bitwise (recorded before membership became lazy),
a user-defined periodic preemption layer (recipe 3's example: endless, read
lazily), and the errors of bad outages.
"""

import dataclasses
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import staleness as st
from staleness import cluster as C
from staleness.cluster import layers
from staleness.sim.scheduler import simulate_schedule, stream_schedule
from test_sim import schedule_digest


def _pushes(sched, worker, start, end):
    """Gradients `worker` pushed with push_time in [start, end) seconds."""
    c = sched.columns
    at = c["push_time"][c["worker"] == worker]
    return int(np.count_nonzero((at >= start) & (at < end)))


_digest = schedule_digest   # the schedule's columns, update times and end time, bitwise


# -- the bug -------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["asp", "ssp:2"])
def test_an_outage_inside_another_layers_outage_does_not_end_it(policy):
    """Observed: a second layer's outage of worker 3 inside `fail=3@10-50` let worker 3
    push 19 gradients during the window: the inner outage's rejoin at 30 ended both."""
    outer = C.parse("1*4+jitter=0.1+fail=3@10-50")
    both = outer.with_modifier(C.Failures(((3, 20.0, 30.0),)))
    sched = simulate_schedule(policy, both, max_time=70.0, seed=0)
    assert _pushes(sched, 3, 10.0, 50.0) == 0
    assert _pushes(sched, 3, 50.0, 70.0) > 0   # it does rejoin at 50
    # the union of [10, 50) and [20, 30) is [10, 50): the outer layer's schedule, bitwise
    assert _digest(sched) == _digest(simulate_schedule(policy, outer, max_time=70.0, seed=0))


def test_two_fail_layers_in_a_spec_string_combine():
    sched = simulate_schedule("asp", "1*4+fail=3@10-50+fail=3@20-30", max_time=70.0, seed=0)
    assert _pushes(sched, 3, 10.0, 50.0) == 0 and _pushes(sched, 3, 50.0, 70.0) > 0


def test_the_union_over_a_shared_server_link_and_an_allreduce():
    for net in ("server=100mbps:1ms", "allreduce=ring:1gbps:1ms"):
        outer = C.parse(f"1*4+jitter=0.1+{net}+fail=3@10-50")
        sched = simulate_schedule("bsp", outer.failures([(3, 20.0, 30.0)]), max_time=70.0, seed=0,
                                  payload_bytes=40000)
        assert _pushes(sched, 3, 10.0, 50.0) == 0 and _pushes(sched, 3, 50.0, 70.0) > 0
        assert _digest(sched) == _digest(simulate_schedule("bsp", outer, max_time=70.0, seed=0, payload_bytes=40000))


# -- schedules with failures and joins, bitwise as before membership was lazy ---------------------
_CLUSTERS = {
    "spec_fail": "1,1.3,2.6,2+jitter=0.2+stragglers=0.05:3:4+network=0.01:0.02+fail=3@10-50,1@20-",
    "touching": "1*4+jitter=0.1+fail=0@5-10,0@10-20,2@3-7",
    "two_layers": "1*4+jitter=0.3+fail=1@4-9+fail=1@9-15,2@6-",
    "periodic_fail": "gtx1080ti*2,gtx1060*2+periodic=20:5:3+fail=0@2-30,3@15-16,3@40-70",
    "links_fail": "1*4+jitter=0.1+net=1gbps:5ms+fail=3@10-20",
    "server_fail": "1*4+jitter=0.1+server=100mbps:1ms+fail=2@6-14,0@20-",
    "allreduce_fail": "1*4+jitter=0.1+allreduce=ring:1gbps:1ms+fail=2@6-14",
    "equal_times": "1*4+fail=0@5-10,1@5-10,2@10-15,3@10-",
    "all_fail": "1*4+fail=0@10,1@10,2@10,3@10",
}


@pytest.mark.parametrize("cluster, policy, payload, digest", [
    ("spec_fail", "asp", None, "b7729182ab85d7e3"),
    ("spec_fail", "dssp:1:4", None, "7687bca36d90c0d0"),
    ("touching", "ssp:2", None, "0343e831f1f483a6"),
    ("touching", "bsp", None, "fa0ae323a34d34df"),
    ("two_layers", "softsync:2", None, "df58268e98f72a5a"),
    ("two_layers", "backup:1", None, "87d1f180e79b7388"),
    ("equal_times", "asp", None, "153905037f6c9574"),
    ("periodic_fail", "diloco:4", None, "9cc3ebd15ac6c539"),
    ("links_fail", "rl_async:2", 40000, "def7c3431a5d0f6b"),
    ("server_fail", "ssp:2", 40000, "54349e55b3f3bf2f"),
    ("allreduce_fail", "bsp", 40000, "cefb8fa6072528ea"),
    ("all_fail", "asp", None, "d04371160f4cff14"),
])
def test_golden_schedules_with_failures_and_joins(cluster, policy, payload, digest):
    """Digests recorded when every failure and join was queued before the run (issue 37);
    a change here changes existing schedules."""
    sched = simulate_schedule(policy, _CLUSTERS[cluster], num_updates=80, seed=7, payload_bytes=payload)
    assert _digest(sched) == digest


# -- recipe 3's example: a periodic preemption layer ----------------------------------------------
# As written in ARCHITECTURE.md's recipe 3: tests/plugins/user_clusters.py, with its spec keyword.
sys.path.insert(0, str(Path(__file__).parent / "plugins"))
from user_clusters import Preempt  # noqa: E402


def _windows(period, down, phase, until):
    return [(phase + k * period, phase + k * period + down) for k in range(int((until - phase) // period) + 1)]


def test_recipe_a_periodic_preemption_layer():
    spot = st.cluster.parse("1*4+fail=3@100-200").with_modifier(Preempt((3,), 40.0, 10.0, 5.0))
    sched = st.simulate_schedule("asp", spot, num_updates=1000, seed=1)   # no horizon needed
    assert spot.describe() == "4+fail=3@100-200+user_clusters:preempt=3:40:10:5" and sched.end_time > 250.0
    # worker 3 is down in the union of [5 + 40k, 15 + 40k) and [100, 200), up in between
    down = [(5.0, 15.0), (45.0, 55.0), (85.0, 95.0), (100.0, 200.0), (205.0, 215.0), (245.0, 255.0)]
    for (a, b), (c, _) in zip(down, down[1:]):
        assert _pushes(sched, 3, a, b) == 0 and _pushes(sched, 3, b, c) > 0, (a, b, c)


def test_preemption_is_the_same_as_its_failures_listed_to_a_horizon():
    """Differential: the endless layer and a finite failures() list of the same intervals
    give the same schedule, bitwise, within the horizon."""
    base = C.parse("1,1.3,2.6,2+jitter=0.2+fail=3@100-130")
    spot = base.with_modifier(Preempt((1, 3), period=25.0, down=4.0, phase=3.0))
    listed = base.failures([(w, a, b) for a, b in _windows(25.0, 4.0, 3.0, 400.0) for w in (1, 3)])
    for policy in ("asp", "ssp:2", "bsp"):
        a = simulate_schedule(policy, spot, max_time=300.0, seed=2)
        b = simulate_schedule(policy, listed, max_time=300.0, seed=2)
        assert _digest(a) == _digest(b), policy
    # worker 3: the union of its preemptions and fail=3@100-130 ([103, 107) and [128, 132) overlap it)
    assert _pushes(a, 3, 100.0, 132.0) == 0 and _pushes(a, 3, 132.0, 153.0) > 0


def test_endless_membership_is_read_lazily():
    c = C.constant(2).with_modifier(Preempt((0,), period=10.0, down=2.0, phase=1.0))
    s = c.sampler(0)
    assert s.membership_events(until=25.0) == [(1.0, "fail", 0), (3.0, "join", 0), (11.0, "fail", 0),
                                               (13.0, "join", 0), (21.0, "fail", 0), (23.0, "join", 0)]
    assert list(itertools.islice(s.membership(), 3)) == [(1.0, "fail", 0), (3.0, "join", 0), (11.0, "fail", 0)]
    assert not stream_schedule("asp", c, num_updates=5).steady
    with pytest.raises(ValueError, match=r"membership_events: until = None, but cluster .* takes workers down "
                                         r"without end \(user_clusters:preempt=0:10:2:1\); give until="):
        s.membership_events()


def test_a_worker_down_for_good_ends_its_endless_outages():
    """Nothing more of a worker is read once a layer takes it down for good, so a run whose
    workers are all gone ends (rather than read preemptions that can never matter)."""
    c = C.parse("1*2+fail=0@30,1@30").with_modifier(Preempt((0, 1), period=10.0, down=2.0))
    assert list(c.sampler(0).membership()) == [(0.0, "fail", 0), (0.0, "fail", 1), (2.0, "join", 0),
                                                (2.0, "join", 1), (10.0, "fail", 0), (10.0, "fail", 1),
                                                (12.0, "join", 0), (12.0, "join", 1), (20.0, "fail", 0),
                                                (20.0, "fail", 1), (22.0, "join", 0), (22.0, "join", 1),
                                                (30.0, "fail", 0), (30.0, "fail", 1)]
    assert simulate_schedule("asp", c, num_updates=1000, seed=0).end_time == 30.0


def test_endless_layers_that_keep_a_worker_down_do_not_stall_the_others():
    """Two preemptions whose union never ends: worker 0 never comes back, though neither
    layer says so; the stream still moves on in time, and the other workers finish the run."""
    c = C.constant(2).with_modifier(Preempt((0,), 10.0, 6.0)).with_modifier(Preempt((0,), 10.0, 6.0, 5.0))
    assert c.sampler(0).membership_events(until=1000.0) == [(0.0, "fail", 0)]
    sched = simulate_schedule("asp", c, num_updates=200, seed=0)
    assert sched.num_updates == 200 and _pushes(sched, 0, 0.0, np.inf) == 0


# -- bad input: one line naming the argument -----------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Listed:
    """Outages given as a list (bad ones, for the errors)."""

    worker: int
    intervals: tuple

    def describe(self):
        return "listed"

    def wrap(self, inner, seed, stream):
        layer = layers.Layer(inner)
        layer.outages = inner.outages + (layers.Outages(self.worker, lambda: iter(self.intervals)),)
        return layer


def test_outages_given_as_a_list_rather_than_a_function():
    @dataclasses.dataclass(frozen=True)
    class Listed:
        def describe(self):
            return "listed"

        def wrap(self, inner, seed, stream):
            layer = layers.Layer(inner)
            layer.outages = inner.outages + (layers.Outages(1, [(1.0, 2.0)]),)
            return layer

    with pytest.raises(TypeError, match=r"^listed: Outages.intervals = \[\(1.0, 2.0\)\] must be a function "):
        C.constant(4).with_modifier(Listed()).sampler(0)


@pytest.mark.parametrize("make, needle", [
    (lambda: _Listed(4, ((1.0, 2.0),)), "listed: Outages.worker = 4 is not a worker id; valid ids are 0..3"),
    (lambda: _Listed(1, ((5.0, 5.0),)), "listed: worker 1's down interval (5.0, 5.0): rejoin_at = 5.0 must be "
                                       "a finite number > fail_at = 5"),
    (lambda: _Listed(1, ((5.0, 9.0), (2.0, 3.0))), "listed: worker 1's down interval (2.0, 3.0): fail_at = 2.0 "
                                                  "must be a finite number >= 5"),
    (lambda: _Listed(1, ((-1.0, 3.0),)), "fail_at = -1.0 must be a finite number >= 0"),
    (lambda: _Listed(1, ((1.0, float("nan")),)), "rejoin_at = nan must be a finite number > fail_at = 1"),
    (lambda: _Listed(1, (5.0,)), "listed: worker 1's down interval 5.0 must be a pair (fail_at, rejoin_at_or_None)"),
    (lambda: C.Failures(((1, 50.0, 40.0),)), "fail=1@50-40: worker 1's down interval (50.0, 40.0): rejoin_at = 40.0"),
])
def test_bad_outages_name_the_layer_worker_and_interval(make, needle):
    c = C.constant(4).with_modifier(make())
    with pytest.raises(ValueError) as e:
        simulate_schedule("asp", c, num_updates=20)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_bad_until_and_bad_preemption_arguments():
    with pytest.raises(ValueError, match=r"^membership_events: until = 'soon' must be a real number$"):
        C.constant(2).sampler(0).membership_events(until="soon")
    with pytest.raises(ValueError, match=r"^user_clusters:preempt=0:40:10:-5: worker 0's down interval \(-5.0, 5.0\): fail_at = "
                                         r"-5.0 must be a finite number >= 0 "):
        simulate_schedule("asp", C.constant(2).with_modifier(Preempt((0,), 40.0, 10.0, -5.0)), num_updates=5)
    with pytest.raises(ValueError, match="failures: worker 0 has overlapping down intervals"):
        C.constant(2).failures([(0, 1, 10), (0, 5, 20)])   # within one layer, still a mistake


def test_a_registered_modifier_is_a_spec_keyword_on_the_cli(capsys):
    """cluster.register_modifier (recipe 3): `user_clusters:preempt=...` imports the module and
    builds its layer; the spec round-trips, the keyword joins the grammar and the "known" list,
    and the CLI simulates it (worker 3 pushes nothing while it is down)."""
    from staleness.cli import main

    spec = "1*4+fail=3@100-200+user_clusters:preempt=3:40:10:5"
    c = C.parse(spec)
    assert c == C.parse("1*4+fail=3@100-200").with_modifier(Preempt((3,), 40.0, 10.0, 5.0))
    assert C.parse(c.describe()) == c and C.parse("1*4+preempt=3:40:10:5") == C.constant(4).with_modifier(
        Preempt((3,), 40.0, 10.0, 5.0))
    assert "'preempt=' WORKERS ':' PERIOD ':' DOWN" in C.grammar() and "preempt" in C.keywords()
    with pytest.raises(ValueError, match="known: jitter, .*preempt"):
        C.parse("1*4+preemt=3:40:10")
    with pytest.raises(ValueError, match="preempt down = 50 must be > 0 and < period = 40"):
        C.parse("1*4+preempt=3:40:50")
    with pytest.raises(ValueError, match="registered no modifier 'nope'"):
        C.parse("1*4+user_clusters:nope=1")
    with pytest.raises(ValueError, match="'jitter' is already a cluster spec keyword"):
        C.register_modifier("jitter", lambda c, v: c, "X")
    base = ["schedule", "--policy", "asp", "--updates", "300", "--json", "--cluster"]
    assert main(base + ["1*4+fail=3@100-200"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(base + [spec]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["cluster"] == c.describe() and plain["lost"] == 0 and got["lost"] > 0   # 300 updates: 81 s
    assert main(base + ["1*4+preemt=3:40:10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown modifier 'preemt'; known: jitter" in err[0]
