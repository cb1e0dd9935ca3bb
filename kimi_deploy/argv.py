"""SGLang server arguments as ``--flag value`` groups: the one place that decides which word is a flag's value.

Rule (SGLang 0.5.23's options are all long ``--`` options, parsed by argparse): an argument that
starts with ``--`` and has no ``=`` takes the next argument as its value unless that one starts with
``--`` too; ``--flag=value`` and every other argument stand alone. Used to print the launch command
one flag a line (:meth:`kimi_deploy.launch.LaunchSpec.flag_groups`, the unit's ``ExecStart=``) and to
compare a running server's arguments with the rendered ones (:func:`kimi_deploy.host.status.launch_entries`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def flag_groups(args: Sequence[str]) -> list[tuple[str, ...]]:
    """``args`` in order as groups: ``("--flag", "value")``, ``("--switch",)``, ``("--flag=value",)``, ``("word",)``.

    Joining the groups gives ``args`` back, word for word.
    """
    groups: list[tuple[str, ...]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        takes_value = (arg.startswith("--") and "=" not in arg and i + 1 < len(args)
                       and not args[i + 1].startswith("--"))
        groups.append((arg, args[i + 1]) if takes_value else (arg,))
        i += len(groups[-1])
    return groups


def split_equals(group: tuple[str, ...]) -> tuple[str, ...]:
    """``("--flag=value",)`` as ``("--flag", "value")``; any other group unchanged."""
    if len(group) == 1 and group[0].startswith("--") and "=" in group[0]:
        flag, _, value = group[0].partition("=")
        return (flag, value)
    return group


def expansions(name: str, flags: Iterable[str]) -> list[str]:
    """The ``flags`` argparse could read ``name`` as: ``[name]`` when it is one of them, else every flag it is a
    prefix of (SGLang's parser has ``allow_abbrev``: ``--hos`` is ``--host``; several hits are ambiguous there,
    which argparse refuses). Empty: ``name`` sets none of them."""
    flags = list(flags)
    return [name] if name in flags else [flag for flag in flags if flag.startswith(name)]
