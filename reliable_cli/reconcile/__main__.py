"""`python -m reliable_cli.reconcile ...`, or `spark-submit <path of this file> ...` on a cluster.

The file is alone in its directory with the command's package, so that running it as a
script (spark-submit puts the file's directory first on the import path) shadows no package.
"""

import sys

from reliable_cli.reconcile import main

sys.exit(main())
