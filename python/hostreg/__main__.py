"""``python -m hostreg``: the ``hostreg`` command (:func:`hostreg.cli.main`)."""

import sys

from .cli import main

sys.exit(main())
