import sys

from reliable.cli import main

sys.exit(main())
