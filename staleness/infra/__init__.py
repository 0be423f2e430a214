"""Infrastructure that every layer uses and that knows nothing of training.

- `checks`: argument validators (`ArgumentError` names the argument and what is valid);
- `specs`: the spec grammar (`name:ARG:key=value`);
- `files`: atomic writes and output directories;
- `checkpoint`: checkpoint files;
- `procs`: child processes with deadlines;
- `interrupts`: Ctrl-C that stops loops and keeps what was recorded;
- `tracking`: experiment tracking (a callback per evaluation; TensorBoard and W&B writers).
"""

__all__: list[str] = []


def __dir__():
    return ["checkpoint", "checks", "files", "interrupts", "procs", "specs", "tracking"]
