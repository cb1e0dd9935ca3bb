"""install/uninstall plans as data: HostFacts in, Plan out (the planners read nothing else).

Every fact is written here by hand (accounts, GPU device groups, unit states, the key file, file
bytes, an interrupted run's record); the layout points at a path that does not exist, so a
planner that touched the disk would see nothing of what these tests describe.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from install_fakes import write_profile
from kimi_deploy.wire.apikey import KeyFile
from kimi_deploy.errors import UsageError
from kimi_deploy.host.records import FileRecord, Intent, Manifest, Ownership, sha256
from kimi_deploy.host.install.facts import HostFacts
from kimi_deploy.host.install.files import desired_files
from kimi_deploy.host.install.install_plan import plan_install_from
from kimi_deploy.host.install.uninstall_plan import plan_uninstall_from
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import load_profile
from kimi_deploy.wire.readiness import NOT_READY, READY, Readiness
from kimi_deploy.deployment import resolve

NOWHERE = HostLayout(Path("/nonexistent/kimi-deploy-plan-data"))
HOST = HostLayout(Path("/"))
KEY = "/etc/kimi-deploy/kimi-test.api-key"
MANIFEST = "/etc/kimi-deploy/kimi-test.manifest.json"


@pytest.fixture
def profile(tmp_path):
    return load_profile(write_profile(tmp_path / "p.toml"))


def facts_for(layout, **kw) -> HostFacts:
    base = dict(layout=layout, users=frozenset({"sglang"}), groups=frozenset({"sglang"}),
                key=KeyFile(KEY, exists=True), enabled={"kimi-test.service": True,
                                                       "kimi-deploy-check@kimi-test.timer": True},
                active={"kimi-deploy-check@kimi-test.timer": True})
    base.update(kw)
    return HostFacts(**base)


def plan(profile, facts, **kw):
    files, version = desired_files(profile)
    return plan_install_from(profile, facts, files, version, **kw), files


def kinds(p) -> list[str]:
    return [s.summary.split(" ")[0] + (" " + s.argv[0] if s.argv else "") for s in p.steps]


def test_an_empty_host_plans_every_file_the_user_the_key_and_enabling(profile):
    p, files = plan(profile, facts_for(HOST, users=frozenset(), groups=frozenset(), key=KeyFile(KEY, False),
                                       enabled={}, active={}))
    assert {c.host_path for c in p.files} == set(files) | {MANIFEST}
    assert all(c.action == "create" for c in p.files)
    argv = [s.argv for s in p.steps if s.argv]
    assert argv[0][:2] == ("groupadd", "--system") and argv[1][0] == "useradd"
    assert "--home-dir" in argv[1] and "/var/lib/kimi-test" in argv[1]
    assert [s.kind for s in p.steps if s.kind == "api-key"] == ["api-key"]
    assert ("systemctl", "enable", "--", "kimi-test.service", "kimi-deploy-check@kimi-test.timer") in argv
    assert ("systemctl", "start", "--", "kimi-deploy-check@kimi-test.timer") in argv
    assert p.intent.api_key_created == KEY and p.intent.manifest.api_key_file_created == KEY


def test_files_already_in_place_plan_nothing(profile):
    files, version = desired_files(profile)
    first = plan_install_from(profile, facts_for(HOST), files, version)
    manifest_bytes = next(c.new for c in first.files if c.host_path == MANIFEST)
    on_disk = {**files, MANIFEST: manifest_bytes}
    again = plan_install_from(profile, facts_for(HOST, files=on_disk, manifest=first.intent.manifest), files, version)
    assert again.is_noop, again.to_dict()


@pytest.mark.parametrize(("members", "expect"), [((), True), (("sglang",), False)])
def test_a_restricted_gpu_node_group_is_joined_once(profile, members, expect):
    p, _ = plan(profile, facts_for(HOST, gpu_groups={"video": members}))
    usermod = [s.argv for s in p.steps if s.argv[:1] == ("usermod",)]
    assert usermod == ([("usermod", "--append", "--groups", "video", "sglang")] if expect else [])


def test_under_root_without_passwd_no_account_is_created(profile):
    p, _ = plan(profile, facts_for(NOWHERE, users=frozenset(), groups=frozenset(), has_passwd=False))
    assert not any(s.argv[:1] in (("useradd",), ("groupadd",)) for s in p.steps)
    assert any("the --root tree has no /etc/passwd" in n for n in p.notes)
    assert not any(s.argv[:1] == ("usermod",) for s in p.steps)  # device groups are the host's business


def test_key_file_facts_decide_create_or_refuse(profile):
    """The fact carries the clients' own verdict (apikey.key_file_problem): install refuses what they refuse."""
    with pytest.raises(UsageError, match="refused: it is empty") as info:
        plan(profile, facts_for(HOST, key=KeyFile(KEY, True, "it is empty", "write the key into FILE")))
    assert KEY in str(info.value.hint)
    p, _ = plan(profile, facts_for(HOST, key=KeyFile(KEY, True)))
    assert not any(s.kind == "api-key" for s in p.steps)


