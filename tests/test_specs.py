"""One spec grammar for policies, lr rules and optimizers (`staleness.infra.specs`), and
fuzzing of every spec parser: a malformed spec is a named ValueError in Python
and one line with exit status 2 on the command line, never a traceback."""

import hypothesis.strategies as hs
import pytest
from hypothesis import HealthCheck, given, settings

from staleness import cluster, lr, policies
from staleness.infra import specs
from staleness.cli import main
from staleness.tasks import optim

# Characters specs are made of, plus a few that are never valid.
_ALPHABET = "abcdefghiklmnoprstuvwxyz_0123456789.:,=+-*@e "
_WORDS = ["bsp", "asp", "ssp", "dssp", "softsync", "backup", "nocap", "constant", "per_gradient", "tau",
          "delay_adaptive", "sgd", "adam", "momentum", "nesterov", "cosine", "linear", "jitter", "stragglers",
          "fail", "gtx1060", "3", "12", "0.9", "-1", "x", ":", ",", "+", "=", "*", "@", "1e3", ""]
spec_text = hs.one_of(hs.text(_ALPHABET, max_size=24),
                      hs.lists(hs.sampled_from(_WORDS), max_size=6).map("".join))


def test_grammar_positional_keyword_and_comma_forms_agree():
    assert policies.parse("dssp:2:5") == policies.parse("dssp:2,5") == policies.parse("DSSP:s_low=2,r_max=5")
    assert policies.parse("dssp:2:5:nocap") == policies.dssp(2, 5, cap=False)
    assert lr.get("delay_adaptive:num_workers=4") == lr.delay_adaptive(4)
    assert optim.get("momentum:momentum=0.5+cosine") == optim.get("momentum:0.5+cosine")
    main_part, mods = specs.split("adam+cosine", "optimizer")
    assert main_part.name == "adam" and [m.name for m in mods] == ["cosine"]


@pytest.mark.parametrize("parse, spec, fragment", [
    (policies.parse, "ssp:1:2", "too many positional values for 'ssp' (it takes 1: staleness)"),
    (policies.parse, "ssp:staleness=1,staleness=2", "given twice"),
    (policies.parse, "ssp:staleness=1:2", "positional '2' after KEY=VALUE"),
    (policies.parse, "dssp:1.5", "must be an integer"),
    (lr.get, "delay_adaptive", "needs num_workers"),
    (optim.get, "momentum:nan", "finite number"),
    (optim.get, "rmsprop", "unknown optimizer"),
    (optim.get, "adam++cosine", "empty part"),
])
def test_spec_errors_quote_the_spec_and_name_the_part(parse, spec, fragment):
    with pytest.raises(specs.SpecError) as e:
        parse(spec)
    assert repr(spec) in str(e.value) and fragment in str(e.value)


@settings(max_examples=150)
@given(spec_text)
def test_every_parser_accepts_or_raises_a_named_value_error(text):
    for parse in (policies.parse, lr.get, optim.get, cluster.parse):
        try:
            parse(text)
        except ValueError as e:
            assert str(e) and "\n" not in str(e).strip(), repr(e)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=spec_text)
def test_cli_rejects_a_bad_spec_with_one_line_and_exit_2(text, capsys):
    capsys.readouterr()
    for flag, parse, argv in (("--policy", policies.parse, ["schedule", "--updates", "3"]),
                              ("--cluster", cluster.parse, ["schedule", "--updates", "3", "--policy", "asp"]),
                              ("--lr-rule", lr.get, ["simulate", "--updates", "1", "--out", "/proc/x/none"]),
                              ("--optimizer", optim.get, ["simulate", "--updates", "1", "--out", "/proc/x/none"])):
        try:
            parse(text)
        except ValueError:
            pass
        else:
            continue  # a valid spec: the command would run (not what this test is about)
        code = main([*argv, f"{flag}={text}"])
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("staleness: error:"), (flag, text, err)
        assert "Traceback" not in err
