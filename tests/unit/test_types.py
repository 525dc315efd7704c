"""pyright (basic mode, strict on the files pyproject.toml names) over rocket/: no file may have more errors than
pyright_baseline.json allows, and a file with fewer must lower its count there, so the count only goes down.
Write the baseline anew after cleaning: python tests/unit/test_types.py --write-baseline."""

import collections
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYRIGHT = REPO / "tests" / "node" / "node_modules" / ".bin" / "pyright"  # pinned in tests/node/package.json
BASELINE = Path(__file__).with_name("pyright_baseline.json")


def errors_by_file() -> tuple[dict[str, int], list[str]]:
    """Each file's error count, and every error as file:line: message [rule]."""
    # The project named outright: pyright would take a pyrightconfig.json found in a directory above the checkout.
    run = subprocess.run([str(PYRIGHT), "--outputjson", "--project", str(REPO / "pyproject.toml"),
                          "--pythonpath", sys.executable], cwd=REPO, capture_output=True, text=True, timeout=600)
    report = json.loads(run.stdout)
    analyzed = report["summary"]["filesAnalyzed"]
    assert analyzed >= 100, f"pyright analyzed {analyzed} files of rocket/: {run.stderr.strip()[:300]}"
    counts, lines = collections.Counter(), []
    for diagnostic in report["generalDiagnostics"]:
        if diagnostic["severity"] != "error":
            continue
        path = str(Path(diagnostic["file"]).relative_to(REPO))
        counts[path] += 1
        message = diagnostic["message"].replace("\n", " ")
        lines.append(f"{path}:{diagnostic['range']['start']['line'] + 1}: {message} [{diagnostic.get('rule', '')}]")
    return dict(counts), lines


def test_pyright_errors_only_go_down():
    if not PYRIGHT.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{PYRIGHT} is missing: ./test installs it (npm ci --prefix tests/node)")
        pytest.skip("pyright is not installed: npm ci --prefix tests/node")
    counts, lines = errors_by_file()
    allowed = json.loads(BASELINE.read_text())
    rose = sorted(path for path, count in counts.items() if count > allowed.get(path, 0))
    fell = sorted(f"{path}: {counts.get(path, 0)} (baseline {count})" for path, count in allowed.items()
                  if counts.get(path, 0) < count)
    assert not rose, "pyright finds more errors than pyright_baseline.json allows in " + ", ".join(rose) + ":\n" + \
        "\n".join(line for line in lines if line.split(":", 1)[0] in rose)
    assert not fell, "fewer pyright errors than the baseline (lower it: python tests/unit/test_types.py " \
        "--write-baseline):\n" + "\n".join(fell)


def test_the_strict_files_have_no_baseline():
    """The files pyproject.toml checks strictly (the pure cores and the data plane's codecs) are clean: none may
    carry errors in the baseline."""
    strict = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pyright"]["strict"]
    assert len(strict) >= 13 and all((REPO / path).exists() for path in strict)
    assert not set(strict) & set(json.loads(BASELINE.read_text()))


if __name__ == "__main__" and sys.argv[1:] == ["--write-baseline"]:
    found, _ = errors_by_file()
    BASELINE.write_text(json.dumps(dict(sorted(found.items())), indent=0) + "\n")
    print(f"{BASELINE}: {sum(found.values())} errors in {len(found)} files")
