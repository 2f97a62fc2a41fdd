"""Builds the hicoll c10d backend (hicoll._C) against the installed torch and libhicoll.

Where libhicoll comes from (first match):
  HICOLL_BUILD_DIR  a CMake build directory of this repository (libhicoll.so under it);
                    headers from the repository's include/
  HICOLL_PREFIX     an installed prefix (include/hicoll/hicoll.h, lib*/libhicoll.so)
The extension gets an rpath to that library directory.

CUDA: when torch has CUDA and a CUDA toolkit is found (torch's CUDA_HOME: $CUDA_HOME, nvcc on
PATH or /usr/local/cuda), the extension is built with -DHICOLL_PLUGIN_CUDA and runs CUDA tensors
on hicoll (stream-ordered); otherwise it is CPU-only and sends CUDA tensors to NCCL.
HICOLL_PLUGIN_CUDA=0 forces the CPU-only build, =1 makes a missing toolkit an error.

Install (torch must already be in the environment, so no build isolation):
  HICOLL_BUILD_DIR=$PWD/build pip install --no-build-isolation plugins/torch
"""
import glob
import os

from setuptools import setup
import torch
from torch.utils import cpp_extension
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

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


def want_cuda():
    """(build with CUDA?, why) from HICOLL_PLUGIN_CUDA (auto|0|1), torch and the toolkit."""
    mode = os.environ.get("HICOLL_PLUGIN_CUDA", "auto").strip().lower()
    if mode in ("0", "off", "no", "false"):
        return False, "HICOLL_PLUGIN_CUDA=0"
    home = cpp_extension.CUDA_HOME
    if torch.version.cuda is None:
        why = f"torch {torch.__version__} has no CUDA"
    elif not home or not os.path.exists(os.path.join(home, "include", "cuda_runtime_api.h")):
        why = f"no CUDA toolkit (CUDA_HOME={home})"
    else:
        return True, f"torch CUDA {torch.version.cuda}, toolkit {home}"
    if mode in ("1", "on", "yes", "true"):
        raise SystemExit(f"HICOLL_PLUGIN_CUDA=1 but {why}")
    return False, why


include_dir, lib_dir = find_hicoll()
with_cuda, cuda_why = want_cuda()
print(f"hicoll plugin: {'with' if with_cuda else 'without'} CUDA ({cuda_why})")
Extension = CUDAExtension if with_cuda else CppExtension

setup(
    name="hicoll",
    version="0.1.0",
    description="hicoll c10d backend: torch.distributed backend='hicoll' (alias 'smddp')",
    packages=["hicoll"],
    ext_modules=[
        Extension(
            name="hicoll._C",
            sources=["hicoll/csrc/backend.cc", "hicoll/csrc/bindings.cc"],
            include_dirs=[include_dir, os.path.join(HERE, "hicoll", "csrc")],
            library_dirs=[lib_dir],
            libraries=["hicoll"],
            define_macros=[("HICOLL_PLUGIN_CUDA", "1")] if with_cuda else [],
            # c10/cuda/CUDAEvent.h uses std::hardware_destructive_interference_size (g++ warns).
            extra_compile_args=["-O2", "-Wall", "-Wno-unused-parameter"]
            + (["-Wno-interference-size"] if with_cuda else []),
            extra_link_args=[f"-Wl,-rpath,{lib_dir}"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.9",
)
