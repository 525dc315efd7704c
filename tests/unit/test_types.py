"""pyright over rocket/ ([tool.pyright] in pyproject.toml: basic mode, strict on the files it names) finds no error."""

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYRIGHT = REPO / "tests" / "node" / "node_modules" / ".bin" / "pyright"  # pinned in tests/node/package.json


def errors() -> list[str]:
    """Every error, as file:line: message [rule]."""
    # The project named outright: pyright would take a pyrightconfig.json found in a directory above the checkout.
    run = subprocess.run([str(PYRIGHT), "--outputjson", "--project", str(REPO / "pyproject.toml"),
                          "--pythonpath", sys.executable], cwd=REPO, capture_output=True, text=True, timeout=600)
    report = json.loads(run.stdout)
    analyzed = report["summary"]["filesAnalyzed"]
    assert analyzed >= 100, f"pyright analyzed {analyzed} files of rocket/: {run.stderr.strip()[:300]}"
    return [f"{Path(diagnostic['file']).relative_to(REPO)}:{diagnostic['range']['start']['line'] + 1}: "
            f"{diagnostic['message'].replace(chr(10), ' ')} [{diagnostic.get('rule', '')}]"
            for diagnostic in report["generalDiagnostics"] if diagnostic["severity"] == "error"]


def test_pyright_finds_no_error():
    if not PYRIGHT.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{PYRIGHT} is missing: ./test installs it (npm ci --prefix tests/node)")
        pytest.skip("pyright is not installed: npm ci --prefix tests/node")
    found = errors()
    assert not found, f"pyright finds {len(found)} errors:\n" + "\n".join(found)


def test_the_pure_cores_are_checked_strictly():
    """pyproject.toml names the files pyright checks strictly (no unknown types): the pure cores and the data
    plane's codecs."""
    strict = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pyright"]["strict"]
    assert len(strict) >= 13 and all((REPO / path).exists() for path in strict)
