"""What bench/ shares with the CLI's bench, loaded from ``acp_lite/tools/workload.py``: workload A's
update mix and the ping method (``workload.mix_update``, ``workload.PING_METHOD``, ...).

That module imports only the standard library, by rule, so it is loaded here by its path rather
than as part of the package: the scripts that import this one also run in the official SDKs'
venvs, which have neither acp_lite nor msgspec, and with ``--baseline`` beside an older acp_lite.
"""

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parent.parent / "acp_lite" / "tools" / "workload.py"
_spec = importlib.util.spec_from_file_location("acp_lite_tools_workload", _PATH)
workload = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(workload)
