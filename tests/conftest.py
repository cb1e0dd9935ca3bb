"""Shared fixtures: the repository root, the SGLang 0.5.23 test environment, the CLI runner."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The source checkout's root folder."""
    return REPO


@pytest.fixture(scope="session")
def sglang_python() -> str:
    """Interpreter of the SGLang 0.5.23 test environment (``scripts/sglang-testenv``).

    ``KIMI_DEPLOY_SGLANG_PYTHON`` wins; else ``<repo>/.sglang-env/bin/python``. Missing:
    the test is skipped with the command that creates it (CI always creates it).
    """
    explicit = os.environ.get("KIMI_DEPLOY_SGLANG_PYTHON")
    if explicit:
        if not Path(explicit).exists():
            pytest.fail(f"KIMI_DEPLOY_SGLANG_PYTHON={explicit} does not exist")
        return explicit
    default = REPO / ".sglang-env" / "bin" / "python"
    if default.exists():
        return str(default)
    if os.environ.get("CI"):
        pytest.fail("the SGLang test environment is missing in CI; .ci/run must run scripts/sglang-testenv")
    pytest.skip("SGLang test environment missing: run scripts/sglang-testenv")


@pytest.fixture(scope="session")
def smg_path() -> str:
    """The pinned SGLang gateway, smg 1.13.0 (``scripts/smg-testenv``): ``KIMI_DEPLOY_SMG``, else
    ``<repo>/.smg-env/bin/smg``. Missing: skipped with the command that creates it (CI always creates it)."""
    explicit = os.environ.get("KIMI_DEPLOY_SMG")
    if explicit:
        if not Path(explicit).exists():
            pytest.fail(f"KIMI_DEPLOY_SMG={explicit} does not exist")
        return explicit
    default = REPO / ".smg-env" / "bin" / "smg"
    if default.exists():
        return str(default)
    if os.environ.get("CI"):
        pytest.fail("the smg test environment is missing in CI; scripts/test must run scripts/smg-testenv")
    pytest.skip("smg test environment missing: run scripts/smg-testenv")


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """Interpreter of the vLLM 0.33.0 test environment (``scripts/vllm-testenv``).

    ``KIMI_DEPLOY_VLLM_PYTHON`` wins; else ``<repo>/.vllm-env/bin/python``. Missing: the test is
    skipped with the command that creates it (CI always creates it: scripts/test).
    """
    explicit = os.environ.get("KIMI_DEPLOY_VLLM_PYTHON")
    if explicit:
        if not Path(explicit).exists():
            pytest.fail(f"KIMI_DEPLOY_VLLM_PYTHON={explicit} does not exist")
        return explicit
    default = REPO / ".vllm-env" / "bin" / "python"
    if default.exists():
        return str(default)
    if os.environ.get("CI"):
        pytest.fail("the vLLM test environment is missing in CI; scripts/test must run scripts/vllm-testenv")
    pytest.skip("vLLM test environment missing: run scripts/vllm-testenv")


def pytest_configure(config):
    """Children of the suite start with SIGINT as a terminal gives it, however the suite was started.

    A suite started in the background by a non-interactive shell (``cmd &``, ``nohup``, some CI runners) inherits
    SIGINT ignored, and exec keeps an ignored signal ignored: every ``kimi-deploy`` the tests start would then
    ignore it, and ``tests/test_interrupt.py``'s Ctrl-C cases waited out their 120 s guard (seen twice, only in
    suites started that way). A handler (unlike SIG_IGN) is reset to the default in a child, so Python there
    installs its own KeyboardInterrupt handler. Runs in every xdist worker too.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed container-tier test (one using a booted :class:`container_host.Host`) reports the
    container's failed units, the kit's units' status and the journal's tail with its failure."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or "container" not in item.keywords:
        return
    from container_host import Host

    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, Host):
            report.sections.append(("container: failed units, status, journal", value.debug_report()))


#: The SGLang replay's API key (its ``unpatched`` configuration).
SGLANG_API_KEY = "sk-replay-test-key"


@pytest.fixture(scope="session")
def replay(sglang_python, tmp_path_factory):
    """SGLang 0.5.23's serving layer with scripted Kimi output (tests/replay/server.py):
    ``{"unpatched": kimi_k2 parsers and --api-key SGLANG_API_KEY, "noparsers": launched without parsers}``,
    both started concurrently; each waited for by ``.url()``."""
    from replay_process import Replay

    logs = tmp_path_factory.mktemp("replay-logs")
    servers = {
        "unpatched": Replay(sglang_python, ["--api-key", SGLANG_API_KEY], logs / "unpatched.log"),
        "noparsers": Replay(sglang_python, ["--no-parsers"], logs / "noparsers.log"),
    }
    yield servers
    for server in servers.values():
        server.stop()


#: The vLLM replay's API key (its ``parsers`` configuration).
VLLM_API_KEY = "sk-vllm-replay-key"


@pytest.fixture(scope="session")
def vllm_replay(vllm_python, tmp_path_factory):
    """vLLM 0.33.0's real serving stack with a scripted Kimi engine core (tests/vllm_replay/server.py):
    ``{"parsers": kimi_k2 tool and reasoning parsers with --enable-auto-tool-choice and --api-key
    VLLM_API_KEY, "noparsers": launched without them, "exclude_none": parsers plus
    --exclude-tools-when-tool-choice-none}``, started concurrently; each waited for by ``.url()``."""
    from replay_process import VLLM_SERVER, Replay

    logs = tmp_path_factory.mktemp("vllm-replay-logs")
    servers = {
        "parsers": Replay(vllm_python, ["--api-key", VLLM_API_KEY], logs / "parsers.log", VLLM_SERVER),
        "noparsers": Replay(vllm_python, ["--no-parsers"], logs / "noparsers.log", VLLM_SERVER),
        "exclude_none": Replay(vllm_python, ["--exclude-tools-when-none"], logs / "exclude_none.log", VLLM_SERVER),
    }
    yield servers
    for server in servers.values():
        server.stop()


#: Opt-in patches applied on top of the defaults in :func:`patched_sglang`.
PATCHED_WITH = ["sm120-flashinfer-allreduce-fusion", "sm120-torch-symm-mem"]


@pytest.fixture(scope="session")
def patched_sglang(sglang_python, tmp_path_factory) -> tuple[str, Path]:
    """``(python, state_dir)`` of one throwaway SGLang copy with the whole 0.5.23 series applied
    (defaults + :data:`PATCHED_WITH`), built once per session (tests/patch_helpers.py).

    Shared: only read it. A test that edits patched files builds its own copy.
    """
    from patch_helpers import patched_target

    return patched_target(sglang_python, tmp_path_factory.mktemp("patched"), with_=PATCHED_WITH, bytecode=True)


@pytest.fixture(scope="session")
def sglang_0522(sglang_python, tmp_path_factory) -> str:
    """The python of a throwaway SGLang 0.5.22 environment (the sglang package only, its dependencies from the
    0.5.23 test environment: tests/patch_helpers.py ``release_target``), built once per session; only read it."""
    from patch_helpers import release_target

    return release_target(sglang_python, tmp_path_factory.mktemp("sglang-0.5.22") / "venv", "0.5.22")


@pytest.fixture
def cli_runner() -> CliRunner:
    """Click's CliRunner with stderr kept apart from stdout."""
    try:
        return CliRunner(mix_stderr=False)  # click < 8.2
    except TypeError:
        return CliRunner()


