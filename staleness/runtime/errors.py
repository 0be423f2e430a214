"""Errors of a real run. Each keeps what was recorded up to the failure in `.result`."""

from __future__ import annotations

__all__ = ["RunFailure", "WorkerError", "WorkerLostError", "ServerLostError"]


class RunFailure(RuntimeError):
    """A real run stopped on a fault; `.result` is the Result recorded so far (or None)."""

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result


class WorkerError(RunFailure):
    """A worker raised. `.worker` is its id, `.message` its error and traceback."""

    def __init__(self, worker: int, message: str, result=None):
        first = message.strip().splitlines()[0] if message.strip() else "error"
        super().__init__(f"worker {worker} failed: {first}", result)
        self.worker = worker
        self.message = message


class WorkerLostError(RunFailure):
    """A worker (or its process) was lost and the run was told to stop
    (on_worker_failure='stop'), or no live worker was left."""

    def __init__(self, worker: int, reason: str, result=None):
        super().__init__(f"worker {worker} lost: {reason}", result)
        self.worker = worker
        self.reason = reason


class ServerLostError(RunFailure):
    """A worker process of a multi-process job lost the server (process 0 died or
    left, or this process was declared dead by the coordination service). There is
    no Result on this side: process 0 writes it. `staleness run` prints the
    message on one line and exits with status 1."""

    def __init__(self, process: int, reason: str):
        super().__init__(f"process {process}: lost the server (process 0): {reason}")
        self.process = process
        self.reason = reason
