"""Plan, then apply: put the rendered units on a host (``install``) or take them off (``uninstall``).

:func:`~kimi_deploy.host.install.install_plan.plan_install` /
:func:`~kimi_deploy.host.install.uninstall_plan.plan_uninstall` gather the facts of the host once
(:class:`~kimi_deploy.host.install.facts.HostFacts`: the bytes of every file they would touch, the manifest,
accounts, GPU device groups, unit states, the key file, the other services' claims, leftovers of killed runs)
and then plan from them with no I/O (:func:`~kimi_deploy.host.install.install_plan.plan_install_from`,
:func:`~kimi_deploy.host.install.uninstall_plan.plan_uninstall_from`: facts in,
:class:`~kimi_deploy.host.install.plan.Plan` out: files to create/replace/remove with unified diffs, commands
to run, notes, refusals). :func:`~kimi_deploy.host.install.apply.apply` carries a plan out: the intent record
first (:class:`kimi_deploy.host.records.Intent`), commands before the files (service user, directories, the
API key file), a backup of every file it will change, one atomic write of all new files
(:mod:`kimi_deploy.fsio`), the intent removed, then systemctl. Applying a plan and planning again gives a plan
with nothing to do. A run killed at any point leaves files the next run recognises as its own;
:func:`kimi_deploy.host.records.service_lock` serialises runs on one service.

One module a concern; import each name from the module that owns it (this package re-exports nothing):

- ``facts``: :class:`~kimi_deploy.host.install.facts.HostFacts` and its gatherers, the only reads of the host
  (and which host of a fleet this is);
- ``files``: the rendered files ``install`` puts in place, by host path (pure);
- ``plan``: the plan types and the pieces both planners share (pure);
- ``install_plan``, ``uninstall_plan``: the planners (pure given the facts; their ``plan_*`` entries gather them);
- ``apply``: carrying a plan out, or refusing it: the only changes to the host;
- ``formatting``: the plan and the result as text.

Installed set for a profile whose ``[service] name`` is NAME (host paths):
``/etc/systemd/system/{NAME.service, kimi-deploy-check@NAME.service, kimi-deploy-check@NAME.timer}``,
``/etc/kimi-deploy/{NAME.env, NAME.toml, NAME.manifest.json}``, backups under
``/etc/kimi-deploy/backup/NAME/``, and the API key file named by ``[sglang] api_key_file``
(created with a random key when missing, never overwritten).
"""