def test_an_interrupted_upgrade_is_recognised_not_refused(profile):
    files, version = desired_files(profile)
    unit = "/etc/systemd/system/kimi-test.service"
    old_bytes = b"# Generated by kimi-deploy 0.0.1\n[Service]\nExecStart=/old\n"
    old = Manifest(kimi_deploy_version="0.0.1", service="kimi-test", profile_sha256="x", sglang_version="0.5.23",
                   files={unit: FileRecord(sha256=sha256(old_bytes))}, cache_dir="/var/cache/kimi-test",
                   state_dir="/var/lib/kimi-test")
    new = old.model_copy(update={"files": {hp: FileRecord(sha256=sha256(b)) for hp, b in files.items()}})
    intent = Intent(manifest=new, previous=dict(old.files), api_key_created=KEY)
    # killed after the unit was renamed but before the manifest: the unit holds the new bytes,
    # the manifest on disk is the old one
    on_disk = {unit: files[unit]}
    without = plan_install_from(profile, facts_for(HOST, files={unit: b"# Generated by kimi-deploy\nother\n"},
                                                   manifest=old, intent=intent), files, version)
    assert [r.host_path for r in without.refusals] == [unit]  # bytes matching neither record are refused
    p = plan_install_from(profile, facts_for(HOST, files=on_disk, manifest=old, intent=intent), files, version)
    assert not p.refusals
    assert p.stale_intent and any("interrupted" in n for n in p.notes)
    assert p.intent.manifest.api_key_file_created == KEY  # the key that run created stays recorded


def test_an_interrupted_first_install_is_removed_by_uninstall_with_its_key_on_purge(profile):
    files, _ = desired_files(profile)
    written = dict(list(files.items())[:2])
    manifest = Manifest(kimi_deploy_version="0.1.0", service="kimi-test", profile_sha256="x",
                        sglang_version="0.5.23", files={hp: FileRecord(sha256=sha256(b)) for hp, b in files.items()},
                        api_key_file_created=KEY, api_key_file=KEY, cache_dir="/var/cache/kimi-test",
                        state_dir="/var/lib/kimi-test")
    facts = HostFacts(layout=NOWHERE, files=written, intent=Intent(manifest=manifest, api_key_created=KEY),
                      exists=frozenset({KEY}), installed=("kimi-test",))
    p = plan_uninstall_from(facts, "kimi-test", purge=True)
    assert {c.host_path for c in p.changes} == set(written)
    assert all(c.ownership is Ownership.OURS for c in p.changes) and not p.refusals
    assert any(s.kind == "remove-file" and s.path == NOWHERE.join(KEY) for s in p.steps)
    assert p.stale_intent


