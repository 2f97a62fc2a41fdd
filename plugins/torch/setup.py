"""Builds the hicoll c10d backend (hicoll._C) against the installed torch and libhicoll.

Where libhicoll comes from (first match):
  HICOLL_BUILD_DIR  a CMake build directory of this repository (libhicoll.so under it);
                    headers from the repository's include/
  HICOLL_PREFIX     an installed prefix (include/hicoll/hicoll.h, lib*/libhicoll.so)
The extension gets an rpath to that library directory.

Install (torch must already be in the environment, so no build isolation):
  HICOLL_BUILD_DIR=$PWD/build pip install --no-build-isolation plugins/torch
"""
import glob
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))


def find_hicoll():
    build = os.environ.get("HICOLL_BUILD_DIR")
    prefix = os.environ.get("HICOLL_PREFIX")
    if build:
        libs = sorted(glob.glob(os.path.join(build, "**", "libhicoll.so"), recursive=True))
        if not libs:
            raise SystemExit(f"HICOLL_BUILD_DIR={build}: no libhicoll.so (build the 'hicoll' target first)")
        return os.path.join(REPO, "include"), os.path.dirname(os.path.abspath(libs[0]))
    if prefix:
        for sub in ("lib", "lib64", "lib/x86_64-linux-gnu"):
            if os.path.exists(os.path.join(prefix, sub, "libhicoll.so")):
                return os.path.join(prefix, "include"), os.path.join(prefix, sub)
        raise SystemExit(f"HICOLL_PREFIX={prefix}: no lib*/libhicoll.so")
    raise SystemExit("set HICOLL_BUILD_DIR (a CMake build dir of hicoll) or HICOLL_PREFIX")


include_dir, lib_dir = find_hicoll()

setup(
    name="hicoll",
    version="0.1.0",
    description="hicoll c10d backend: torch.distributed backend='hicoll' (alias 'smddp')",
    packages=["hicoll"],
    ext_modules=[
        CppExtension(
            name="hicoll._C",
            sources=["hicoll/csrc/backend.cc", "hicoll/csrc/bindings.cc"],
            include_dirs=[include_dir, os.path.join(HERE, "hicoll", "csrc")],
            library_dirs=[lib_dir],
            libraries=["hicoll"],
            extra_compile_args=["-O2", "-Wall", "-Wno-unused-parameter"],
            extra_link_args=[f"-Wl,-rpath,{lib_dir}"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.9",
)
