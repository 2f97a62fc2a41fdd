"""PEP 517 backend for hicoll: scikit-build-core, plus the torch to build against.

The extension must be built against the torch it will run with. With --no-build-isolation
that is the environment's torch. With build isolation pip makes a fresh build environment;
this backend then asks for the same torch version as the target environment's (read from its
site-packages, which the isolated build cannot import), or any torch >= 2.7 if it has none.
"""
from __future__ import annotations

import importlib.util
import sysconfig
from importlib import metadata

from scikit_build_core import build as _skb

# The hooks scikit-build-core implements, unchanged.
build_sdist = _skb.build_sdist
build_wheel = _skb.build_wheel
build_editable = _skb.build_editable
prepare_metadata_for_build_wheel = getattr(_skb, "prepare_metadata_for_build_wheel", None)
prepare_metadata_for_build_editable = getattr(_skb, "prepare_metadata_for_build_editable", None)
get_requires_for_build_sdist = _skb.get_requires_for_build_sdist


def _torch_requirement() -> list[str]:
    if importlib.util.find_spec("torch") is not None:
        return []  # no isolation: the environment's torch is the one
    for key in ("platlib", "purelib"):
        path = sysconfig.get_paths()[key]
        for dist in metadata.distributions(path=[path]):
            if (dist.metadata["Name"] or "").lower() == "torch":
                return [f"torch=={dist.version.split('+')[0]}"]
    return ["torch>=2.7"]


def get_requires_for_build_wheel(config_settings=None):
    return _skb.get_requires_for_build_wheel(config_settings) + _torch_requirement()


def get_requires_for_build_editable(config_settings=None):
    return _skb.get_requires_for_build_editable(config_settings) + _torch_requirement()
