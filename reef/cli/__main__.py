"""`python -m reef.cli`: the `reef` command, for subprocesses that must use this interpreter."""

import sys

from reef.cli.main import main

sys.exit(main())
