"""`python -m glue.cloud.lyceum delete <id>`: the by-hand cleanup command glue prints for a VM it abandoned."""

import sys

from glue.cloud.lyceum.backend import _main

sys.exit(_main(sys.argv[1:]))
