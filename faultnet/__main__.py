import sys

from faultnet.cli import main

sys.exit(main())
