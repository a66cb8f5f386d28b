"""`python -m harness ...`: see harness/cli.py."""

import sys

from harness.cli import main

sys.exit(main())
