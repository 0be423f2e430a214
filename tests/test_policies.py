"""Unit tests of the policy state machines, driven by hand."""

import math

import pytest

from staleness import policies as P


def test_parse_roundtrip():
    for spec in ["bsp", "asp", "ssp:0", "ssp:3", "dssp:3:12", "dssp:2:5:nocap", "softsync:4", "backup:2"]:
        assert P.parse(spec).describe() == spec
    assert P.parse("dssp") == P.dssp(3, 12)


def test_parse_defaults_are_the_factories_for_every_policy():
    """One behaviour for omitted numbers: every policy takes its factory's defaults."""
    assert P.parse("ssp") == P.ssp() == P.ssp(3)
    assert P.parse("dssp:2") == P.dssp(2) == P.dssp(2, 12)
    assert P.parse("softsync") == P.softsync() and P.parse("backup") == P.backup_workers()
    assert P.parse("dssp:s_low=2,r_max=5") == P.parse("dssp:2,5") == P.parse("dssp:2:5") == P.dssp(2, 5)
    assert P.parse("dssp:nocap") == P.dssp(cap=False)


@pytest.mark.parametrize(
    "spec, fragment",
    [("ssp:-1", "staleness"), ("ssp:1:2", "too many positional values for .ssp. \\(it takes 1: staleness\\)"), ("foo", "unknown policy"),
     ("ssp:x", "must be an integer"), ("softsync:0", "n = 0"), ("dssp:-1:3", "s_low"), ("", "is empty"),
     ("ssp:k=1", "no argument 'k'"), ("ssp:", "empty"), ("asp+x", "no '\\+' modifiers")],
)
def test_parse_errors_name_the_problem(spec, fragment):
    with pytest.raises(ValueError, match=fragment):
        P.parse(spec)


def test_constructor_errors():
    with pytest.raises(ValueError, match="staleness = -1"):
        P.ssp(-1)
    with pytest.raises(ValueError, match="r_max"):
        P.dssp(3, -2)
    with pytest.raises(ValueError, match="num_workers = 0"):
        P.asp().init(0)
    with pytest.raises(ValueError, match=r"n = 9 must be <= the number of workers \(8\)"):
        P.softsync(9).init(8)
    with pytest.raises(ValueError, match="b = 4"):
        P.backup_workers(4).init(4)


def test_policies_are_immutable_values():
    p = P.ssp(3)
    with pytest.raises(Exception):
        p.staleness = 4
    assert P.ssp(3) == P.ssp(3) and hash(P.ssp(3)) == hash(P.ssp(3))


def test_bsp_round_by_hand():
    pol = P.bsp()
    st = pol.init(3)
    o = pol.push(st, 0, 0, 1.0)
    assert (o.accepted, o.update, o.released) == (True, False, ())
    o = pol.push(st, 2, 0, 2.0)
    assert (o.update, o.released) == (False, ())
    o = pol.push(st, 1, 0, 3.0)
    assert o.update and sorted(o.released) == [0, 1, 2] and st.version == 1


def test_ssp_blocks_only_beyond_threshold():
    pol = P.ssp(1)
    st = pol.init(2)
    assert pol.push(st, 0, 0, 1.0).released == (0,)      # clocks 1,0: gap 1 <= 1
    assert pol.push(st, 0, 1, 2.0).released == ()        # clocks 2,0: gap 2 > 1
    o = pol.push(st, 1, 0, 3.0)                          # clocks 2,1 -> worker 0 released
    assert sorted(o.released) == [0, 1] and o.update


def test_ssp_zero_gate_is_bsp_gate():
    a, b = P.ssp(0), P.bsp()
    sa, sb = a.init(3), b.init(3)
    for w in [0, 2, 1, 1, 0, 2]:
        ra = a.push(sa, w, 0, 0.0).released
        rb = b.push(sb, w, 0, 0.0).released
        assert sorted(ra) == sorted(rb)


def test_softsync_counts_gradients_from_any_worker():
    pol = P.softsync(2)  # 4 workers -> c = 2
    st = pol.init(4)
    assert not pol.push(st, 0, 0, 0.0).update
    assert pol.push(st, 0, 0, 0.0).update  # the same worker twice completes an update
    assert st.version == 1


def test_backup_drops_late_gradients():
    pol = P.backup_workers(1)  # 3 workers: 2 per round
    st = pol.init(3)
    assert pol.push(st, 0, 0, 0.0).released == ()
    o = pol.push(st, 1, 0, 0.0)
    assert o.update and sorted(o.released) == [0, 1]
    o = pol.push(st, 2, 0, 0.0)  # computed on version 0, now version 1: late
    assert not o.accepted and o.released == (2,) and st.dropped == 1


def test_failure_releases_waiting_workers():
    pol = P.ssp(0)
    st = pol.init(3)
    pol.push(st, 0, 0, 0.0)
    pol.push(st, 1, 0, 0.0)
    o = pol.fail(st, 2, 1.0)
    assert sorted(o.released) == [0, 1]
    o = pol.join(st, 2, 2.0)
    assert o.released == (2,) and st.clocks[2] == st.min_clock == 1


def test_bsp_failure_completes_round():
    pol = P.bsp()
    st = pol.init(3)
    pol.push(st, 0, 0, 0.0)
    pol.push(st, 1, 0, 0.0)
    o = pol.fail(st, 2, 1.0)
    assert o.update and st.version == 1 and sorted(o.released) == [0, 1]


def test_dssp_controller_picks_the_closest_slow_push():
    # fast worker pushes every 1 s (last at 10), slow every 2.6 s (last at 9)
    # slow pushes at 11.6, 14.2, 16.8 ...; fast at 10, 11, 12, ... -> k = 2 lands at 12 (0.4 away from 11.6)?
    # |11 - 11.6| = 0.6, |12 - 11.6| = 0.4, |14 - 14.2| = 0.2, |17 - 16.8| = 0.2 (tie: keep k = 4),
    # |22 - 22.0| = 0 -> k = 12 when r_max allows it
    assert P.dssp_controller(10.0, 9.0, 9.0, 6.4, r_max=12) == 12
    assert P.dssp_controller(10.0, 9.0, 9.0, 6.4, r_max=8) == 4
    assert P.dssp_controller(10.0, 9.0, 9.0, 6.4, r_max=3) == 2
    assert P.dssp_controller(10.0, math.nan, 9.0, 6.4, r_max=12) == 0
    assert P.dssp_controller(10.0, 9.0, 9.0, 6.4, r_max=0) == 0


def test_dssp_cap_clips_the_grant():
    pol = P.dssp(1, 2)
    st = pol.init(2)
    # worker 0 runs ahead with regular pushes; worker 1 pushed once, slowly
    pol.push(st, 1, 0, 5.0)
    t = 5.0
    gaps = []
    for i in range(10):
        t += 1.0
        o = pol.push(st, 0, 0, t)
        if 0 not in o.released:
            break
        gaps.append(st.clocks[0] - st.min_clock)
    assert max(gaps) <= 1 + 2
    assert st.rstar and all(0 <= r <= 2 for _, _, r in st.rstar)


def test_push_from_dead_worker_is_an_error():
    pol = P.asp()
    st = pol.init(2)
    pol.fail(st, 1, 0.0)
    with pytest.raises(ValueError, match="not live"):
        pol.push(st, 1, 0, 1.0)
