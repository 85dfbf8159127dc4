"""Old module paths (before the applications moved to ``*.apps``) are aliases of
the new modules: the same module object, never a second copy, with a
DeprecationWarning at the old package path."""

import importlib
import subprocess
import sys

import pytest

MOVED = {
    "msgq.top": "msgq.apps.top",
    "msgq.bridge": "msgq.apps.bridge",
    "msgq.diagnostics": "msgq.apps.diagnostics",
    "visionipc.camera.pattern": "visionipc.apps.camera.pattern",
    "visionipc.record.reader": "visionipc.apps.record.reader",
    "visionipc.view.cli": "visionipc.apps.view.cli",
    "visionipc.pipeline.health": "visionipc.apps.pipeline.health",
}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the next test asserts the warning
@pytest.mark.parametrize("old,new", sorted(MOVED.items()))
def test_old_path_is_the_same_module(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)
    module = sys.modules[new]
    assert module.__name__ == new and module.__spec__.name == new


def test_old_package_path_warns_and_from_import_works():
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "import visionipc\n"
        "try:\n    import visionipc.pipeline\nexcept DeprecationWarning as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "visionipc.pipeline moved to visionipc.apps.pipeline" in out.stdout
    code = "from visionipc.pipeline import health, read; import visionipc.apps.pipeline.read as r; assert read is r"
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_unknown_old_submodule_is_a_plain_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("visionipc.pipeline.no_such_module")
