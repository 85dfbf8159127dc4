"""The file ``spark-submit`` runs for ``vipc-analyze`` (spark-submit takes a Python
application as a ``.py`` file, not a console script; ``vipc-analyze --submit-app`` prints
this file's path)::

    spark-submit --master spark://head:7077 $(vipc-analyze --submit-app) s3://bucket/fleet --out s3://bucket/results

The arguments are vipc-analyze's; the master (and executor resources) are spark-submit's.
"""

import os
import sys

if __name__ == "__main__":
    # spark-submit puts this file's folder first on sys.path: its modules (fs, report...)
    # must not shadow installed top-level packages of the same names
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    from visionipc.apps.pipeline.cli import main

    sys.exit(main())
