# -*- Python -*-
"""lit configuration for camlir's regression suites.

Tool paths come from the site config that CMake generates (build/test/lit.site.cfg.py, the
LLVM way); when lit is pointed at this folder directly, they are looked up next to the
running Python (the project's virtual environment) and then on PATH.
"""

import os
import shutil
import sys

import lit.formats

config.name = "camlir"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".py"]
config.excludes = ["python", "lit.cfg.py", "lit.site.cfg.py", "lit.site.cfg.py.in", "Inputs"]
config.test_source_root = os.path.dirname(__file__)
obj_root = getattr(config, "camlir_obj_root", None)
config.test_exec_root = os.path.join(obj_root, "test") if obj_root else config.test_source_root


def _tool(attr, name):
    path = getattr(config, attr, None)
    if path:
        return path
    scripts = os.path.dirname(sys.executable)
    candidate = os.path.join(scripts, name)
    found = candidate if os.path.exists(candidate) else shutil.which(name)
    if not found:
        lit_config.fatal(f"cannot find '{name}': install the project (pip install -e '.[test]')")
    return found


python = getattr(config, "python_executable", None) or sys.executable
config.substitutions.append(("%python", python))
# Longest names first: lit substitutes in order.
config.substitutions.append(("FileCheck", _tool("filecheck_path", "filecheck")))
config.substitutions.append(("ca-opt", _tool("ca_opt_path", "ca-opt")))

# Tests run with a clean environment apart from what tools need.
for var in ("HOME", "PATH", "TMPDIR"):
    if var in os.environ:
        config.environment[var] = os.environ[var]
