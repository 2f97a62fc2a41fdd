"""PEP 517 backend for hicoll: scikit-build-core, plus the torch to build against.

The extension must be built against the torch it will run with. The torch is, first match:

1. The torch this interpreter imports: `pip install --no-build-isolation`, or an isolated
   build environment that already holds one.
2. The torch of the environment pip installs into (the default `pip install <repo>` into a
   venv that has torch). pip's build isolation hides that environment's site-packages from
   this process, but sysconfig still names them: no torch is required for the build (nothing
   to download), and HICOLL_TORCH_SITE tells CMake's torch probe (plugins/torch/cmake/
   torch_flags.py) which site-packages to import it from.
3. Neither has torch: torch>=2.7 into the build environment (the wheel's own dependency puts
   the same latest torch into the target environment).

HICOLL_BUILD_DIR / HICOLL_PREFIX (where libhicoll comes from, plugins/torch/CMakeLists.txt) may
be given relative to the directory pip builds in (the repository root).
"""
from __future__ import annotations

import importlib.util
import os
import site
import sys
import sysconfig
from importlib import metadata

from scikit_build_core import build as _skb

# The hooks scikit-build-core implements, unchanged.
build_sdist = _skb.build_sdist
prepare_metadata_for_build_wheel = getattr(_skb, "prepare_metadata_for_build_wheel", None)
prepare_metadata_for_build_editable = getattr(_skb, "prepare_metadata_for_build_editable", None)
get_requires_for_build_sdist = _skb.get_requires_for_build_sdist


def _log(msg: str) -> None:
    print(f"hicoll: {msg}", file=sys.stderr, flush=True)


def _target_sites() -> list[str]:
    """The site-packages of the environment pip installs into, in import order."""
    paths = []
    if sys.prefix == sys.base_prefix:  # no venv: a user site comes first when Python runs
        paths.append(site.getusersitepackages())
    for key in ("purelib", "platlib"):
        paths.append(sysconfig.get_paths()[key])
    return list(dict.fromkeys(p for p in paths if p and os.path.isdir(p)))


def _target_torch() -> tuple[str, str] | None:
    """(version, site-packages) of the target environment's torch, or None."""
    for path in _target_sites():
        for dist in metadata.distributions(path=[path]):
            if (dist.metadata["Name"] or "").lower() == "torch" and \
                    os.path.isfile(os.path.join(path, "torch", "__init__.py")):
                return dist.version, path
    return None


def _torch_here() -> bool:
    return importlib.util.find_spec("torch") is not None


def _torch_requirement() -> list[str]:
    if os.environ.get("HICOLL_TORCH_SITE"):
        return []
    if _torch_here():
        return []  # no isolation (or a build environment with torch): that one
    target = _target_torch()
    if target is not None:
        _log(f"building against the target environment's torch {target[0]} ({target[1]}); "
             "no torch in the build environment")
        return []
    _log("no torch in the target environment: torch>=2.7 for the build environment")
    return ["torch>=2.7"]


def _prepare_environment() -> None:
    """What CMake reads from the environment: where torch is, absolute libhicoll paths."""
    if not os.environ.get("HICOLL_TORCH_SITE") and not _torch_here():
        target = _target_torch()
        if target is not None:
            os.environ["HICOLL_TORCH_SITE"] = target[1]
    for var in ("HICOLL_BUILD_DIR", "HICOLL_PREFIX"):
        if os.environ.get(var):
            os.environ[var] = os.path.abspath(os.environ[var])


def get_requires_for_build_wheel(config_settings=None):
    return _skb.get_requires_for_build_wheel(config_settings) + _torch_requirement()


def get_requires_for_build_editable(config_settings=None):
    return _skb.get_requires_for_build_editable(config_settings) + _torch_requirement()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _prepare_environment()
    return _skb.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _prepare_environment()
    return _skb.build_editable(wheel_directory, config_settings, metadata_directory)