def test_leftovers_of_a_killed_run_are_planned_away(profile):
    stale = ("/etc/systemd/system/.kimi-test.service.ab12cd_9.tmp", "/etc/kimi-deploy/backup/kimi-test/2025")
    p, _ = plan(profile, facts_for(NOWHERE, stale=stale))
    removals = [(s.kind, s.path) for s in p.steps if "interrupted kimi-deploy run" in s.summary]
    assert removals == [("remove-file", NOWHERE.join(stale[0])), ("remove-tree", NOWHERE.join(stale[1]))]


def test_purge_removes_the_backups_last(profile):
    manifest = Manifest(kimi_deploy_version="0.1.0", service="kimi-test", profile_sha256="x",
                        sglang_version="0.5.23", files={}, api_key_file_created=KEY, api_key_file=KEY,
                        cache_dir="/var/cache/kimi-test", state_dir="/var/lib/kimi-test")
    facts = HostFacts(layout=NOWHERE, manifest=manifest, installed=("kimi-test",),
                      exists=frozenset({KEY, "/var/lib/kimi-test", "/var/cache/kimi-test"}))
    p = plan_uninstall_from(facts, "kimi-test", purge=True)
    removed = [NOWHERE.host_path(s.path) for s in p.steps if s.kind.startswith("remove")]
    assert removed[-1] == "/etc/kimi-deploy/backup/kimi-test"  # a purge killed earlier still finds its record
    assert set(removed) == {"/var/lib/kimi-test", "/var/cache/kimi-test", KEY, "/etc/kimi-deploy/backup/kimi-test"}


#: Audit events (PEP 578) a planner must not raise: opening a file, any ``os.*`` call that reaches the system
#: (stat, listdir, scandir, chmod, ...), a subprocess, a socket.
_IO_EVENTS = ("open", "subprocess.Popen", "socket.", "os.", "shutil.", "glob.", "pathlib.")
_AUDIT: dict[str, list | None] = {"events": None}


def _audit(event: str, args: tuple) -> None:
    events = _AUDIT["events"]
    if events is not None and event.startswith(_IO_EVENTS):
        events.append((event, repr(args)[:200]))


def _io_during(fn):
    """``(result of fn(), audit events it raised)``; the hook is installed once for the process."""
    if not _AUDIT.get("installed"):
        sys.addaudithook(_audit)
        _AUDIT["installed"] = True
    _AUDIT["events"] = []
    try:
        result = fn()
    finally:
        events, _AUDIT["events"] = _AUDIT["events"], None
    return result, events


FLEET = (
    '[service]\nname = "kimi-test"\ngpu_count = 8\n[sglang]\nmodel_path = "/models/k"\nhost = "0.0.0.0"\n'
    'tp_size = 8\npp_size = 2\napi_key_file = "/etc/kimi-deploy/kimi-test.api-key"\n[fleet]\ndist_init_port = 20000\n'
    'nic = "eth0"\n[[fleet.replicas]]\nnodes = ["10.0.0.11", "10.0.0.12"]\n[gateway]\nhost = "10.0.0.10"\n')


@pytest.mark.parametrize("host", [None, "10.0.0.10", "10.0.0.11", "10.0.0.12"],
                         ids=["one-host", "gateway-host", "rank-0", "rank-1"])
