#!/usr/bin/env python3
"""Recording codecs side by side (encode fps per core, size, PSNR/SSIM): ``visionipc.bench.suites.codecs``
(``--help`` for the options)."""

import sys

from visionipc.bench.suites.codecs import main

if __name__ == "__main__":
    sys.exit(main())
