"""What `validate` (and every verb that runs SGLang's interpreter) says when --python is not SGLang's
interpreter: the command with the inline script abbreviated, stdout/stderr under their own labels,
always a fix, and the right words for a file, a folder and a missing path."""

from __future__ import annotations

import os
import sys

import pytest

from kimi_deploy import proc
from kimi_deploy import engine as target
from kimi_deploy.cli import cli
from kimi_deploy.errors import ExitCode, ExternalCommandError, UsageError

PRESET = "kimi-k25-rtx-pro-6000-x8"


def validate(cli_runner, python):
    return cli_runner.invoke(cli, ["validate", "--preset", PRESET, "--python", str(python)])


def executable(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_bin_true_shows_abbreviated_command_and_a_fix(cli_runner):
    result = validate(cli_runner, "/bin/true")
    assert result.exit_code == ExitCode.EXTERNAL
    err = result.stderr
    assert "value: /bin/true -c <probe script> 0\n" in err
    assert "importlib" not in err and "json.dumps" not in err          # the inline script is not dumped
    assert len(err.splitlines()) <= 4
    assert "fix: is /bin/true SGLang's interpreter? `/bin/true -c 'import sglang; print(sglang.__file__)'`" in err


def test_garbage_output_is_labelled_stdout_and_stderr(cli_runner, tmp_path):
    script = executable(tmp_path / "fake-python", "#!/bin/sh\necho 'not json at all'\necho 'on stderr' >&2\n")
    result = validate(cli_runner, script)
    assert result.exit_code == ExitCode.EXTERNAL
    err = result.stderr
    assert "error: the target interpreter printed no JSON result\n" in err
    assert f"value: {script} -c <probe script> 0\n" in err
    assert "  stdout:\n    not json at all\n  stderr:\n    on stderr" in err
    assert "fix: is " in err


def test_failing_program_keeps_streams_apart():
    with pytest.raises(ExternalCommandError) as info:
        proc.run([sys.executable, "-c", "import sys; print('out-line'); sys.exit('err-line')"],
                 display=[sys.executable, "-c", "<tiny script>"], hint="the fix")
    exc = info.value
    assert (exc.stdout.strip(), exc.stderr.strip()) == ("out-line", "err-line")
    text = exc.render()
    assert f"value: {sys.executable} -c <tiny script>\n" in text
    assert "  stdout:\n    out-line\n  stderr:\n    err-line" in text and "fix: the fix" in text


def test_a_file_without_execute_permission_is_not_called_a_folder(cli_runner, tmp_path):
    plain = tmp_path / "passwd"
    plain.write_text("root:x:0:0::/root:/bin/sh\n")
    result = validate(cli_runner, plain)
    assert result.exit_code == ExitCode.USAGE
    assert "not executable (a file without execute permission)" in result.stderr
    assert "folder" not in result.stderr


def test_a_folder_points_at_the_python_inside(cli_runner, tmp_path):
    executable(tmp_path / "venv" / "bin" / "python", "#!/bin/sh\n")
    result = validate(cli_runner, tmp_path / "venv")
    assert result.exit_code == ExitCode.USAGE
    assert "the SGLang interpreter is a folder, not a program" in result.stderr
    assert f"fix: pass the python binary inside it: --python {tmp_path}/venv/bin/python" in result.stderr


def test_missing_interpreter_hint_is_a_next_step_not_the_same_path(tmp_path):
    missing = tmp_path / "venv" / "bin" / "python"
    with pytest.raises(UsageError) as info:
        target.check_interpreter(missing)
    hint = info.value.hint
    assert f"python3 -m venv {tmp_path}/venv" in hint and "import sglang, sys; print(sys.executable)" in hint
    # a python next to the missing name is offered instead
    executable(tmp_path / "other" / "bin" / "python3.11", "#!/bin/sh\n")
    with pytest.raises(UsageError) as info:
        target.check_interpreter(tmp_path / "other" / "bin" / "python")
    assert f"pass --python {tmp_path}/other/bin/python3.11" in info.value.hint
    assert os.fspath(missing) not in info.value.hint
