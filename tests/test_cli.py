"""The command line: the demo runs end to end and its figures behave as the rules say."""

import json
import subprocess
import sys

from marsrl.cli import main


def test_demo_end_to_end(tmp_path, capsys):
    out = tmp_path / "report.json"
    code = main(
        [
            "demo",
            "--set",
            "rounds=600",
            "--set",
            "vocab=256",
            "--set",
            "near_tie_frac=0.5",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "tau (tokens / round)" in printed and "mars_code" in printed
    report = json.loads(out.read_text())
    strict, mars = report["rules"]["strict"], report["rules"]["mars"]
    # strict: lossless (IS ratio exactly 1, no relaxation); mars: longer rounds and some relaxation
    assert strict["relaxed_frac"] == 0 and abs(strict["is_ratio_mean"] - 1) < 1e-5
    assert mars["tau"] > strict["tau"] + 0.3
    assert mars["relaxed_frac"] > 0.02
    assert len(strict["accept_rate_by_position"]) == 7


def test_demo_greedy(capsys):
    assert main(["demo", "--set", "temperature=0", "--set", "rounds=300", "--set", "vocab=128"]) == 0
    assert "T=" not in capsys.readouterr().out.splitlines()[0]


def test_bad_override_is_a_clear_error(capsys):
    assert main(["demo", "--set", "rouns=10"]) == 2
    assert "rouns" in capsys.readouterr().err


def test_help_runs_as_a_module():
    res = subprocess.run([sys.executable, "-m", "marsrl", "demo", "--help"], capture_output=True, text=True)
    assert res.returncode == 0 and "--set" in res.stdout


def test_the_parsers_import_no_framework():
    """``marsrl --help`` (every command's parser, defaults in their help included) loads none of torch,
    transformers, TRL or Ray: help is instant, and the packages' exports load when first used."""
    code = (
        "import sys; from marsrl.cli import build_parser; build_parser(); "
        "import marsrl.drafter, marsrl.experiment, marsrl.tinyworld; "
        "print(sorted(m for m in ('torch', 'transformers', 'trl', 'ray') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"
    code = 'import marsrl.drafter as d; print(d.Eagle3Drafter.__name__, hasattr(d, "nope"))'
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "Eagle3Drafter False"
