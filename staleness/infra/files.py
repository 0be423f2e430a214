"""Files and output directories, written so that nothing is ever half-written.

Every file goes to a temporary name beside its destination and is renamed
into place (`write_text`, `write_with`); a directory of files (a Result) is
built in a temporary sibling directory and renamed into place as a whole
(`write_dir`). A reader therefore sees the old version or the new one, never
a mix, and a run stopped mid-write leaves at most a hidden `.NAME.tmp-*`
directory behind. `check_out`, `check_file` and `check_dir` validate output paths before any
computation starts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

__all__ = ["OutputError", "MARKERS", "check_out", "check_file", "check_dir", "is_output", "write_text", "write_with",
           "write_dir", "stage_dir", "swap_in"]

MARKERS = ("result.json", "compare.json", "sweep.json", "plan.csv")
"""A directory holding one of these files is staleness output (a Result, a comparison, a sweep, a plan)."""


class OutputError(ValueError):
    """An output path that cannot be used (one line: the path, why, what to do)."""


def is_output(path: Path) -> bool:
    """Whether `path` is a directory written by staleness (a Result or a comparison)."""
    return path.is_dir() and any((path / m).is_file() for m in MARKERS)


def _probe(parent: Path, what: str, path) -> None:
    try:
        probe = tempfile.mkdtemp(prefix=".staleness-probe-", dir=parent)
    except OSError as e:
        raise OutputError(f"{what} = {str(path)!r} cannot be created in {str(parent)!r}: "
                          f"{e.strerror or e}") from None
    os.rmdir(probe)


def _creatable(p: Path, what: str, path) -> None:
    """Directory `p` can be written into, or created: its nearest existing ancestor
    (itself if it exists) is a writable directory; `what` = `path` names it in errors."""
    ancestor = p if p.exists() else p.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(f"{what} = {str(path)!r} lies under {str(ancestor)!r}, which is a file, not a directory")
    _probe(ancestor, what, path)


def check_out(path, *, overwrite: bool = False, what: str = "--out") -> Path:
    """Validate output directory `path` before computing; returns it as a Path.

    Valid: a path that does not exist yet and can be created (its nearest
    existing ancestor is a writable directory), an empty writable directory,
    or (with overwrite=True) a staleness output directory. Raises OutputError
    otherwise, naming `what` (the argument) and the path.
    """
    if path is None or not str(path).strip():
        raise OutputError(f"{what} = {path!r} must be a directory path")
    p = Path(path).expanduser()
    if p.exists():
        if not p.is_dir():
            raise OutputError(f"{what} = {str(path)!r} is an existing file, not a directory; choose a new directory")
        if any(p.iterdir()):
            if not is_output(p):
                raise OutputError(f"{what} = {str(path)!r} is a non-empty directory that holds no staleness "
                                  "output; choose a new or empty directory")
            if not overwrite:
                raise OutputError(f"{what} = {str(path)!r} already holds staleness output; pass --overwrite "
                                  "to replace it (or choose another directory)")
        _probe(p, what, path)
        _probe(p.parent, what, path)
        return p
    _creatable(p, what, path)
    return p


def check_file(path, *, what: str, replaceable: Callable[[Path], bool] = lambda p: False) -> Path:
    """Validate output file `path` before computing; returns it as a Path.

    Valid: a file that does not exist yet in a directory that exists or can be created
    (writable), or an existing file that `replaceable(path)` accepts (e.g. one this
    tool wrote). Raises OutputError naming `what` and the path otherwise."""
    if path is None or not str(path).strip():
        raise OutputError(f"{what} = {path!r} must be a file path")
    p = Path(path).expanduser()
    if p.is_dir():
        raise OutputError(f"{what} = {str(path)!r} is a directory; give a file name")
    if p.exists() and not replaceable(p):
        raise OutputError(f"{what} = {str(path)!r} is an existing file that staleness did not write; choose "
                          "another name")
    _creatable(p.parent, what, path)   # the directory it goes into
    return p


def check_dir(path, *, what: str) -> Path:
    """Validate a directory `path` the run writes into as it goes (a checkpoint): an
    existing directory, or one that can be created; not a file. OutputError otherwise."""
    if path is None or not str(path).strip():
        raise OutputError(f"{what} = {path!r} must be a directory path")
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise OutputError(f"{what} = {str(path)!r} is an existing file, not a directory")
    _creatable(p, what, path)
    return p


def write_with(path, write: Callable[[Path], None]) -> Path:
    """Call write(tmp_path) for a temporary file beside `path`, then rename it to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text(path, text: str) -> Path:
    """Write `text` to `path` atomically (temporary file + rename)."""
    return write_with(path, lambda tmp: tmp.write_text(text))


def write_dir(path, write: Callable[[Path], None], *, overwrite: bool = False) -> Path:
    """Build a directory with write(tmp_dir), then rename it to `path` as a whole.

    An existing `path` is replaced only with overwrite=True (and only if it is
    empty or staleness output); its old files are removed, none stays beside
    the new ones.
    """
    tmp = stage_dir(path, overwrite=overwrite)
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return swap_in(tmp, path)


def stage_dir(path, *, overwrite: bool = False) -> Path:
    """A fresh hidden sibling directory of `path` to build its new content in (then
    `swap_in`; on failure remove it and `path` is untouched). The same checks as
    `write_dir`: an existing non-empty `path` needs overwrite=True and must be
    staleness output."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not overwrite and (not path.is_dir() or any(path.iterdir())):
        raise FileExistsError(f"{str(path)!r} exists; pass overwrite=True to replace it")
    if path.exists() and path.is_dir() and any(path.iterdir()) and not is_output(path):
        raise OutputError(f"{str(path)!r} holds files that are not staleness output; not replacing it")
    return Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))


def swap_in(tmp, path) -> Path:
    """Rename the finished directory `tmp` (from `stage_dir`) to `path`, replacing what
    was there as a whole (the old directory is renamed aside first, then removed)."""
    path = Path(path)
    if path.exists():
        old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)
    return path


def __dir__():
    return sorted(__all__)   # the public names only, not the imports
