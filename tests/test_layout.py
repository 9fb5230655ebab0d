"""The architecture as the code shows it: the two services are siblings that share only
`kokoro_contract`, and the contract depends on neither."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imported_packages(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Top-level packages each module of `package` imports, by module path."""
    found: dict[str, set[str]] = {}
    for path in sorted((root / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(root))] = names
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("gateway", {"model_server", "emulators", "deploy", "tests"}),
        ("model_server", {"gateway", "emulators", "deploy", "tests"}),
        ("kokoro_contract", {"gateway", "model_server", "emulators", "deploy", "tests"}),
    ],
)
def test_services_import_the_contract_never_each_other(package: str, forbidden: set[str]) -> None:
    imports = imported_packages(package)
    assert imports, f"no modules found under {package}/"
    offending = {
        module: names & forbidden for module, names in imports.items() if names & forbidden
    }
    assert offending == {}


def test_the_check_sees_a_cross_import(tmp_path: Path) -> None:
    (tmp_path / "gateway").mkdir()
    (tmp_path / "gateway" / "bad.py").write_text("import os\nfrom model_server.audio import x\n")
    assert imported_packages("gateway", tmp_path) == {"gateway/bad.py": {"os", "model_server"}}
