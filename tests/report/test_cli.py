"""``marsrl report`` at the command line: prints the table and the verdict; bad input is one line on
stderr and exit code 2, never a traceback."""

import subprocess
import sys

from marsrl.report.cli import main

from .helpers import write_experiment


def test_prints_table_and_verdict(tmp_path, capsys):
    out = write_experiment(tmp_path, arms=("strict", "mars"))
    assert main([str(out), "--out", str(tmp_path / "rep"), "--samples", "1"]) == 0
    printed = capsys.readouterr().out
    table = (tmp_path / "rep" / "table.md").read_text()
    verdict = (tmp_path / "rep" / "verdict.txt").read_text().strip()
    assert table.split("\n", 2)[2].strip() in printed and verdict in printed
    assert "completions.html" in printed and not (out / "report").exists()


def test_errors_exit_2_with_one_line(tmp_path, capsys):
    out = write_experiment(tmp_path, arms=("strict",))
    bad = out / "strict" / "metrics.jsonl"
    bad.write_text(bad.read_text() + "{oops\n")
    cases = [
        ([str(tmp_path / "missing")], "no such folder"),
        ([str(tmp_path / "strict-only")], "no such folder"),
        ([str(out)], f"{bad}:11: malformed JSON"),
        ([str(out), "--final-frac", "0"], "--final-frac must be in (0, 1]"),
    ]
    (tmp_path / "empty").mkdir()
    cases.append(([str(tmp_path / "empty")], "no arms"))
    for argv, expect in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and expect in err and err.startswith("marsrl report: "), err


def test_no_traceback_from_a_subprocess(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "marsrl.report.cli", str(tmp_path / "missing")], capture_output=True, text=True
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr and res.stderr.count("\n") == 1
