"""Placeholder: being written (see the issue tracker); registers no sub-command yet."""


def add(sub) -> None:
    return None
