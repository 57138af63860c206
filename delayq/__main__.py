"""``python -m delayq``: the ``delayq`` command (see :mod:`delayq.cli`); without the
``cli`` extra, only ``python -m delayq demo`` (see :mod:`delayq.demo`)."""

import importlib.util
import sys

if importlib.util.find_spec("typer") is not None and importlib.util.find_spec("rich") is not None:
    from .cli import main

    main()
else:
    from .demo import main as demo_main

    sys.exit(demo_main())
