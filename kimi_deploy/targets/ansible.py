"""The ``ansible`` target: a playbook that installs a fleet's parts and rolls its replicas behind the gateway.

``render --target ansible --out DIR`` writes, from the same resolved deployment as every other target
(:func:`kimi_deploy.deployment.resolve`):

- ``inventory.yml``: the groups ``kimi_fleet`` (every host), ``kimi_nodes`` (every node), ``kimi_replicas`` (rank 0
  of each replica: what the roll restarts), ``kimi_gateway`` (the ``[gateway]`` host) and, for multi-node
  replicas, ``kimi_replica_N`` (its nodes, ``kimi_rank`` each); each host's ``kimi_host`` is its name in the
  profile (``install --host``), the fleet's settings are the ``kimi_fleet`` group's vars;
- ``site.yml``: three plays, (1) a new fleet's gateway installed and started (``tasks/new_gateway.yml``), (2) the
  replicas installed and rolled in batches (``serial`` from ``[rollout] serial``, ``max_fail_percentage: 0`` and
  ``any_errors_fatal``: one failed gate stops the roll, later batches keep their files; ``tasks/roll.yml``, each
  node's install by ``tasks/install.yml``), (3) the gateway host last (``tasks/gateway.yml``);
- ``tasks/*.yml``: the tasks (kimi_deploy/templates/ansible/, shipped as they are);
- ``files/<name>.toml``: the profile, as ``install`` reads it on each host.

The key is not rendered: the playbook copies it from ``kimi_api_key`` (a variable, e.g. from ansible-vault) or
the file ``kimi_api_key_src`` (default ``files/<name>.api-key`` beside site.yml, which may be vault-encrypted).
Every value the inventory takes from the profile is a validated host name, path or unit stem (characters of
:data:`kimi_deploy.values.SAFE_TOKEN`: no ``{`` or ``%``), so none can become a Jinja template when Ansible
reads it. Ansible's own names: ``serial``, ``max_fail_percentage``, ``any_errors_fatal`` (Ansible's "Controlling playbook
execution: strategies and more"), ``async``/``poll`` (its "Asynchronous actions and polling").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kimi_deploy import paths
from kimi_deploy.deployment import Deployment, resolve
from kimi_deploy.errors import ProfileError, UsageError
from kimi_deploy.profile import Profile, dump_profile
from kimi_deploy.profile.rollout import Rollout
from kimi_deploy.targets import Artefacts, file_header
from kimi_deploy.yamltext import scalar

#: Where the static task files are (in the package: hatch ships every file under kimi_deploy/).
TEMPLATES = Path(__file__).resolve().parent.parent / "templates" / "ansible"
#: The static task files (:data:`TEMPLATES`), written under ``tasks/`` as they are.
TASK_FILES = ("new_gateway.yml", "install.yml", "roll.yml", "gateway.yml")
#: Seconds ``restart --wait`` spends gating one start beyond readiness (fast, parser and contract tiers; the
#: contract tier's streamed and plain tool calls), a bound well above what the gate takes against a real server.
GATE_ALLOWANCE_SEC = 900
#: Seconds the Ansible wait for a roll keeps above the kit's own bound (the drain, two starts and two gates).
ROLL_MARGIN_SEC = 300


def roll_timeout(profile: Profile) -> int:
    """Seconds the playbook waits for one replica's ``restart --wait --rollback-on-failure`` (its ``async``): the
    drain (``[rollout] drain_timeout_sec``), then the new start and its gate, then the rollback's start and gate
    (each ``[service] timeout_start_sec`` plus :data:`GATE_ALLOWANCE_SEC`), plus :data:`ROLL_MARGIN_SEC`: above
    every bound the kit sets itself, so Ansible never abandons a restart the kit still finishes."""
    rollout = profile.rollout or Rollout()
    return rollout.drain_timeout_sec + 2 * (profile.service.timeout_start_sec + GATE_ALLOWANCE_SEC) + ROLL_MARGIN_SEC


def min_healthy(profile: Profile) -> int:
    """``[rollout] min_healthy``, else 1 (0 for a fleet of one replica).

    Raises:
        ProfileError: it is not below the number of replicas (no batch could ever roll).
    """
    rollout = profile.rollout or Rollout()
    replicas = len(profile.replicas)
    if rollout.min_healthy is None:
        return min(1, replicas - 1)
    if rollout.min_healthy >= replicas:
        raise ProfileError(f"rollout.min_healthy = {rollout.min_healthy} leaves no replica to roll: the fleet has "
                           f"{replicas}", value=str(rollout.min_healthy),
                           hint=f"set [rollout] min_healthy below {replicas}, or add replicas")
    return rollout.min_healthy


def inventory(deployment: Deployment) -> dict[str, Any]:
    """The inventory document (Ansible's YAML inventory format: ``all.children``, ``hosts``, ``vars``) of the
    resolved ``deployment``: its worker URLs, unit names and key path."""
    profile = deployment.profile
    service = profile.service.name
    gateway = profile.gateway.host if profile.gateway else None
    urls = deployment.worker_urls
    nodes: dict[str, dict[str, Any]] = {}
    replicas: dict[str, dict[str, Any]] = {}
    groups: dict[str, Any] = {}
    for index, replica in enumerate(profile.replicas):
        for rank, node in enumerate(replica):
            nodes[node] = {"kimi_host": node, "kimi_replica": index, "kimi_rank": rank, "kimi_serves": rank == 0}
        replicas[replica[0]] = {"kimi_worker_url": urls[index], "kimi_group": list(replica)}
        if len(replica) > 1:
            groups[f"kimi_replica_{index}"] = {"hosts": {node: {} for node in replica}}
    children: dict[str, Any] = {"kimi_nodes": {"hosts": nodes}, "kimi_replicas": {"hosts": replicas}, **groups}
    if gateway is not None:
        known = next((n for n in nodes if n == gateway), None)
        children["kimi_gateway"] = {"hosts": {gateway: {} if known else {"kimi_host": gateway, "kimi_serves": True}}}
    rollout = profile.rollout or Rollout()
    fleet_vars = {
        "kimi_service": service,
        "kimi_deploy": profile.service.kimi_deploy,
        "kimi_profile_src": f"{{{{ playbook_dir }}}}/files/{service}.toml",
        "kimi_installed_profile": paths.service_profile_copy(service),
        "kimi_api_key_file": deployment.api_key_file or "",
        "kimi_api_key_src": f"{{{{ playbook_dir }}}}/files/{service}.api-key",
        "kimi_server_unit": deployment.units.server,
        "kimi_gateway_unit": deployment.units.gateway or "",
        "kimi_min_healthy": min_healthy(profile),
        "kimi_start_timeout": profile.service.timeout_start_sec,
        "kimi_drain_timeout": rollout.drain_timeout_sec,
        "kimi_roll_timeout": roll_timeout(profile),
        "kimi_roll_all": False,
    }
    return {"all": {"children": {"kimi_fleet": {"children": children, "vars": fleet_vars}}}}


def playbook(profile: Profile) -> str:
    """``site.yml``: the new-gateway, roll and gateway plays (the module docstring)."""
    serial = "[" + ", ".join(scalar(step) for step in (profile.rollout or Rollout()).serial) + "]"
    return f"""---
- name: Start a new fleet's gateway before the roll
  hosts: kimi_gateway
  gather_facts: false
  any_errors_fatal: true
  tasks:
    - name: New gateway tasks
      ansible.builtin.import_tasks: tasks/new_gateway.yml

- name: Install and roll the replicas, one batch at a time
  hosts: kimi_replicas
  gather_facts: false
  serial: {serial}
  max_fail_percentage: 0
  any_errors_fatal: true
  tasks:
    - name: Roll tasks
      ansible.builtin.import_tasks: tasks/roll.yml

- name: Install the gateway host last and check every worker through it
  hosts: kimi_gateway
  gather_facts: false
  any_errors_fatal: true
  tasks:
    - name: Gateway tasks
      ansible.builtin.import_tasks: tasks/gateway.yml
"""


def _yaml(data: Any, indent: int = 0) -> str:
    """``data`` (nested mappings of scalars and lists of scalars) as block YAML with sequences indented under
    their key, as ansible-lint's yamllint settings want (``indentation``); scalars by :func:`scalar`."""
    pad = " " * indent
    out = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.append(f"{pad}{scalar(key)}:\n{_yaml(value, indent + 2)}")
        elif isinstance(value, list) and value:
            out.append(f"{pad}{scalar(key)}:\n" + "".join(f"{pad}  - {scalar(item)}\n" for item in value))
        else:
            out.append(f"{pad}{scalar(key)}: {scalar(value) if value not in ({}, []) else '{}' if value == {} else '[]'}\n")
    return "".join(out)


def _commented(header: str, text: str) -> str:
    return header + "\n" + text


def artefacts(profile: Profile, sglang_version: str | None = None) -> Artefacts:
    """The ``ansible`` target (:mod:`kimi_deploy.targets`): the files of the module docstring.

    Raises:
        UsageError: the profile has no ``[fleet]`` (one host: ``kimi-deploy install`` there is the whole roll-out).
        ProfileError: ``[rollout] min_healthy`` is not below the number of replicas. The rest as
            :func:`kimi_deploy.deployment.resolve`.
    """
    if profile.fleet is None:
        raise UsageError("the ansible target rolls a [fleet]; this profile describes one host",
                         hint="on one host run `kimi-deploy install` and `kimi-deploy restart --wait` there, or add "
                              "[fleet] and [gateway] (docs/runbook.md#replicas-behind-a-gateway)")
    deployment = resolve(profile, sglang_version)  # the same refusals as every other target
    version = deployment.sglang_version
    header = file_header(profile, version)
    service = profile.service.name
    files = {
        "inventory.yml": _commented(header, "---\n" + _yaml(inventory(deployment))),
        "site.yml": _commented(header, playbook(profile)),
        **{f"tasks/{name}": _commented(header, _task_file(name)) for name in TASK_FILES},
        f"files/{service}.toml": _commented(header, dump_profile(profile)),
    }

    def describe(out_dir: Path | None) -> dict[str, object]:
        return {"target": "ansible", "sglang_version": version, "profile_sha256": profile.digest(),
                "files": {n: str(out_dir / n) if out_dir else None for n in files}}

    notes = (f"note: put the API key at files/{service}.api-key beside site.yml (ansible-vault encrypt it) or pass "
             "kimi_api_key, then: ansible-playbook -i inventory.yml site.yml (--check --diff first)",)
    return Artefacts("ansible", files, describe, launch=deployment.launch, notes=notes)


def _task_file(name: str) -> str:
    """The shipped text of task file ``name`` (:data:`TEMPLATES`); it starts with ``---``, after which the
    header comment goes first."""
    return (TEMPLATES / name).read_text(encoding="utf-8")
