"""`python -m service.cli`: the `lifelong` command."""

import sys

from service.cli import main

sys.exit(main())
