"""The architecture as the code shows it: the two services are siblings that share only
`kokoro_contract`, and the contract depends on neither; the docs name every module; the tests
sit in a tree that mirrors the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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
        # the plugins' shared client: a distribution of its own, with no dependencies
        (
            "integrations/client/kokoro_voice_client",
            {"gateway", "model_server", "kokoro_contract", "emulators", "deploy", "tests"},
        ),
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


DOCUMENTED = ("kokoro_contract", "model_server", "gateway")


def documented_modules(text: str) -> set[str]:
    """The module paths docs/architecture.md's Modules tree names: one `name.py` a line, its
    folders the lines above it with less indentation that end in `/`."""
    section = text.split("## Modules", 1)[1]
    tree = section.split("```", 2)[1]
    folders: list[tuple[int, str]] = []
    found: set[str] = set()
    for line in tree.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        name = line.split()[0]
        if not (name.endswith("/") or name.endswith(".py")):
            continue  # a description carried over from the line above
        while folders and folders[-1][0] >= indent:
            folders.pop()
        path = "".join(folder for _, folder in folders) + name
        if name.endswith("/"):
            folders.append((indent, name))
        elif path.split("/")[0] in DOCUMENTED:
            found.add(path)
    return found


def test_every_module_has_its_line_in_the_architecture_doc() -> None:
    modules = {
        str(path.relative_to(ROOT))
        for package in DOCUMENTED
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py"
    }
    documented = documented_modules((ROOT / "docs" / "architecture.md").read_text())
    assert sorted(modules - documented) == [], "modules without their line in the doc"
    assert sorted(documented - modules) == [], "lines in the doc for modules that are gone"


def test_the_module_tree_is_read_by_its_indentation() -> None:
    doc = "## Modules\n```\ngateway/  the gateway\n  app.py  x\n  reply/\n    plan.py  y\n" + (
        "                  more of y\n  cli.py  z\nbench/  b.py\n```\n"
    )
    assert documented_modules(doc) == {"gateway/app.py", "gateway/reply/plan.py", "gateway/cli.py"}


def test_the_readme_is_a_front_door() -> None:
    """At most 200 lines (history lives in docs/measured.md), and every link stays inside the
    repository and points at a file that exists."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for target in re.findall(r"\]\(([^)]+)\)", readme):
        assert "://" not in target, target
        assert (ROOT / target.split("#")[0]).exists(), target


# Folders under tests/ for what spans the services rather than sitting in one of them.
CROSS_CUTTING = ("end_to_end", "security", "project")


def misplaced_tests(root: Path = ROOT) -> list[str]:
    """Test files whose folder under tests/ is neither a mirror of a folder of Python code in
    the repository (tests/gateway/routing/ for gateway/routing/) nor a cross-cutting one."""
    misplaced: list[str] = []
    for path in (root / "tests").rglob("test_*.py"):
        folder = path.parent.relative_to(root / "tests")
        top = folder.parts[0] if folder.parts else ""
        mirrored = root / folder
        if top in CROSS_CUTTING:
            continue
        if top not in ("", "tests") and mirrored.is_dir() and any(mirrored.rglob("*.py")):
            continue
        misplaced.append(str(path.relative_to(root)))
    return sorted(misplaced)


def test_every_test_file_sits_in_a_mirror_of_the_code_or_a_cross_cutting_folder() -> None:
    assert misplaced_tests() == []


def test_the_check_sees_a_test_file_out_of_place(tmp_path: Path) -> None:
    (tmp_path / "gateway" / "routing").mkdir(parents=True)
    (tmp_path / "gateway" / "routing" / "pool.py").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "testing.md").write_text("")
    for test in (
        "tests/test_flat.py",  # directly in tests/
        "tests/gateway/routing/test_pool.py",
        "tests/gateway/reply/test_chunker.py",  # no gateway/reply/ here
        "tests/end_to_end/test_browser.py",
        "tests/docs/test_testing.py",  # docs/ holds no Python
        "tests/support/test_helper.py",  # no support/ in the repository
    ):
        (tmp_path / test).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / test).write_text("")
    assert misplaced_tests(tmp_path) == [
        "tests/docs/test_testing.py",
        "tests/gateway/reply/test_chunker.py",
        "tests/support/test_helper.py",
        "tests/test_flat.py",
    ]
