import sys

from accdbg.cli.main import main

sys.exit(main())
