"""Optional dependencies (OpenCV, pyarrow, ...) imported on first use, with an
install hint naming the pip extra that has them."""

import importlib
import types


class UsageError(Exception):
    """Bad input from the command line or a config file: printed, exit status 2."""


def need(module: str, extra: str) -> types.ModuleType:
    """Import an optional dependency or raise UsageError naming the pip extra that has it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UsageError(
            f"this command needs the Python package {module!r} ({e}); install it with: pip install 'visionipc[{extra}]'"
        ) from None
