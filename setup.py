"""Computes camlir's package list; everything else is in pyproject.toml.

One package, three source folders: the dialect and the passes live at the top level of the
repository (as in MLIR's standalone example) and are mapped into `camlir`. setuptools' find
directives cannot rename folders into a package, so the list is computed here by walking the
three roots: every folder is a package (one without an `__init__.py`, e.g. a folder of .mlir
files, is a namespace package, as setuptools recommends for data folders), and every file that
is not Python source ships as that package's data. A new subpackage or data file therefore
cannot be left out of the wheel.
"""

import os

from setuptools import setup

ROOTS = {"camlir": "python/camlir", "camlir.dialects": "dialects", "camlir.passes": "passes"}
SKIP_SUFFIXES = (".py", ".pyc", ".pyo")

HERE = os.path.dirname(os.path.abspath(__file__))


def _walk(roots):
    packages, package_data = [], {}
    for root_pkg, root_dir in roots.items():
        top = os.path.join(HERE, root_dir)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
            rel = os.path.relpath(dirpath, top)
            package = root_pkg if rel == "." else ".".join([root_pkg] + rel.split(os.sep))
            if package in packages:
                raise SystemExit(f"setup.py: package {package} found in two source folders")
            packages.append(package)
            data = sorted(f for f in filenames if not f.startswith(".") and not f.endswith(SKIP_SUFFIXES))
            if data:
                package_data[package] = data
    return sorted(packages), package_data


packages, package_data = _walk(ROOTS)
setup(package_dir=ROOTS, packages=packages, package_data=package_data)
