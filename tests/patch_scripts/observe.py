"""Run every observation script of this folder in one SGLang interpreter (imports are paid once).

argv[1]: JSON {"<script>.py": [argv...], ...}. Prints one JSON object {"<script>.py": its JSON result}.
"""
import contextlib, io, json, runpy, sys
from pathlib import Path

here = Path(__file__).resolve().parent
out = {}
for script, args in json.loads(sys.argv[1]).items():
    buf = io.StringIO()
    sys.argv = [str(here / script), *args]
    with contextlib.redirect_stdout(buf):
        runpy.run_path(str(here / script), run_name="__main__")
    out[script] = json.loads(buf.getvalue().strip().splitlines()[-1])
print(json.dumps(out))
