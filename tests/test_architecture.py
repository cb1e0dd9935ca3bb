"""The package layout the README draws is the one the imports make (issue 24).

The import graph is read from the source with :mod:`ast` (every ``import``/``from ... import`` of a
``kimi_deploy`` module, at module level and inside functions), so nothing is imported to test it. Checked:

- the root of ``kimi_deploy/`` holds at most :data:`MAX_ROOT_MODULES` modules;
- no import cycle between modules, nor between packages (issue 36: ``doctor/`` and ``sizing/`` imported each
  other), function-local imports included (imports under ``if TYPE_CHECKING:`` never run and are left out of the
  cycles, not of the layer rules);
- at most :data:`MAX_LOCAL_IMPORTS` function-local ``kimi_deploy`` imports, each with a comment (on its line or
  the line above) saying why it is local;
- the layers (:data:`LAYERS`): a module imports only from its own layer or lower ones; in particular nothing
  under ``check/`` or ``bench/`` imports host-side code (``host/``);
- README.md's "Layout" section names every package and every root module;
- the target registry (:data:`kimi_deploy.targets.registry.REGISTRY`) imports and lists every target module;
- one builder each: unit file names (:mod:`kimi_deploy.names`), ``http://HOST:PORT`` URLs
  (:func:`kimi_deploy.names.node_url`), the nightly check command (:func:`kimi_deploy.names.check_argv`);
- issue 36's layer rule: a rank's launch, the gateway's command, the gated patches a command needs and the model
  table's fit are derived only in :func:`kimi_deploy.deployment.resolve` (:data:`RESOLVED_FACTS`); above the
  deployment no module builds a unit name or URL with :mod:`kimi_deploy.names` or reads the URLs or the key path
  off the profile (:data:`NAME_BUILDERS`, :data:`PROFILE_DERIVED`); each rule is tried on a planted violation;
- nothing under ``targets/`` imports by a string;
- no two modules share a basename with different meanings (:data:`SHARED_BASENAMES`).

A new package needs a row in :data:`LAYERS` and a line in README's "Layout": the failure says so.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "kimi_deploy"

#: The issue's cap on modules at the root of ``kimi_deploy/`` (``__init__`` and ``__main__`` included).
MAX_ROOT_MODULES = 20
#: The cap on function-local ``kimi_deploy`` imports (86 before the layout of issue 24, whose cap was 20; 21 since
#: ``check --profile`` reads the host's start records, issue 42, which load the profile models that check's
#: ``--help`` must not; 20 since issue 36 (the CLI's two ``wire.limits`` imports became one), 21 since ``tune``'s
#: library, which loads the host's, bench's and check's, loads when the verb runs, issue 40).
MAX_LOCAL_IMPORTS = 21

#: Layer of each package and root module, lowest first: a module imports only from its own layer or lower ones.
LAYERS: dict[str, int] = {
    # 0: foundations, no knowledge of a profile
    **{name: 0 for name in ("__init__", "errors", "paths", "names", "proc", "fsio", "values", "options", "versions",
                            "argv", "yamltext", "redact", "tool_ids")},
    # 1: what every client says on the wire (headers, capped reads, SSE, base URL, API key, limits)
    "wire": 1,
    # 2: the deployment profile
    "profile": 2,
    # 3: what a profile means: presets, topology, the launch, SGLang's interpreter, validation, patches
    **{name: 3 for name in ("topology", "launch", "engine", "validate", "litellm_hook", "patching",
                            "catalog")},
    # 3: the resolved deployment (reads the launch, the topology, the catalog and the patch series)
    "deployment": 3,
    # 4: deployment targets (render)
    "targets": 4,
    # 5: clients of a running server: they never touch a host
    "check": 5,
    "bench": 5,
    # 6: what is done on (or to) a host
    "host": 6,
    "doctor": 6,
    # the host's facts (nvidia-smi, model directories, systemd's unit state) that doctor judges, sizing sizes with
    # and install/status/restart read
    "facts": 6,
    # the memory plan and SGLang's effective configuration read this host's GPUs and model files (doctor's parsers)
    "sizing": 6,
    # tune: the host's verbs (install, restart, bench) run as a search over the options table's tunable rows
    "tune": 6,
    # 7: the command line
    "cli": 7,
    "__main__": 7,
}


@dataclasses.dataclass(frozen=True)
class Edge:
    source: str  # importing module, dotted
    target: str  # imported kimi_deploy module, dotted
    path: Path
    line: int
    local: bool  # inside a function
    type_only: bool  # under `if TYPE_CHECKING:`


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(source: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The ``kimi_deploy`` modules ``node`` imports (``from pkg import mod`` names the submodule)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: resolve against the importing module's package
            package = source.split(".") if path.name == "__init__.py" else source.split(".")[:-1]
            package = package[:len(package) - node.level + 1]
            base = ".".join(package + ([node.module] if node.module else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    found = []
    for name in names:
        if not name.startswith("kimi_deploy"):
            continue
        while name not in MODULES and "." in name:
            name = name.rsplit(".", 1)[0]
        found.append(name)
    return found


def read_edges() -> list[Edge]:
    edges: list[Edge] = []
    for source, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))

        def walk(node: ast.AST, local: bool, type_only: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for target in _targets(source, path, child):
                        if target != source:
                            edges.append(Edge(source, target, path, child.lineno, local, type_only))
                walk(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)),
                     type_only or (isinstance(child, ast.If) and _is_type_checking(child)))

        walk(tree, False, False)
    return edges


EDGES = read_edges()


def layer_key(module: str) -> str:
    """``kimi_deploy.host.status`` -> ``host``; ``kimi_deploy.launch`` -> ``launch``; ``kimi_deploy`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_root_holds_at_most_twenty_modules():
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules at the root of kimi_deploy/: {root}"


def cycles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for e in edges:
        graph[e.source].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycle_counting_function_local_imports():
    assert cycles([e for e in EDGES if not e.type_only]) == []


def package_edges() -> list[Edge]:
    """The import edges between packages (and root modules): ``kimi_deploy.doctor.checks`` importing
    ``kimi_deploy.sizing.report`` is ``doctor`` -> ``sizing``."""
    return [dataclasses.replace(e, source=f"kimi_deploy.{layer_key(e.source)}", target=f"kimi_deploy.{layer_key(e.target)}")
            for e in EDGES if not e.type_only and layer_key(e.source) != layer_key(e.target)]


def test_no_two_packages_import_each_other_counting_function_local_imports():
    """Issue 36: 0 package cycles (``doctor/`` and ``sizing/`` imported each other, kept apart by a
    function-local import), function-local imports included."""
    global MODULES
    saved = MODULES
    MODULES = {f"kimi_deploy.{k}": Path() for k in {layer_key(m) for m in saved}}
    try:
        assert cycles(package_edges()) == []
    finally:
        MODULES = saved


def test_cycles_are_found_when_there_is_one():
    """The cycle finder itself: a function-local import back is a cycle too."""
    a, b = sorted(MODULES)[:2]
    made = [Edge(a, b, Path(), 1, False, False), Edge(b, a, Path(), 2, True, False)]
    assert cycles(made) == [sorted([a, b])]


def local_imports() -> list[Edge]:
    """One entry per function-local import statement of a kimi_deploy module (not per imported name)."""
    seen: dict[tuple[Path, int], Edge] = {}
    for e in EDGES:
        if e.local:
            seen.setdefault((e.path, e.line), e)
    return list(seen.values())


def test_function_local_imports_are_few_and_each_says_why():
    found = local_imports()
    shown = "\n".join(f"{e.path.relative_to(REPO)}:{e.line}" for e in found)
    assert len(found) <= MAX_LOCAL_IMPORTS, f"{len(found)} function-local kimi_deploy imports:\n{shown}"
    silent = []
    for e in found:
        lines = e.path.read_text(encoding="utf-8").splitlines()
        here, above = lines[e.line - 1], lines[e.line - 2].strip() if e.line > 1 else ""
        if "#" not in here and not above.startswith("#"):
            silent.append(f"{e.path.relative_to(REPO)}:{e.line}: {here.strip()}")
    assert not silent, "function-local imports without a comment saying why (start-up, a cycle...):\n" + \
        "\n".join(silent)


def test_every_package_and_root_module_has_a_layer():
    keys = {layer_key(m) for m in MODULES}
    missing = sorted(keys - set(LAYERS))
    assert not missing, f"give {missing} a layer in tests/test_architecture.py LAYERS (and a line in README's Layout)"


def test_each_module_imports_only_its_own_layer_or_lower_ones():
    upward = [f"{e.path.relative_to(REPO)}:{e.line}: {e.source} (layer {LAYERS[layer_key(e.source)]}) imports "
              f"{e.target} (layer {LAYERS[layer_key(e.target)]})"
              for e in EDGES if LAYERS.get(layer_key(e.source), 99) < LAYERS.get(layer_key(e.target), -1)]
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize("client", ["check", "bench"])
def test_check_and_bench_import_no_host_side_code(client):
    host_side = [f"{e.path.relative_to(REPO)}:{e.line}: {e.target}" for e in EDGES
                 if layer_key(e.source) == client and layer_key(e.target) in ("host", "doctor", "cli")]
    assert not host_side, "\n".join(host_side)


def readme_layout() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, "README.md has no '## Layout' section"
    return match.group(1)


def test_readme_layout_names_every_package_and_root_module():
    layout = readme_layout()
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    missing = [f"kimi_deploy/{name}/" for name in packages if f"kimi_deploy/{name}/" not in layout]
    root = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    missing += [f"{name}.py" for name in root if not re.search(rf"\b{re.escape(name)}\.py\b", layout)]
    assert not missing, f"README.md's Layout does not name {missing}"


def test_the_target_registry_and_the_target_modules_match():
    """Every target is imported and listed in the registry (no import by string), with the same names and
    help lines as :data:`kimi_deploy.targets.TARGETS`, and every target module with an entry is registered."""
    from kimi_deploy.targets import TARGETS
    from kimi_deploy.targets.registry import REGISTRY

    assert list(REGISTRY) == list(TARGETS)
    for name, row in REGISTRY.items():
        assert row.name == name and row.help == TARGETS[name] and callable(row.artefacts)
    with_entry = {module_name(p) for p in (PACKAGE / "targets").glob("*.py")
                  if re.search(r"^def artefacts\(", p.read_text(encoding="utf-8"), flags=re.M)}
    assert with_entry == {row.artefacts.__module__ for row in REGISTRY.values()}


#: Basenames that more than one module has, each with the one meaning they share (issue 36: no two modules share a
#: basename with different meanings): a verb's command-line front (``cli/``) and its library (``host/``, the root),
#: a profile table (``profile/``) and the target that renders it, one client concern in ``check/`` and ``bench/``.
SHARED_BASENAMES: dict[str, str] = {
    "client.py": "a client of the running server (check's, bench's)",
    "compare.py": "compare two result files (check's accuracy, bench's runs)",
    "http.py": "HTTP to the server (every client's manners; bench's own client)",
    "kubernetes.py": "Kubernetes: the [kubernetes] table and the target",
    "journal.py": "a crash-safe record of a change in progress, resumed after a kill (host/: install, restart and "
                  "upgrade; tune/: the candidates of a tune)",
    "monitoring.py": "monitoring: the [monitoring] table and the target",
    "prefetch.py": "the prefetch verb",
    "preflight.py": "the preflight verb",
    "presets.py": "the presets (the catalog's, the presets and init verbs)",
    "readiness.py": "is the server ready (the verdict on the wire; the host's probes and phases)",
    "report.py": "a verb's result (doctor's checks, bench's files); sizing/report.py sizes a profile, left to rename "
                 "after the tune verb (issue 40) lands",
    "restart.py": "the restart verb",
    "status.py": "the status verb",
    "systemd.py": "systemd (the units rendered, systemctl on the host)",
    "tune.py": "tune: the verb and the [tune] table",
    "upgrade.py": "the upgrade verb",
    "validate.py": "the validate verb (SGLang's own parsers)",
    "workers.py": "the gateway's workers (its list on the wire, check --each-worker)",
}


def test_no_two_modules_share_a_basename_with_different_meanings():
    """A basename two modules have is one of :data:`SHARED_BASENAMES` (one meaning): before issue 36,
    ``check/validate.py`` (chat completion rules) and ``validate.py`` (SGLang's parser), ``patching/engine.py``
    (patch application) and ``engine.py`` (SGLang's interpreter), ``cli/options.py`` (shared CLI options) and
    ``options.py`` (the SGLang option table), ``check/registry.py`` and ``targets/registry.py``, ``bench/dataset.py``
    (prompts) and ``check/quality/dataset.py``, ``bench/load.py`` and ``profile/load.py``,
    ``check/quality/preflight.py`` and ``host/preflight.py`` each meant two things."""
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    shared = {name: sorted(where) for name, where in seen.items() if len(where) > 1}
    unexplained = {name: where for name, where in shared.items() if name not in SHARED_BASENAMES}
    assert not unexplained, f"modules sharing a basename (rename one, or say their one meaning): {unexplained}"
    assert set(SHARED_BASENAMES) <= set(shared), sorted(set(SHARED_BASENAMES) - set(shared))


def test_no_target_is_imported_by_a_string():
    """Issue 36: the render path is visible to a reader and a static tool: nothing under ``targets/`` imports by
    a string (``importlib``, ``__import__``). (The CLI's verbs still load lazily by name, for start-up time:
    :data:`kimi_deploy.cli.VERBS`.)"""
    found = [f"{p.relative_to(REPO)}" for p in (PACKAGE / "targets").glob("*.py")
             if re.search(r"\bimportlib\b|__import__\(", p.read_text(encoding="utf-8"))]
    assert not found, found


def _fstring_texts(path: Path) -> list[tuple[int, str]]:
    """``(line, the f-string with each replacement field as {})`` of every f-string in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            found.append((node.lineno, text))
    return found


@pytest.mark.parametrize("pattern,builder", [
    (r"\{\}\.(service|timer|env)\b", "kimi_deploy.names (server_unit, check_timer, env_file, gateway_unit, ...)"),
    (r"^https?://\{\}", "kimi_deploy.names.node_url"),
    (r"\bcheck --profile\b", "kimi_deploy.names.check_argv"),
])
def test_derived_names_urls_and_the_check_command_have_one_builder(pattern, builder):
    spelt = [f"{path.relative_to(REPO)}:{line}: {text}" for name, path in MODULES.items()
             if name != "kimi_deploy.names" for line, text in _fstring_texts(path) if re.search(pattern, text)]
    assert not spelt, f"built by hand instead of by {builder}:\n" + "\n".join(spelt)


#: The builders of what :func:`kimi_deploy.deployment.resolve` resolves (a rank's launch, the gateway's command, the
#: patches a command needs, the model table's fit) -> the modules allowed to name them: their own module and the
#: deployment. Issue 36: every verb reads the resolved deployment instead of deriving these from the profile.
RESOLVED_FACTS: dict[str, set[str]] = {
    "build_launch": {"kimi_deploy.launch", "kimi_deploy.deployment"},
    "rank_args": {"kimi_deploy.launch", "kimi_deploy.deployment"},
    "gateway_argv": {"kimi_deploy.launch", "kimi_deploy.deployment"},
    "gates_asked": {"kimi_deploy.patching.series", "kimi_deploy.deployment"},
    # presets: `init --model k3` has no profile to resolve, only the model table's row (the same evidence text)
    "weights_fit": {"kimi_deploy.catalog.models", "kimi_deploy.deployment", "kimi_deploy.catalog.presets"},
}


def _names_used(path: Path) -> list[tuple[int, str]]:
    """``(line, name)`` of every name, attribute and imported name in ``path``'s code (docstrings left out)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Name):
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append((node.lineno, node.name))
    return found


def test_launch_gateway_patch_and_fit_facts_are_derived_only_in_resolve():
    """Issue 36's layer rule: outside :mod:`kimi_deploy.deployment` (and each builder's own module) no module
    builds a launch, the gateway's command, asks the series which gated patches a command needs, or applies the
    model table's fit rule: it reads them from the :class:`kimi_deploy.deployment.Deployment`."""
    spelt = [f"{path.relative_to(REPO)}:{line}: {name}" for module, path in MODULES.items()
             for line, name in _names_used(path)
             if name in RESOLVED_FACTS and module not in RESOLVED_FACTS[name]]
    assert not spelt, "derived outside kimi_deploy.deployment.resolve (read the Deployment instead):\n" + \
        "\n".join(spelt)


#: The name and URL builders of :mod:`kimi_deploy.names` whose results a resolved deployment holds
#: (:class:`kimi_deploy.deployment.Units`, ``Deployment.base_url``/``worker_urls``/``gateway_url``).
NAME_BUILDERS = frozenset({"server_unit", "env_file", "gateway_service", "gateway_unit", "check_unit", "check_service",
                           "check_timer", "node_url"})
#: What a profile derives that the deployment holds once: read from ``profile.X`` (or ``*.sglang.api_key_file``).
PROFILE_DERIVED = frozenset({"base_url", "gateway_url", "worker_urls", "api_key_file"})
#: The layer from which on a module reads unit names, URLs and the key path from the deployment: every verb's
#: own code (the targets, the clients, the host side, the command line), above the profile, the launch and
#: :mod:`kimi_deploy.deployment` that derive them.
VERB_LAYER = LAYERS["targets"]


def _derived_names(path: Path) -> list[tuple[int, str]]:
    """``(line, what)`` of each unit name or URL built in ``path``: a call of a :data:`NAME_BUILDERS` function of
    :mod:`kimi_deploy.names` (imported by name or through the module), or :meth:`kimi_deploy.deployment.Units.of`
    of a profile's name; and each :data:`PROFILE_DERIVED` fact read from a profile (``profile.base_url``,
    ``profile.worker_urls()``, ``x.sglang.api_key_file``, ``s.api_key_file`` with ``s = profile.sglang``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    builders: set[str] = set()  # names bound to a builder in this module
    modules: set[str] = set()  # names bound to kimi_deploy.names
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "kimi_deploy.names":
            builders |= {alias.asname or alias.name for alias in node.names if alias.name in NAME_BUILDERS}
        elif isinstance(node, ast.ImportFrom) and node.module == "kimi_deploy":
            modules |= {alias.asname or alias.name for alias in node.names if alias.name == "names"}
        elif isinstance(node, ast.Import):
            modules |= {alias.asname or alias.name for alias in node.names if alias.name == "kimi_deploy.names"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in builders:
                found.append((node.lineno, f"{func.id}(...)"))
            elif isinstance(func, ast.Attribute) and func.attr in NAME_BUILDERS and \
                    ast.unparse(func.value) in modules | {"kimi_deploy.names"}:
                found.append((node.lineno, f"{func.attr}(...)"))
            elif isinstance(func, ast.Attribute) and func.attr == "of" and ast.unparse(func.value) == "Units" and \
                    any("profile" in ast.unparse(arg).lower() for arg in node.args):
                found.append((node.lineno, f"Units.of({ast.unparse(node.args[0])})"))
        elif isinstance(node, ast.Attribute) and node.attr in PROFILE_DERIVED and \
                not any(isinstance(n, ast.Call) for n in ast.walk(node.value)):  # resolve(profile).base_url reads
            owner = ast.unparse(node.value)
            if "profile" in owner.lower() or owner == "s" or owner.endswith(".sglang"):
                found.append((node.lineno, f"{owner}.{node.attr}"))
    return found


def test_unit_names_urls_and_the_key_path_are_read_from_the_deployment():
    """Issue 36's layer rule, its second half: above :mod:`kimi_deploy.deployment` (the targets, the clients, the
    host side, the command line) no module builds a unit name or URL with :mod:`kimi_deploy.names`, nor reads
    the URLs or the key path off the profile: it reads ``deployment.units``, ``deployment.base_url``,
    ``worker_urls``, ``gateway_url``, ``api_key_file`` (a service known only by its recorded name:
    :meth:`kimi_deploy.deployment.Units.of`)."""
    spelt = [f"{path.relative_to(REPO)}:{line}: {what}" for module, path in MODULES.items()
             if LAYERS.get(layer_key(module), 0) >= VERB_LAYER and module not in DERIVED_NAMES_ALLOWED
             for line, what in _derived_names(path)]
    assert not spelt, "derived outside kimi_deploy.deployment.resolve (read the Deployment instead):\n" + \
        "\n".join(spelt)


#: Modules above the deployment that may still build a name or URL, each with why: none may derive what the
#: deployment holds.
DERIVED_NAMES_ALLOWED: dict[str, str] = {
    "kimi_deploy.targets.kubernetes": "the cluster's own names: its Services' DNS names (NAME-leader.NS.svc, "
                                      "NAME-gateway.NS.svc) and the gateway's ServiceAccount, and whether the key "
                                      "Secret is mounted; not the host URLs and units the deployment resolves",
}


def test_the_names_rule_finds_a_unit_name_or_url_built_elsewhere(tmp_path):
    """The rule itself: a planted unit name, URL and key path derived from a profile are each found."""
    bad = tmp_path / "bad.py"
    bad.write_text("from kimi_deploy import names\nfrom kimi_deploy.names import server_unit\n\n"
                   "from kimi_deploy.deployment import Units\n\n"
                   "def check_unit(f):\n    return f\n\n"
                   "def f(profile, deployment, record):\n"
                   "    unit = server_unit(profile.service.name)\n"
                   "    gw = names.gateway_unit(profile.service.name)\n"
                   "    timer = Units.of(profile.service.name).check_timer\n"
                   "    s = profile.sglang\n"
                   "    return unit, gw, profile.base_url, profile.worker_urls(), s.api_key_file, \\\n"
                   "        profile.sglang.api_key_file, deployment.base_url, deployment.units.server, \\\n"
                   "        Units.of(record.service).server, check_unit(deployment)\n")
    assert sorted(what for _, what in _derived_names(bad)) == sorted([
        "server_unit(...)", "gateway_unit(...)", "Units.of(profile.service.name)", "profile.base_url",
        "profile.worker_urls", "s.api_key_file", "profile.sglang.api_key_file"])


def test_the_resolve_rule_finds_a_launch_built_elsewhere(tmp_path):
    """The rule itself: a module that builds a launch is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("from kimi_deploy.launch import build_launch\n\ndef f(p):\n    return build_launch(p)\n")
    assert [n for _, n in _names_used(bad) if n in RESOLVED_FACTS] == ["build_launch", "build_launch"]
