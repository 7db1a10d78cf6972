import sys

from reliable_cli import main

sys.exit(main())
