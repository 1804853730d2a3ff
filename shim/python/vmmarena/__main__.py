"""python3 -m vmmarena: the command line (see vmmarena._cli)."""

import sys

from ._cli import main

sys.exit(main())