def test_planners_never_touch_the_disk(profile, host):
    """install, uninstall and status plan from their facts alone: no file opened, no ``os`` call, no
    subprocess, no socket (Python's audit hooks see every one, whatever module makes it), on one host and on
    each host part of a fleet (its gateway host, each rank of a two-node group)."""
    import tomllib

    from kimi_deploy.profile import parse_profile
    from kimi_deploy.topology import find_rank
    from kimi_deploy.host.status import StatusFacts, status_from
    from kimi_deploy.facts.units import parse_show

    if host is not None:
        profile = parse_profile(tomllib.loads(FLEET))
    files, version = desired_files(profile, host=host)
    facts = facts_for(NOWHERE, stale=("/etc/kimi-deploy/.kimi-test.env.12.bak",))
    rank = find_rank(profile, host) if host not in (None, "10.0.0.10") else None

    def plans():
        p = plan_install_from(profile, facts, files, version)
        u = plan_uninstall_from(HostFacts(layout=NOWHERE, manifest=p.intent.manifest, installed=("kimi-test",)),
                                "kimi-test", purge=True)
        running = parse_show("ActiveState=active\nSubState=running\nResult=success\n")
        probe = None if host == "10.0.0.10" else Readiness(READY, "GET", "http://h/health_generate", 200, "ok")
        launch = None if probe is None else (["--model-path", "/elsewhere"], "/server_info")
        s = status_from(resolve(profile), p.intent.manifest,
                        StatusFacts(NOWHERE, files, running, None, None, probe, launch, {}, None, rank=rank))
        return p, u, s

    (p, u, s), events = _io_during(plans)
    assert events == []
    assert p.changes and u.files and u.steps
    assert (s.launch is None) is (host == "10.0.0.10")


def test_status_is_computed_from_facts(profile):
    from kimi_deploy.host.status import StatusFacts, status_from
    from kimi_deploy.facts.units import parse_show

    files, version = desired_files(profile)
    manifest = plan(profile, facts_for(HOST))[0].intent.manifest
    unit = "/etc/systemd/system/kimi-test.service"
    on_disk = {**files, unit: b"edited", "/etc/kimi-deploy/kimi-test.env": None}
    facts = StatusFacts(NOWHERE, on_disk, parse_show("ActiveState=failed\nSubState=failed\nResult=exit-code\n"),
                        None, None, Readiness(NOT_READY, "GET", "http://h/health_generate", None, "connection refused"),
                        None, {"state": "applied"}, {"path": "/var/lib/kimi-test/check-report.json",
                                                     "modified_at": "2025-01-01T00:00:00+00:00", "exit_code": 1,
                                                     "counts": {"fail": 2}})
    report = status_from(resolve(profile), manifest, facts)
    assert report.files[unit] == "modified" and report.files["/etc/kimi-deploy/kimi-test.env"] == "missing"
    text = "\n".join(report.problems)
    for expected in (f"{unit} was changed after install", "kimi-deploy/kimi-test.env is missing",
                     "kimi-test.service is failed/failed", "is not ready", "the last nightly check failed"):
        assert expected in text
    assert report.exit_code == 1


def test_status_of_a_gateway_host_reports_the_gateway_unit_and_no_server(tmp_path):
    """A fleet's gateway host that serves no replica (``install --host GATEWAY``) runs no SGLang: status reads the
    gateway unit and the nightly ``check --each-worker`` report; no health, launch or patch problems."""
    import tomllib

    from kimi_deploy.profile import parse_profile
    from kimi_deploy.host.status import StatusFacts, gateway_host, status_from
    from kimi_deploy.facts.units import parse_show

    fleet = parse_profile(tomllib.loads(
        '[service]\nname = "kimi-test"\n[sglang]\nmodel_path = "/models/k"\nhost = "0.0.0.0"\n'
        'api_key_file = "/etc/kimi-deploy/kimi-test.api-key"\n[fleet]\n[[fleet.replicas]]\nnodes = ["10.0.0.11"]\n'
        '[gateway]\nhost = "10.0.0.10"\n'))
    files, version = desired_files(fleet, host="10.0.0.10")
    assert "/etc/systemd/system/kimi-test-gateway.service" in files and "/etc/systemd/system/kimi-test.service" not in files
    manifest = Manifest(kimi_deploy_version="0.1.0", service="kimi-test", profile_sha256="x", sglang_version=version,
                        files={hp: FileRecord(sha256=sha256(b)) for hp, b in files.items()},
                        cache_dir="/var/cache/kimi-test", state_dir="/var/lib/kimi-test")
    assert gateway_host(resolve(fleet, launches=False), manifest)
    node = desired_files(fleet, host="10.0.0.11")[0]
    assert not gateway_host(resolve(fleet, launches=False), manifest.model_copy(update={"files": {hp: FileRecord(sha256="x") for hp in node}}))
    report_hp = "/var/lib/kimi-test-gateway/check-workers.json"
    facts = StatusFacts(NOWHERE, files, parse_show("ActiveState=failed\nSubState=failed\nResult=exit-code\n"),
                        None, None, None, None, {}, {"path": report_hp, "modified_at": "2025-01-01T00:00:00+00:00",
                                                    "exit_code": 1, "counts": {}})
    report = status_from(resolve(fleet), manifest, facts)
    assert report.unit_name == "kimi-test-gateway.service" and report.health is None
    assert report.check_timer == "kimi-deploy-check@kimi-test-gateway.timer"
    text = "\n".join(report.problems)
    assert "kimi-test-gateway.service is failed/failed" in text and "systemctl restart kimi-test-gateway.service" in text
    assert f"report {report_hp}" in text and "--each-worker" in text
    assert "not ready" not in text and "patch" not in text and len(report.problems) == 2
    assert report.to_dict()["unit_name"] == "kimi-test-gateway.service"


