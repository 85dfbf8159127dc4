import sys

from visionipc.apps.view.cli import main

sys.exit(main())
