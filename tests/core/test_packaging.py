"""`pip install ferrollm[runtime]` installs every package the model runner and server import.

The check is static and exact, so it runs offline: every third-party module imported anywhere
under ``python/ferrollm`` (found from the source's syntax tree, lazy and function-level imports
included) must belong to a distribution named in pyproject.toml's ``dependencies`` or its
``runtime`` extra. ``make check-runtime-install`` does the real thing (a fresh venv, the wheel,
a model loaded and run); it needs the network and minutes, so it is not part of ``make test``.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as a package (mypy's dependency there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "ferrollm"
#: Device runtimes that come with the device's own stack, never from PyPI through ferrollm:
#: torch_npu with Ascend's, Triton with torch's CUDA builds (the CUDA platform imports it only
#: when it is there, and attends through SDPA otherwise).
OPTIONAL_DEVICE_MODULES = frozenset({"torch_npu", "triton"})


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def imported_third_party_modules(package: Path) -> dict[str, set[str]]:
    """Top-level module -> the files that import it, for every non-stdlib, non-ferrollm import."""
    found: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top not in sys.stdlib_module_names and top != "ferrollm":
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def runtime_requirements(pyproject: Path, extra: str = "runtime") -> set[str]:
    """Normalized distribution names of ``dependencies`` plus the ``extra`` (``runtime``)."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    requirements = [*project["dependencies"], *project["optional-dependencies"][extra]]
    return {_normalize(Requirement(line).name) for line in requirements}


def test_the_scan_finds_imports_at_any_depth() -> None:
    # Guards the scan itself, or the real test could pass vacuously: torch is imported at
    # module level, tqdm only inside a function.
    modules = imported_third_party_modules(PACKAGE)
    assert {"torch", "numpy", "tqdm", "tokenizers", "safetensors", "gguf"} <= set(modules)
    assert not {"ferrollm", "os", "typing"} & set(modules)


#: Folders whose imports may come from an extra besides ``runtime``: folder -> the extra.
OPTIONAL_EXTRAS = {"python/ferrollm/media/": "media", "python/ferrollm/bench/": "bench"}


def test_runtime_extra_covers_every_third_party_import() -> None:
    """The media decoders' libraries may come from the ``media`` extra instead, but only for
    imports under ``ferrollm/media/`` (which imports them lazily), and the benchmarks' HTTP
    client and plotting library from the ``bench`` extra, only under ``ferrollm/bench/``
    (which the CLI imports without them): the rest of the package must run with ``runtime``
    alone."""
    required = runtime_requirements(ROOT / "pyproject.toml")
    extras = {
        folder: runtime_requirements(ROOT / "pyproject.toml", extra)
        for folder, extra in OPTIONAL_EXTRAS.items()
    }
    distributions = importlib.metadata.packages_distributions()
    missing = {}
    for module, files in imported_third_party_modules(PACKAGE).items():
        if module in OPTIONAL_DEVICE_MODULES:
            continue
        # Installed in the dev venv (requirements/dev.txt, the Makefile's stamps), so its
        # distribution is known.
        assert module in distributions, f"`{module}` (imported by {sorted(files)}) is not installed"
        allowed = required
        for folder, extra in extras.items():
            if all(file.startswith(folder) for file in files):
                allowed = required | extra
        if not {_normalize(d) for d in distributions[module]} & allowed:
            missing[module] = sorted(files)
    assert not missing, f"pyproject.toml's `runtime` extra lacks the distributions of {missing}"


def test_every_public_member_of_the_core_stubs_has_a_docstring() -> None:
    """``_core.pyi`` is the binding's documentation: each public function, class, method and
    property says what it is (stubtest checks the names and signatures)."""
    stubs = Path(__file__).resolve().parents[2] / "python" / "ferrollm" / "_core.pyi"
    missing = []
    for node in ast.parse(stubs.read_text(encoding="utf-8")).body:
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            continue
        members = [(node.name, node)]
        if isinstance(node, ast.ClassDef):
            members += [
                (f"{node.name}.{m.name}", m)
                for m in node.body
                if isinstance(m, ast.FunctionDef)
                and (not m.name.startswith("_") or m.name == "__new__")
            ]
        missing += [name for name, member in members if ast.get_docstring(member) is None]
    assert missing == []


def test_the_playground_files_are_package_data() -> None:
    """Maturin puts every file of the package under ``python-source`` into the wheel: the
    playground's page and assets must live inside the package, no ``[tool.maturin]``
    exclusion may drop them, and the package reads them through importlib.resources (the
    installed wheel's files, when ``make test-python`` runs this)."""
    from importlib import resources

    from ferrollm.server.playground import ASSETS

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    maturin = pyproject["tool"]["maturin"]
    assert maturin["python-source"] == "python"
    assert not any(
        "playground" in str(rule) or rule in ("*.js", "*.css", "*.html")
        for rule in maturin.get("exclude", [])
    )
    installed = resources.files("ferrollm.server.playground")
    names = {name for name, _ in ASSETS.values()}
    for name in names:
        assert installed.joinpath(name).is_file(), name
    source = PACKAGE / "server" / "playground"
    static = {p.name for p in source.iterdir() if p.suffix in (".html", ".js", ".css")}
    assert static == names  # every static file is served, and every served file is there
