"""The Ansible test environment (scripts/ansible-testenv: ansible-core 2.19.14, ansible-lint 26.10.1) for the tests
that run the real ``ansible-playbook`` and ``ansible-lint`` on what ``render --target ansible`` writes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def ansible_bin() -> Path:
    """The ``bin`` folder of the Ansible test environment: ``$KIMI_DEPLOY_ANSIBLE_PYTHON``'s, else
    ``<repo>/.ansible-env/bin``; missing: skipped here, a failure in CI (scripts/test builds it)."""
    explicit = os.environ.get("KIMI_DEPLOY_ANSIBLE_PYTHON")
    if explicit:
        if not Path(explicit).exists():
            pytest.fail(f"KIMI_DEPLOY_ANSIBLE_PYTHON={explicit} does not exist")
        return Path(explicit).parent
    default = REPO / ".ansible-env" / "bin"
    if (default / "python").exists():
        return default
    if os.environ.get("CI"):
        pytest.fail("the Ansible test environment is missing in CI; scripts/test must run scripts/ansible-testenv")
    pytest.skip("Ansible test environment missing: run scripts/ansible-testenv (or set KIMI_DEPLOY_ANSIBLE_PYTHON)")


def run_tool(tool: str, *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300,
             ) -> subprocess.CompletedProcess:
    """``tool`` (``ansible-playbook``, ``ansible-lint``) of the environment with ``args`` in ``cwd``, its own
    bin folder first on PATH, no user configuration (``ANSIBLE_CONFIG`` unset, a private ``HOME``)."""
    bin_dir = ansible_bin()
    home = cwd / ".ansible-home"
    home.mkdir(exist_ok=True)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    environment.update({"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(home),
                        "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
                        "PYTHONWARNINGS": "ignore", **(env or {})})
    return subprocess.run([str(bin_dir / tool), *args], cwd=cwd, env=environment, capture_output=True, text=True,
                          timeout=timeout)
