"""Makes ``python -m sglang.launch_server`` run the SGLang stand-in (``launch_server.py`` here).

Only for the container tier (tests/test_container_*.py): the test profile's ``[environment]``
puts this folder on ``PYTHONPATH``, so every interpreter the unit starts imports this module at
start-up (``site`` imports ``sitecustomize``). It adds one finder in front of ``sys.meta_path``
that answers for the module ``sglang.launch_server`` only; ``sglang`` itself and every other
module still come from the SGLang installation (patched or not).
"""

import importlib.abc
import importlib.util
import sys
from pathlib import Path

STANDIN = Path(__file__).resolve().parent / "launch_server.py"


class _LaunchServerStandIn(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "sglang.launch_server":
            return None
        return importlib.util.spec_from_file_location(fullname, STANDIN)


sys.meta_path.insert(0, _LaunchServerStandIn())
