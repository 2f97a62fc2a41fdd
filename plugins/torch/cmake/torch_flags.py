"""Prints CMake set() lines describing the torch of this interpreter, for plugins/torch's
CMakeLists.txt: headers, libraries, ABI, C++ standard, and whether to build with CUDA.

CUDA (HICOLL_PLUGIN_CUDA=auto|0|1): with CUDA only when torch has CUDA and a toolkit is usable
for it -- nvcc runs and its major version is torch's (a toolkit that merely exists, or one of
another major version, is not enough). 0 forces the CPU-only build; 1 makes a missing or
mismatched toolkit an error.

HICOLL_TORCH_SITE=<site-packages>: import torch from there, ahead of this interpreter's path (the
build backend sets it when pip's build isolation hides the target environment's torch)."""
import os
import re
import shutil
import site
import subprocess
import sys
import warnings

if os.environ.get("HICOLL_TORCH_SITE"):
    _before = list(sys.path)
    site.addsitedir(os.environ["HICOLL_TORCH_SITE"])  # its .pth files too
    sys.path = [p for p in sys.path if p not in _before] + _before

import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402


def cmake_list(items):
    return ";".join(str(i).replace("\\", "/") for i in items)


def nvcc_version(home):
    nvcc = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    if not nvcc or not os.path.exists(nvcc):
        return None, f"no nvcc (CUDA_HOME={home})"
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{nvcc} does not run: {e}"
    m = re.search(r"release (\d+)\.(\d+)", out)
    return ((int(m.group(1)), int(m.group(2))), nvcc) if m else (None, f"{nvcc}: no version")


def want_cuda():
    mode = os.environ.get("HICOLL_PLUGIN_CUDA", "auto").strip().lower()
    if mode in ("0", "off", "no", "false"):
        return False, "HICOLL_PLUGIN_CUDA=0", None
    home = cpp_extension.CUDA_HOME
    why, ok = None, False
    if torch.version.cuda is None:
        why = f"torch {torch.__version__} has no CUDA"
    else:
        ver, nvcc = nvcc_version(home)
        torch_major = int(torch.version.cuda.split(".")[0])
        if ver is None:
            why = nvcc
        elif ver[0] != torch_major:
            why = (f"toolkit {home} is CUDA {ver[0]}.{ver[1]}, torch {torch.__version__} "
                   f"is CUDA {torch.version.cuda}")
        elif not os.path.exists(os.path.join(home, "include", "cuda_runtime_api.h")):
            why = f"no cuda_runtime_api.h under {home}/include"
        else:
            ok = True
            why = f"torch CUDA {torch.version.cuda}, toolkit {home} (nvcc {ver[0]}.{ver[1]})"
    if not ok and mode in ("1", "on", "yes", "true"):
        sys.exit(f"HICOLL_PLUGIN_CUDA=1 but {why}")
    return ok, why, home if ok else None


def pybind11_abi_defs():
    """The pybind11 ABI macros torch was built with, as cpp_extension passes them (torch < 2.10;
    later torch leaves them to pybind11). Without them the extension's pybind11 cannot see
    torch's types ("referenced unknown base type c10d::Backend")."""
    fn = getattr(cpp_extension, "_get_pybind11_abi_build_flags", None)
    if fn is None:
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flags = fn()
    return [f[2:].replace('\\"', '"') for f in flags if f.startswith("-D")]


def main():
    with_cuda, why, home = want_cuda()
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    libs = ["c10", "torch", "torch_cpu", "torch_python"]
    if with_cuda:
        libs += ["c10_cuda", "torch_cuda"]
    lines = {
        "HICOLL_TORCH_VERSION": torch.__version__,
        "HICOLL_TORCH_PACKAGE_DIR": os.path.dirname(torch.__file__),
        "HICOLL_TORCH_INCLUDE_DIRS": cmake_list(cpp_extension.include_paths()),
        "HICOLL_TORCH_LIBRARY_DIR": os.path.join(os.path.dirname(torch.__file__), "lib"),
        "HICOLL_TORCH_LIBRARIES": cmake_list(libs),
        "HICOLL_TORCH_CXX11_ABI": int(torch._C._GLIBCXX_USE_CXX11_ABI),
        # torch >= 2.10's headers need C++20 (cpp_extension passes -std=c++20 from then on).
        "HICOLL_TORCH_CXX_STANDARD": 20 if (major, minor) >= (2, 10) else 17,
        "HICOLL_PLUGIN_WITH_CUDA": "ON" if with_cuda else "OFF",
        "HICOLL_PLUGIN_CUDA_WHY": why,
        "HICOLL_PLUGIN_CUDA_HOME": home or "",
    }
    for k, v in lines.items():
        print(f'set({k} "{v}")')
    print(f"set(HICOLL_TORCH_PYBIND11_DEFS [=[{';'.join(pybind11_abi_defs())}]=])")


main()
