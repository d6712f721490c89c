import sys

from capsnet.cli.main import main

sys.exit(main())
