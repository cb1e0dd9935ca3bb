"""Another SGLang installation patched and killed at random instants until a stop file appears.

Run by tests/test_patch_crashsafe.py beside its kill scenarios (which must come out the same):

    python tests/patch_neighbour.py SGLANG_PYTHON DIRECTORY STATE_DIR SEED STOP_FILE

builds a throwaway installation in DIRECTORY (tests/patch_helpers.py), then loops over ``kimi-deploy patch``
commands on it (apply with a random set, revert, status) with ``KIMI_DEPLOY_STATE_DIR=STATE_DIR``; about half are
killed just before a random file operation (``KIMI_DEPLOY_FAULT_KILL_AT``) and a fifth by SIGKILL from outside
at a random instant (staging included), so killed runs leave what they leave; a pause of 1-2 s
between runs keeps it from loading the machine. Prints ``runs N`` at the end and
one line per run that ended otherwise than 0, 1 or killed. At least one run is made, even when the stop file
is already there.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from patch_helpers import make_target  # noqa: E402

COMMANDS = (["apply"], ["apply", "--with", "sm120-torch-symm-mem"],
            ["apply", "--with", "sm120-flashinfer-allreduce-fusion"], ["revert"], ["status"])


def main() -> None:
    sglang_python, directory, state, seed, stop = sys.argv[1:6]
    python = make_target(sglang_python, Path(directory) / "venv")
    rng = random.Random(int(seed))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIMI_DEPLOY_FAULT_")}
    env.update(KIMI_DEPLOY_STATE_DIR=state, KIMI_DEPLOY_LOCK_WAIT_S="60")
    runs = 0
    while runs == 0 or not os.path.exists(stop):
        command = rng.choice(COMMANDS)
        run_env = dict(env)
        how = rng.random()
        if how < 0.5:
            run_env["KIMI_DEPLOY_FAULT_KILL_AT"] = str(rng.randint(1, 30))
        proc = subprocess.Popen([sys.executable, "-m", "kimi_deploy", "patch", *command, "--python", python],
                                env=run_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if how > 0.8:
            time.sleep(rng.random())
            proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate()
        time.sleep(rng.uniform(1.0, 2.0))  # concurrency, not load: the scenarios beside it stay fast
        runs += 1
        if proc.returncode not in (0, 1, -signal.SIGKILL):
            print(f"run {runs}: patch {' '.join(command)} exited {proc.returncode}: {err.strip()[-400:]}",
                  flush=True)
    print(f"runs {runs}", flush=True)


if __name__ == "__main__":
    main()
