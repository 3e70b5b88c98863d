"""``python -m spec_ar.cli``: the ``spec-ar`` command."""
import sys

from . import main

sys.exit(main())