# ---------------------------------------------------------------- the accounts install created (issue 17)

def _record(**kw) -> Manifest:
    base = dict(kimi_deploy_version="0.1.0", service="kimi-test", profile_sha256="x", sglang_version="0.5.23",
                files={}, cache_dir="/var/cache/kimi-test", state_dir="/var/lib/kimi-test")
    return Manifest(**(base | kw))


def test_install_records_the_accounts_it_creates_and_only_those(profile):
    created = plan(profile, facts_for(HOST, users=frozenset(), groups=frozenset()))[0].intent.manifest
    assert (created.users_created, created.groups_created) == (["sglang"], ["sglang"])
    group_only = plan(profile, facts_for(HOST, users=frozenset()))[0].intent.manifest  # the group was there
    assert (group_only.users_created, group_only.groups_created) == (["sglang"], [])
    existing = plan(profile, facts_for(HOST))[0].intent.manifest
    assert (existing.users_created, existing.groups_created) == ([], [])
    skipped = plan(profile, facts_for(HOST, users=frozenset(), groups=frozenset()), create_user=False)[0]
    assert skipped.intent.manifest.users_created == []


@pytest.mark.parametrize("where", ["manifest", "intent", "last_uninstalled"])
def test_a_reinstall_keeps_the_record_of_accounts_an_earlier_install_created(profile, where):
    earlier = _record(users_created=["sglang"], groups_created=["sglang"])
    fact = {"intent": Intent(manifest=earlier)} if where == "intent" else {where: earlier}
    p = plan(profile, facts_for(HOST, **fact))[0]  # the accounts exist now: nothing is created
    assert not any(s.argv[:1] in (("useradd",), ("groupadd",)) for s in p.steps)
    assert (p.intent.manifest.users_created, p.intent.manifest.groups_created) == (["sglang"], ["sglang"])


def _accounts(p) -> list[tuple[str, ...]]:
    return [s.argv for s in p.steps if s.argv[:1] in (("userdel",), ("groupdel",))]


@pytest.mark.parametrize("layout,root_args", [(HOST, ()), (NOWHERE, ("--root", str(NOWHERE.root)))])
def test_purge_removes_the_user_then_the_group_install_created_before_the_backups(layout, root_args):
    record = _record(users_created=["sglang"], groups_created=["sglang"])
    facts = HostFacts(layout=layout, manifest=record, installed=("kimi-test",),
                      users=frozenset({"sglang"}), groups=frozenset({"sglang"}))
    p = plan_uninstall_from(facts, "kimi-test", purge=True)
    assert _accounts(p) == [("userdel", *root_args, "sglang"), ("groupdel", *root_args, "sglang")]
    steps = [s.argv[0] if s.argv else s.kind for s in p.steps]
    assert steps.index("groupdel") < steps.index("remove-tree") == len(steps) - 1  # the record goes last
    assert all(s.when == "after" and s.gone_exit == 6 for s in p.steps if s.argv[:1] in (("userdel",), ("groupdel",)))
    kept = plan_uninstall_from(facts, "kimi-test")  # without --purge they are kept, and said
    assert _accounts(kept) == [] and any("user sglang, group sglang" in n for n in kept.notes)


