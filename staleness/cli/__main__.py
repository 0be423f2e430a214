from staleness.cli import entry

entry()
