"""``python -m delayq demo``: see :mod:`delayq.demo`."""

import sys

from .demo import main

sys.exit(main())
