import sys

from visionipc.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
