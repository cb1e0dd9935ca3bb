"""What the verbs print on stdout: a stream another tool reads, and a reader that leaves early.

- ``render`` without ``--out`` prints one stream: for Kubernetes a multi-document YAML stream that ``kubectl
  apply -f -`` takes (the objects ``kubectl kustomize DIR`` builds from ``--out DIR``), for every other target
  each file after a ``# file: NAME`` line, splitting back into exactly the files ``--out DIR`` writes;
- a stdout whose reader has gone (``| head``) ends every verb quietly: exit 0, nothing on stderr but the verb's
  own warnings, no traceback. Checked at the file-descriptor level: the verb runs in its own process with the
  read end of its stdout pipe closed before it starts, so its first write meets the closed pipe (no race).
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from helpers import replace_examples, run_cli
from kimi_deploy.targets import outdir

PRESET = "kimi-k25-rtx-pro-6000-x8"


def _kubernetes_profile(tmp_path: Path, *flags: str) -> Path:
    path = tmp_path / "kimi.toml"
    result = run_cli(["init", str(path), "--kubernetes", *flags])
    assert result.exit_code == 0, result.stderr
    path.write_text(replace_examples(path.read_text()))
    return path


def _key(document: dict) -> tuple[str, str, str]:
    return document["kind"], document["metadata"].get("namespace", ""), document["metadata"]["name"]


@pytest.mark.parametrize("flags", [[], ["--fleet"]])
def test_kubernetes_to_stdout_is_the_multi_document_stream_kubectl_apply_takes(tmp_path, flags):
    """`render --target kubernetes | kubectl apply -f -`: one document per object, each with its namespace, the
    same objects `kubectl kustomize` builds from `--out DIR` and no Kustomization (the API server has no such
    kind); kubectl's own reader (kustomize over the stream as one file) reads the same objects back."""
    from kube_helpers import kustomize

    profile = _kubernetes_profile(tmp_path, *flags)
    printed = run_cli(["render", "--target", "kubernetes", "--profile", str(profile)])
    assert printed.exit_code == 0, printed.stderr
    streamed = [d for d in yaml.safe_load_all(printed.stdout) if d is not None]
    out = tmp_path / "manifests"
    assert run_cli(["render", "--target", "kubernetes", "--profile", str(profile), "--out", str(out)]).exit_code == 0
    built = kustomize(out)
    assert "Kustomization" not in {d["kind"] for d in streamed}
    assert sorted(map(_key, streamed)) == sorted(map(_key, built))
    assert sorted(streamed, key=_key) == sorted(built, key=_key)
    assert all(d["metadata"].get("namespace") for d in streamed if d["kind"] != "Namespace")
    assert printed.stdout.startswith("---\n# file: namespace.yaml\n")  # the namespace first, as apply -k does
    single = tmp_path / "stream"
    single.mkdir()
    (single / "stream.yaml").write_text(printed.stdout)
    (single / "kustomization.yaml").write_text("resources:\n- stream.yaml\n")
    assert sorted(kustomize(single), key=_key) == sorted(built, key=_key)


def _split_files(text: str) -> dict[str, str]:
    files: dict[str, str] = {}
    name = None
    for line in text.splitlines(keepends=True):
        if line.startswith("# file: "):
            name = line[len("# file: "):].rstrip("\n")
            files[name] = ""
        else:
            assert name is not None, f"text before the first # file: line: {line!r}"
            files[name] += line
    return files


@pytest.mark.parametrize("target, flags", [("systemd", []), ("systemd", ["--fleet"]), ("monitoring", []),
                                           ("litellm", [])])
def test_every_other_target_prints_one_file_per_file_header(tmp_path, target, flags):
    """Split at the `# file: NAME` lines, stdout is exactly the files `--out DIR` writes, by path."""
    path = tmp_path / "kimi.toml"
    assert run_cli(["init", str(path), *flags]).exit_code == 0
    path.write_text(replace_examples(path.read_text()))
    printed = run_cli(["render", "--target", target, "--profile", str(path)])
    assert printed.exit_code == 0, printed.stderr
    out = tmp_path / "out"
    assert run_cli(["render", "--target", target, "--profile", str(path), "--out", str(out)]).exit_code == 0
    written = {str(p.relative_to(out)): p.read_text() for p in sorted(out.rglob("*"))
               if p.is_file() and p.name != outdir.MANIFEST}  # the folder's render manifest is no rendered file
    assert _split_files(printed.stdout) == written
    assert "# ---- " not in printed.stdout


def _run_with_stdout_closed(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``kimi-deploy ARGS`` in its own process whose stdout is a pipe with no reader (``| head`` after head left)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "kimi_deploy", *args], stdout=write, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, text=True, timeout=120, cwd=cwd)
    finally:
        os.close(write)


def _quiet(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert "Broken pipe" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr


@pytest.mark.parametrize("args", [
    ["render", "--preset", PRESET],                       # files after # file: lines (click.echo)
    ["render", "--preset", PRESET, "--print-command"],    # the launch command
    ["presets"],                                          # a listing
    ["presets", "--json"],                                # JSON on stdout
    ["--help"],                                           # click's own output, before any verb runs
    ["render", "--help"],
], ids=["render-files", "render-command", "presets", "json", "help", "verb-help"])
def test_a_closed_stdout_ends_the_verb_quietly_with_exit_0(tmp_path, args):
    _quiet(_run_with_stdout_closed(args, tmp_path))


def test_a_closed_stdout_ends_the_kubernetes_stream_quietly(tmp_path):
    profile = _kubernetes_profile(tmp_path)
    _quiet(_run_with_stdout_closed(["render", "--target", "kubernetes", "--profile", str(profile)], tmp_path))


class _Health(http.server.BaseHTTPRequestHandler):
    """A loopback server whose ``/health`` answers 200 (check's ``health.live`` passes)."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_closed_stdout_ends_a_rich_table_verb_quietly(tmp_path):
    """`check` draws its table with rich, whose own answer to a closed stdout is exit 1 ("a check failed"):
    against a server whose health check passes, the verb still ends with exit 0."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        readable = run_cli(["check", "--base-url", url, "--only", "health.live"])
        assert readable.exit_code == 0, readable.stdout + readable.stderr  # the check passes when read
        _quiet(_run_with_stdout_closed(["check", "--base-url", url, "--only", "health.live"], tmp_path))
    finally:
        server.shutdown()
        server.server_close()


def test_an_epipe_that_is_not_stdout_is_not_hidden(monkeypatch):
    """Only a stdout whose reader has gone ends quietly: a BrokenPipeError from anything else (a child's stdin,
    a socket) while stdout is open still fails the verb."""
    from kimi_deploy import cli as cli_module

    monkeypatch.setattr(cli_module, "stdout_closed", lambda: False)

    def broken(*_args, **_kwargs):
        raise BrokenPipeError("a child's stdin")

    monkeypatch.setattr("kimi_deploy.cli.presets.click.echo", broken)
    with pytest.raises(BrokenPipeError):
        run_cli(["presets"])


def test_a_closed_stdout_keeps_a_failed_verbs_own_exit_code(tmp_path):
    """A verb that fails while its JSON error meets the closed stdout still exits with its own code, the error on
    stderr: the reader leaving hides nothing that went wrong."""
    done = _run_with_stdout_closed(["render", "--preset", "no-such-preset", "--json"], tmp_path)
    assert done.returncode == 2, done.stderr
    assert "error: no such preset" in done.stderr and "Traceback" not in done.stderr
