import sys

from prestage.cli import main

sys.exit(main())
