"""Every name the kit derives from a service name, and the one builder of the nightly check command.

Pure string functions of ``[service] name`` (a valid unit stem: :func:`kimi_deploy.values.check_unit_stem`),
imported by everything that names a unit, a node's URL or the check's command line, so that no module spells
``<name>.service`` or ``http://HOST:PORT`` by hand. Imports nothing of the kit.

Names (``NAME`` is ``[service] name``):

- ``NAME.service`` / ``NAME.env``: the server unit and its EnvironmentFile (:func:`server_unit`, :func:`env_file`);
- ``NAME-gateway`` / ``NAME-gateway.service``: a fleet's gateway (:func:`gateway_service`, :func:`gateway_unit`);
- ``kimi-deploy-check@NAME.service`` / ``.timer``: the nightly check units (:func:`check_unit`). systemd loads a
  unit file named ``family@instance.suffix`` directly, no template needed (systemd.unit(5), "Description"), so
  two services on one host never share (and overwrite) one check.
"""

from __future__ import annotations

#: Family name of the nightly check units (``kimi-deploy-check@<name>.service`` and ``.timer``).
CHECK_UNIT = "kimi-deploy-check"


def server_unit(service: str) -> str:
    """``<service>.service``: the server unit's file name."""
    return f"{service}.service"


def env_file(service: str) -> str:
    """``<service>.env``: the server unit's EnvironmentFile name."""
    return f"{service}.env"


def gateway_service(service: str) -> str:
    """``<service>-gateway``: the name of a fleet's gateway on its host (its unit ``<service>-gateway.service``,
    its state directory ``/var/lib/<service>-gateway``)."""
    return f"{service}-gateway"


def gateway_unit(service: str) -> str:
    """``<service>-gateway.service``: the gateway unit's file name."""
    return server_unit(gateway_service(service))


def check_unit(service: str) -> str:
    """Name of ``service``'s nightly check units without the suffix: ``kimi-deploy-check@<service>``."""
    return f"{CHECK_UNIT}@{service}"


def check_service(service: str) -> str:
    """``kimi-deploy-check@<service>.service``."""
    return f"{check_unit(service)}.service"


def check_timer(service: str) -> str:
    """``kimi-deploy-check@<service>.timer``."""
    return f"{check_unit(service)}.timer"


def url_host(host: str) -> str:
    """``host`` as the host part of a URL: an IPv6 address in brackets, anything else unchanged."""
    return f"[{host}]" if ":" in host else host


def node_url(host: str, port: int) -> str:
    """``http://HOST:PORT`` of a server (or gateway) on ``host``; an IPv6 address in brackets."""
    return f"http://{url_host(host)}:{port}"


#: The options of ``kimi-deploy check`` that :func:`check_argv` writes: keyword -> flag.
CHECK_FLAGS = {"base_url": "--base-url", "api_key_file": "--api-key-file", "insecure": "--insecure",
               "each_worker": "--each-worker", "sample": "--sample", "deadline": "--deadline", "json": "--json",
               "junit": "--junit", "prom": "--prom", "pushgateway": "--pushgateway"}


def check_argv(kimi_deploy: str, profile_path: str, **options: str | bool | None) -> list[str]:
    """``[kimi_deploy, "check", "--profile", profile_path, ...]``: the nightly check's command line, the one
    builder behind the systemd check units (server and gateway) and the Kubernetes CronJob.

    ``options`` are :data:`CHECK_FLAGS` keywords, written in the order given (the rendered units and
    manifests keep the order they have always had); ``True`` writes the bare flag, ``None``/``False`` leaves
    the option out, a string writes the flag and the value.

    Raises:
        TypeError: a keyword that is not a ``check`` option (a programming error).
    """
    argv = [kimi_deploy, "check", "--profile", profile_path]
    for key, value in options.items():
        if key not in CHECK_FLAGS:
            raise TypeError(f"check_argv: no check option {key!r}")
        if value is True:
            argv.append(CHECK_FLAGS[key])
        elif value:
            argv += [CHECK_FLAGS[key], str(value)]
    return argv
