"""The test suite's start-up in every Python the tests start (`tests/_suite_start.py`):
`tests/conftest.py` puts this folder first on `PYTHONPATH`. The tests' folder is not
added to the process's path: the module is loaded from its file."""

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "_suite_start", Path(__file__).resolve().parent.parent / "_suite_start.py")
_module = sys.modules.setdefault("_suite_start", importlib.util.module_from_spec(_spec))
if _module.__spec__ is _spec:
    _spec.loader.exec_module(_module)
_module.start()
