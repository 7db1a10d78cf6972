"""`python -m outbox.reconcile ...`, or `spark-submit <path of this file> ...` on a cluster."""

import sys

from outbox.reconcile.command import main

sys.exit(main())