@pytest.fixture
def fake_systemd(tmp_path, monkeypatch):
    """Fake ``systemctl``/``journalctl`` first on PATH, replaying recorded systemd output (tests/install_fakes.py)."""
    from install_fakes import FakeSystemd

    fake = FakeSystemd(tmp_path)
    monkeypatch.setenv("FAKE_SYSTEMD_DIR", str(fake.dir))
    monkeypatch.setenv("PATH", f"{fake.bin}:{os.environ['PATH']}")
    return fake


@pytest.fixture
def silent():
    """A listening loopback socket nobody accepts on (:class:`helpers.Silent`): the kernel completes TCP
    handshakes, no byte ever comes back; ``silent.sent()`` tells afterwards what was sent to it."""
    from helpers import Silent

    server = Silent()
    yield server
    server.close()


@pytest.fixture
def root(tmp_path) -> Path:
    """An empty folder standing for a host's / (``--root``)."""
    r = tmp_path / "root"
    r.mkdir()
    return r


# --- running in parallel (pytest-xdist; scripts/test passes -n, --dist loadfile and --no-loadscope-reorder) ---------


#: The modules that boot containers (``container`` mark): named so, since the scheduler below sees test ids only.
CONTAINER_MODULES = "test_container_"


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test id: ``"containers"`` for a container module's test, else its module's path."""
    module = nodeid.split("::", 1)[0]
    return "containers" if Path(module).name.startswith(CONTAINER_MODULES) else module


@pytest.hookimpl(optionalhook=True)  # an xdist hook: `-p no:xdist` runs (scripts/test) have no such hook
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with one change: every container module is one work unit, so one worker boots the
    containers one after another while the others run the rest. With a unit per module two workers each took a
    container module, and one of them waited on the machine's one-container lock (tests/systemd_container.py)
    for the other's whole module: a test of the harness waited 115 s of its 120 s guard in a CI run."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ContainersTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ContainersTogether(config, log)


def pytest_collection_modifyitems(config, items):
    """In a pytest-xdist worker, run the modules that boot containers first, then those that start SGLang or vLLM
    processes, then the rest, so the cheap tests fill in beside them and no long module starts last while the
    other workers idle (scripts/test passes ``--no-loadscope-reorder``, so modules go out in this order). Whole
    modules (``--dist loadfile``): a module's fixtures (a booted container, the network-namespace pair, a running
    proxy) are built once and its tests keep their order. A serial run keeps the collection order.

    Not ``--dist loadgroup``: with pytest 9.2 and pytest-xdist 3.8 its ``xdist_group`` marks change no test id
    (xdist sets ``item._nodeid``, which pytest 9 no longer reads), so it schedules test by test.

    Shared resources and how parallel runs keep apart: containers are named ``kimi-test-<pid>-<dir>`` with a
    private network; network namespaces and veths carry the process id (tests/test_preflight_netns.py) or are
    unshared; every server listens on a port the kernel picked (port 0) or one probed free; files live under
    pytest's per-worker tmp_path."""
    for item in items:
        if "container" in item.keywords and work_unit(item.nodeid) != "containers":
            raise pytest.UsageError(f"{item.nodeid.split('::', 1)[0]}: a module of container tests is named "
                                    f"{CONTAINER_MODULES}*.py (pytest_xdist_make_scheduler keeps them on one "
                                    "worker by that name)")
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        heavy = 0 if "container" in item.keywords else 1 if ("sglang" in item.keywords or "vllm" in item.keywords
                                                                or "replay" in item.fixturenames
                                                                or "patched_sglang" in item.fixturenames) else 2
        rank[module] = min(rank.get(module, 2), heavy)
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])  # stable: a module's tests stay in order
