"""Reading a profile: TOML bytes -> :class:`kimi_deploy.profile.model.Profile`, with fix-it errors; and back.

Part of :mod:`kimi_deploy.profile` (its ``__init__`` exports the public names).
"""

from __future__ import annotations

import difflib
import tomllib
import typing
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import BaseModel, ValidationError

from kimi_deploy.errors import ProfileError
from kimi_deploy.profile.fleet import Fleet, Gateway
from kimi_deploy.profile.kubernetes import Kubernetes
from kimi_deploy.profile.model import Profile, Quality, SGLang
from kimi_deploy.profile.monitoring import Monitoring
from kimi_deploy.profile.rules import check_rules
from kimi_deploy.profile.service import Service
from kimi_deploy.profile.startup import Startup
from kimi_deploy.wire.inputs import IrregularFile, read_regular


_SECTIONS: dict[str, type[BaseModel]] = {"service": Service, "sglang": SGLang, "monitoring": Monitoring,
                                          "fleet": Fleet, "gateway": Gateway, "kubernetes": Kubernetes,
                                          "quality": Quality, "startup": Startup}


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The table model inside a field's annotation (``SLO``, ``list[Replica]``, ``Fleet | None``), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    """A hint for an unknown key at ``loc``: close names in the same section or the section that has it."""
    key = str(loc[-1])
    if len(loc) == 1:
        sections = [*_SECTIONS, "environment"]
        close = difflib.get_close_matches(key, sections, n=1)
        if close:
            return f"did you mean [{close[0]}]?"
        for section, model in _SECTIONS.items():
            if key in model.model_fields:
                return f"{key} belongs in the [{section}] table"
        return f"tables are [{'], ['.join(sections)}]"
    section = str(loc[0])
    model = _SECTIONS.get(section)
    if model is None:
        return "remove it"
    for part in loc[1:-1]:  # a nested table such as [monitoring.slo] or [[fleet.replicas]]
        if isinstance(part, int):
            continue  # the index of an array of tables
        field = model.model_fields.get(str(part))
        nested = _model_of(field.annotation) if field is not None else None
        if nested is None:
            return "remove it"
        model, section = nested, f"{section}.{part}"
    close = difflib.get_close_matches(key, model.model_fields, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]}?"
    for other, other_model in _SECTIONS.items():
        if other != section and key in other_model.model_fields:
            return f"{key} belongs in the [{other}] table"
    return f"valid keys of [{section}]: {', '.join(model.model_fields)}"


def _format_error(err: dict[str, Any]) -> str:
    loc = tuple(err["loc"])
    where = ".".join(str(p) for p in loc) or "profile"
    if err["type"] == "extra_forbidden":
        return f"{where}: unknown key ({_did_you_mean(loc)})"
    if err["type"] == "missing":
        return f"{where}: required, but missing"
    msg = err["msg"].removeprefix("Value error, ")
    value = err.get("input")
    if err["type"] not in ("value_error",) and not isinstance(value, (dict, list)):
        return f"{where}: {msg} (got {value!r})"
    return f"{where}: {msg}"


def parse_profile(data: dict[str, Any], *, source: str = "profile") -> Profile:
    """Validate a profile given as a dict (the parsed TOML).

    Raises:
        ProfileError: one line per problem (pydantic's and :func:`check_rules`), exit 2.
    """
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        problems = [_format_error(e) for e in exc.errors(include_url=False)]
        raise ProfileError(f"{source} is not a valid deployment profile", problems=problems,
                           hint="correct the keys above; `kimi-deploy init` writes a commented example") from None
    problems = check_rules(profile)
    if problems:
        raise ProfileError(f"{source} is not a valid deployment profile", problems=problems,
                           hint="correct the settings above")
    return profile


#: Byte-order marks an editor may put first (Notepad's "UTF-8 with BOM" and "Unicode"): TOML is UTF-8 without one.
_BOMS = ((b"\xef\xbb\xbf", "a UTF-8 byte-order mark (BOM)"), (b"\xff\xfe", "a UTF-16 byte-order mark (UTF-16 text)"),
         (b"\xfe\xff", "a UTF-16 byte-order mark (UTF-16 text)"))


