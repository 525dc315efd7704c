"""Every package under rocket/ names its public API in __all__ (names its __init__ defines, or its modules), and a
module imports from another package only what that package's __all__ names: never a private name (issue 51)."""

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_path(name: str) -> Path:
    return ROOT / name.replace(".", "/")


def is_package(name: str) -> bool:
    return (module_path(name) / "__init__.py").exists()


def packages() -> list[str]:
    return sorted(".".join(path.parent.relative_to(ROOT).parts) for path in (ROOT / "rocket").rglob("__init__.py")
                  if path.parent != ROOT / "rocket")


def exported(package: str) -> list[str] | None:
    """The package's __all__, as its __init__ writes it (a literal list of strings); None without one."""
    for node in ast.parse((module_path(package) / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", "") == "__all__" for target in node.targets):
            return ast.literal_eval(node.value)
    return None


def imports_across_packages():
    """(module file, target package, name) for each import in rocket/ from a package other than the importer's own
    or an ancestor of it: the name imported from the package, or the module imported from it."""
    for path in sorted((ROOT / "rocket").rglob("*.py")):
        here = ".".join(path.parent.relative_to(ROOT).parts)
        for node in ast.walk(ast.parse(path.read_text())):
            pairs = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("rocket."):
                module = node.module or ""
                if is_package(module):
                    pairs += [(module, alias.name) for alias in node.names if not is_package(f"{module}.{alias.name}")]
                else:
                    package, _, name = module.rpartition(".")
                    pairs.append((package, name))
                    pairs += [(package, alias.name) for alias in node.names if alias.name.startswith("_")]
            elif isinstance(node, ast.Import):
                pairs += [tuple(alias.name.rpartition(".")[::2]) for alias in node.names
                          if alias.name.startswith("rocket.") and not is_package(alias.name)]
            for package, name in pairs:
                if package != here and not here.startswith(package + "."):
                    yield str(path.relative_to(ROOT)), package, name


def test_every_package_names_its_public_api():
    missing = [package for package in packages() if exported(package) is None]
    assert not missing, f"packages without __all__: {missing}"
    for package in packages():
        module = importlib.import_module(package)
        unknown = [name for name in exported(package) or () if not hasattr(module, name)
                   and not module_path(f"{package}.{name}").with_suffix(".py").exists()
                   and not is_package(f"{package}.{name}")]
        assert not unknown, f"{package}.__all__ names what it does not have: {unknown}"


def test_imports_across_packages_take_only_their_public_api():
    wrong = [f"{where}: {package}.{name}" for where, package, name in imports_across_packages()
             if name.startswith("_") or name not in (exported(package) or ())]
    assert not wrong, f"imports of what a package's __all__ does not name (name it there, or use what it names): " \
        f"{wrong}"
