"""``python -m delayq.spark <command> ...``: the reconciliation example job (see :mod:`delayq.spark.demo`)."""

import sys

from .demo import main

sys.exit(main())