def _profile_text(data: bytes, path: Path) -> str:
    """``data`` as text: UTF-8 without a byte-order mark, as TOML 1.0 requires.

    Raises:
        ProfileError: a BOM first (tomllib's own words were "Invalid statement (at line 1, column 1)"), or bytes
            that are not UTF-8, with the line and column of the first (exit 2).
    """
    for bom, what in _BOMS:
        if data.startswith(bom):
            fix = (f"save it as UTF-8 without BOM (`sed -i '1s/^\\xEF\\xBB\\xBF//' {path}`)" if len(bom) == 3 else
                   f"save it as UTF-8 (`iconv -f UTF-16 -t UTF-8 {path} > {path}.utf8`, then move it over {path})")
            raise ProfileError(f"{path} starts with {what}; a TOML profile is UTF-8 without one", value=str(path),
                               hint=fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ProfileError(f"{path} is not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line}, column {column}",
                           value=str(path),
                           hint=f"save it as UTF-8 (from Latin-1: `iconv -f LATIN1 -t UTF-8 {path} > {path}.utf8`, "
                                f"then move it over {path})") from None


def load_profile(path: Path) -> Profile:
    """Read and validate a TOML profile file.

    Raises:
        ProfileError: the file is missing, a directory, unreadable, not UTF-8 (or with a byte-order mark),
            not TOML, or not a valid profile (exit 2).
    """
    try:
        raw = read_regular(path)
    except FileNotFoundError:
        raise ProfileError("profile file not found", value=str(path),
                           hint="give the path of a TOML profile, or create one with `kimi-deploy init`") from None
    except IsADirectoryError:
        raise ProfileError("the profile is a directory", value=str(path),
                           hint="give the path of the TOML file inside it, e.g. /etc/kimi-deploy/kimi-k25.toml") from None
    except IrregularFile as exc:
        raise ProfileError(f"the profile is {exc.strerror}", value=str(path),
                           hint="give the path of the TOML file itself (a profile is a few KiB of text)") from None
    except OSError as exc:
        raise ProfileError(f"cannot read the profile: {exc.strerror or exc}", value=str(path),
                           hint="run as a user that can read it (profiles under /etc/kimi-deploy are root's)") from None
    text = _profile_text(raw, path)
    try:
        data = tomllib.loads(text)
        return parse_profile(data, source=str(path))
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path} is not valid TOML: {exc}", value=str(path),
                           hint="fix the TOML syntax at the line and column shown") from None
    except RecursionError:  # an array or table nested hundreds deep: no profile value is
        raise ProfileError(f"{path} nests arrays or tables too deep to read", value=str(path),
                           hint="a profile's values nest at most a few levels: remove the nesting") from None


def toml_value(value: Any) -> str:
    """One value (str, bool, int, float, list of those) as one line of TOML text, encoded by ``tomli_w``."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return tomli_w.dumps({"v": value}).removeprefix("v = ").rstrip("\n")


def _without_none(table: dict[str, Any]) -> dict[str, Any]:
    """``table`` without ``None`` values, nested tables and arrays of tables too (TOML has no null)."""
    def clean(v: Any) -> Any:
        if isinstance(v, dict):
            return _without_none(v)
        return [clean(item) for item in v] if isinstance(v, list) else v

    return {k: clean(v) for k, v in table.items() if v is not None}


def dump_profile(profile: Profile) -> str:
    """The profile as canonical TOML: every value after defaults, unset (``None``) ones left out.

    Loading the text with :func:`parse_profile` gives a profile with the same :meth:`Profile.digest`.
    """
    data = profile.model_dump(mode="json")
    tables = {table: {k: v for k, v in data[table].items() if v is not None} for table in ("service", "sglang")}
    tables["environment"] = data["environment"]
    monitoring = {k: v for k, v in data["monitoring"].items() if v is not None and k != "slo"}
    monitoring["slo"] = {k: v for k, v in data["monitoring"]["slo"].items() if v is not None}
    tables["monitoring"] = monitoring
    if data["fleet"] is not None:
        fleet = {k: v for k, v in data["fleet"].items() if v is not None and k != "replicas"}
        fleet["replicas"] = data["fleet"]["replicas"]
        tables["fleet"] = fleet
    if data["gateway"] is not None:
        tables["gateway"] = _without_none(data["gateway"])
    if data.get("kubernetes") is not None:
        tables["kubernetes"] = _without_none(data["kubernetes"])
    for table in Profile.model_fields:  # every other optional table ([quality], [startup], ...), when set
        if table not in tables and table not in ("fleet", "gateway") and data.get(table) is not None:
            tables[table] = _without_none(data[table])
    return tomli_w.dumps(tables)
