"""Analysis and reporting: what runs produced and how they compare (`stats`, `rollouts`,
`compare`, `planner`, `plots`, `explorer`).

`Result` lives beside the engine that produces it (`staleness.engine.result`) and is
re-exported here with its names, as `staleness.Result` too; the metrics a task declares
live with the tasks (`staleness.tasks.metrics`, `staleness.metrics`).
"""

from staleness.engine.result import (FORMAT_VERSION, STATUSES, DivergenceError, FileFormatError, Result,
                                     flatten_params, unflatten_params)

__all__ = ["Result", "FORMAT_VERSION", "DivergenceError", "FileFormatError", "STATUSES", "flatten_params",
           "unflatten_params"]


def __dir__():
    return sorted(__all__)   # the public names only, not the imports