def test_purge_leaves_accounts_it_did_not_create_or_that_are_gone_or_in_use():
    from kimi_deploy.host.records import Claims

    present = dict(users=frozenset({"sglang"}), groups=frozenset({"sglang"}))
    not_ours = HostFacts(layout=HOST, manifest=_record(), installed=("kimi-test",), **present)
    assert _accounts(plan_uninstall_from(not_ours, "kimi-test", purge=True)) == []
    gone = HostFacts(layout=HOST, manifest=_record(users_created=["sglang"], groups_created=["sglang"]),
                     installed=("kimi-test",))
    assert _accounts(plan_uninstall_from(gone, "kimi-test", purge=True)) == []
    claims = Claims()
    claims.add_account("user", "sglang", "kimi-two", "runs as it")
    claims.add_account("group", "sglang", "kimi-two", "runs as it")
    shared = HostFacts(layout=HOST, manifest=_record(users_created=["sglang"], groups_created=["sglang"]),
                       installed=("kimi-test", "kimi-two"), claims=claims, **present)
    p = plan_uninstall_from(shared, "kimi-test", purge=True)
    assert _accounts(p) == []
    assert "the user sglang stays: service kimi-two (runs as it)" in p.notes


def test_purge_after_an_uninstall_reads_the_accounts_from_its_backup():
    facts = HostFacts(layout=HOST, last_uninstalled=_record(users_created=["sglang"], groups_created=["sglang"]),
                      users=frozenset({"sglang"}), groups=frozenset({"sglang"}), leftovers=("kimi-test",),
                      exists=frozenset({"/etc/kimi-deploy/backup/kimi-test"}))
    assert _accounts(plan_uninstall_from(facts, "kimi-test", purge=True)) == [("userdel", "sglang"),
                                                                            ("groupdel", "sglang")]
    said = plan_uninstall_from(facts, "kimi-test")
    assert said.is_noop and any("user sglang, group sglang" in n for n in said.notes)


def test_a_new_key_never_starts_with_a_dash(monkeypatch):
    # token_urlsafe starts one key in 64 with '-', which SGLang's and smg's argparse take for an option
    from kimi_deploy.wire import apikey

    drawn = iter(["-Cr" + "a" * 40, "-" * 43, "ok" + "b" * 41])
    monkeypatch.setattr(apikey.secrets, "token_urlsafe", lambda n: next(drawn))
    assert apikey.new_key() == "ok" + "b" * 41
    assert not apikey.argv_safe("-x") and apikey.argv_safe("x-")


def test_a_nightly_dataset_that_is_no_regular_file_is_refused_and_a_missing_one_warned(tmp_path):
    """The nightly unit's [quality] dataset is checked by the reader's own rule (issue #38): a FIFO or device would
    block or never end the nightly run."""
    path = write_profile(tmp_path / "p.toml")
    path.write_text(path.read_text() + '\n[quality]\ndataset = "/srv/k2vv.jsonl"\n')
    quality = load_profile(path)
    with pytest.raises(UsageError, match="a FIFO .* not a regular file"):
        plan(quality, facts_for(HOST, dataset_problem="a FIFO (named pipe)"))
    p, _ = plan(quality, facts_for(HOST, dataset_problem="missing"))
    assert any("[quality] dataset /srv/k2vv.jsonl is missing" in n for n in p.notes)
