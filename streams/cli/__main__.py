"""`python -m streams.cli`: the `reflect` command."""

import sys

from streams.cli.main import main

sys.exit(main())
