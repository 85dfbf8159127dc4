import sys

from visionipc.view.cli import main

sys.exit(main())
