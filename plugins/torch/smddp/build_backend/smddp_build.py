"""setuptools' backend, refusing to build where a real SMDDP is installed: the shim's
smdistributed package would shadow (or overwrite) it."""
import sysconfig
from importlib import metadata

from setuptools import build_meta as _st

REAL = ("smdistributed-dataparallel", "smdistributed_dataparallel")


def _refuse_over_real_smddp():
    paths = sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})
    for dist in metadata.distributions(path=paths):
        name = (dist.metadata["Name"] or "").lower()
        if name in REAL:
            raise SystemExit(
                f"hicoll-smddp: refusing to install: a real SMDDP ({dist.metadata['Name']} "
                f"{dist.version}) is installed in {paths[0]}; this shim would shadow its "
                "smdistributed package. Keep SMDDP, or uninstall it first "
                "(pip uninstall smdistributed-dataparallel), or use backend='hicoll' directly.")


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _refuse_over_real_smddp()
    return _st.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _refuse_over_real_smddp()
    return _st.build_editable(wheel_directory, config_settings, metadata_directory)


build_sdist = _st.build_sdist
get_requires_for_build_wheel = _st.get_requires_for_build_wheel
get_requires_for_build_sdist = _st.get_requires_for_build_sdist
get_requires_for_build_editable = getattr(_st, "get_requires_for_build_editable", None)
prepare_metadata_for_build_wheel = _st.prepare_metadata_for_build_wheel
