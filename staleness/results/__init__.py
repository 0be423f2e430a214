"""Analysis and reporting: what runs produced and how they compare.

- `result`: `Result` (history, schedule, parameters, configuration) and its files;
- `metrics`, `stats`: evaluation metrics; intervals and the verdict scale;
- `rollouts`: what asynchronous RL consumed vs generated;
- `compare`: the comparison table over policies and seeds;
- `plots`, `explorer`: figures and the Jupyter explorer;
- `tracking`: callbacks (progress, logs, experiment trackers).

`staleness.results.Result` and the other names of `result` are re-exported here.
"""

from staleness.results.result import (FORMAT_VERSION, STATUSES, DivergenceError, FileFormatError, Result,
                                      flatten_params, unflatten_params)

__all__ = ["Result", "FORMAT_VERSION", "DivergenceError", "FileFormatError", "STATUSES", "flatten_params",
           "unflatten_params"]


def __dir__():
    return sorted(__all__)   # the public names only, not the imports
