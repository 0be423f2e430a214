import sys

from staleness.cli import main

sys.exit(main())
