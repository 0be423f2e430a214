"""The README's code runs: its "Bring your own model" block, and the spec strings its
command-line examples use parse."""

import re
import shlex
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _block(after: str) -> str:
    tail = README[README.index(after):]
    return re.search(r"```python\n(.*?)```", tail, re.S).group(1)


def test_bring_your_own_model_block_runs():
    scope: dict = {}
    exec(compile(_block("## Bring your own model"), "README.md", "exec"), scope)
    result = scope["result"]
    assert result.status == "complete" and result.schedule.num_updates == 500
    assert result.history["mse"].iloc[-1] < result.history["mse"].iloc[0]


def test_command_line_examples_parse(capsys):
    from staleness.cli import build_parser

    block = re.search(r"## Command line\n\n```bash\n(.*?)```", README, re.S).group(1)
    parser = build_parser()
    for line in block.splitlines():
        argv = shlex.split(line.split("#", 1)[0])
        assert argv and argv[0] == "staleness", line
        if argv[1:] == ["--version"]:
            continue
        args = parser.parse_args(argv[1:])
        from staleness import cluster, policies
        pols = getattr(args, "policy", None) or []
        for spec in [pols] if isinstance(pols, str) else pols:
            policies.parse(spec)
        if getattr(args, "cluster", None):
            cluster.parse(args.cluster)
        if getattr(args, "optimizer", None):
            from staleness.tasks import optim
            optim.get(args.optimizer)


def test_your_own_policy_block_defines_a_policy_that_simulates():
    import staleness as st

    scope: dict = {}
    exec(compile(_block("**Your own policy, in your own file.**"), "README.md", "exec"), scope)
    st.policies.register("readme_bounded_asp", scope["bounded_asp"], overwrite=True)
    sched = st.simulate_schedule("readme_bounded_asp:1", "1*2,3*2", num_updates=40, seed=0)
    assert sched.staleness[sched.applied].max() <= 1 and sched.columns["dropped"].sum() > 0


def test_async_rl_block_runs_and_reports_reward_and_staleness(capsys):
    scope: dict = {}
    exec(compile(_block("### Asynchronous RL: data staleness"), "README.md", "exec"), scope)
    result, task = scope["result"], scope["task"]
    assert "reward" in result.history and len(result.history) == 3
    s = scope["st"].rollouts.summary(result.schedule, task)
    assert s["max_staleness"] <= 2 and abs(sum(s["staleness_per_token"]) - 1.0) < 1e-9
    assert "reward" in capsys.readouterr().out


def test_own_rl_task_block_is_the_tested_plugin_and_runs():
    """The README's own RL task is tests/plugins/sorttask.py (which test_rl_first_hour runs on
    every command), and its block builds a task that simulates."""
    import staleness as st

    block = _block("**Your own RL task**")
    plugin = (Path(__file__).resolve().parent / "plugins" / "sorttask.py").read_text()
    assert block.split("from staleness.tasks import rl\n", 1)[1].strip() in plugin
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    task = scope["make_task"](num_workers=2)
    r = st.simulate(task, "rl_async:1", st.cluster.heterogeneous([1.0, 2.0]), num_updates=3, eval_every=3)
    assert r.status == "complete" and "reward" in r.history
