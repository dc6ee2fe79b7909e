"""A path the system cannot use (a name past the file system's limit, a file where a
folder should be) is one line and exit status 2 in every command that takes one,
with no folder left behind."""

import pytest

from jaxattn.cli import main

LONG = "a" * 300  # past NAME_MAX (255 on Linux and macOS)


@pytest.mark.parametrize("argv", [
    ["run", "thm41-sphere", "--saves", "10", "--out"],
    ["plot"],
    ["sweep", "thm41-sphere", "--instances", "2", "--out"],
], ids=lambda a: a[0])
def test_a_name_too_long_is_one_line(capsys, tmp_path, argv):
    code = main([*argv, str(tmp_path / LONG)])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err[-2000:]
    assert "too long" in lines[0] and "Traceback" not in err, lines[0]
    assert list(tmp_path.iterdir()) == []


def test_a_file_where_a_folder_should_be_is_one_line(capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    code = main(["run", "thm41-sphere", "--saves", "10", "--out", str(tmp_path / "file" / "run")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err[-2000:]
    assert "Traceback" not in err


def test_an_unknown_experiment_gets_the_closest_name(capsys):
    assert main(["run", "thm41sphere"]) == 2
    err = capsys.readouterr().err.strip()
    assert "did you mean 'thm41-sphere'?" in err and len(err.splitlines()) == 1, err


def test_demo_help_describes_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    options = capsys.readouterr().out.split("options:")[1]
    for flag, default in (("--seed", "0"), ("--tokens", "10"), ("--horizon", "10.0"),
                          ("--out", "runs")):
        text = " ".join(options[options.index(flag):].split()[:20])
        assert f"(default: {default})" in text.split(" --")[0], text


def test_an_unknown_flag_gets_the_flag_it_abbreviates(capsys):
    assert main(["sweep", "thm41-sphere", "--inst", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--inst: did you mean --instances?" in err and len(err.splitlines()) == 1, err


def test_loop_refuses_a_bad_count_before_jax_loads():
    import os
    import subprocess
    import sys

    probe = ("import sys\nfrom jaxattn.cli import main\n"
             "code = main(['loop', '--model', 'gpt2', '--passes', '0'])\n"
             "print('jax' in sys.modules, code)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert out.stdout.split() == ["False", "2"], out.stdout + out.stderr[-2000:]
    assert "`--passes` must be a whole number ≥ 1, got 0" in out.stderr
