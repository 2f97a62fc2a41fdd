#!/usr/bin/env python3
"""Fails when a doc or a comment names a repository path that does not exist: every token of the
tracked text files (sources, *.md, CMakeLists.txt, scripts) that starts with a top-level folder
of the repository and looks like a path (src/plan/plan.cc, tests/torch/test_shrink.py,
perf/agbench, scripts/setup.sh) must name a file or folder of the tree, and so must a token that
starts with a folder of src/ in the sources and tests (plan/plan.h, transport/shm/board.h;
#include lines are the compiler's to check). A path may leave out its extension (base/numeric
names base/numeric.h). A markdown link's target must exist relative to its page. Measured
data (results *.txt/*.json/*.log) is not read. Run by ctest (label unit)."""
import glob
import os
import re
import subprocess
import sys

root = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# Paths named on purpose that are not in the tree. Keep it short, and say why.
ALLOWED = {
    "src/libhicoll.so",  # built: <build dir>/src/libhicoll.so (plugins/torch/README.md)
    "cmake/ninja",  # "cmake or ninja", not a path (tests/gpu/device_check.sh, tests/torch/gpu_check.sh)
    "cmake/c++/nvcc",  # the same (tests/gpu/device_check.sh)
}

READ = (".md", ".cc", ".h", ".hpp", ".c", ".cu", ".py", ".sh", ".cmake", ".in", ".toml", ".map", ".supp")
SKIP_DIRS = ("build", ".venv", ".git")


def tracked():
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-co", "--exclude-standard", "-z"],
                             capture_output=True, check=True).stdout.decode()
        return [f for f in out.split("\0") if f]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: walk the tree
        files = []
        for d, dirs, fs in os.walk(root):
            dirs[:] = [x for x in dirs if not x.startswith(SKIP_DIRS)]
            files += [os.path.relpath(os.path.join(d, f), root) for f in fs]
        return files


files = [f for f in tracked() if os.path.isfile(os.path.join(root, f))]
top = sorted({f.split("/")[0] for f in files if "/" in f and not f.startswith(SKIP_DIRS)}, key=len, reverse=True)


def path_token(folders):
    """A path: one of folders, '/', then path characters; not the tail of a longer path or word
    (../device/values.h, $ROOT/perf, a URL) nor a module name (hicoll.torch)."""
    return re.compile(r"(?<![\w./$~-])(?:%s)/[\w.+/-]*" % "|".join(re.escape(t) for t in folders))


token = path_token(top)
rooms = sorted({f.split("/")[1] for f in files if f.startswith("src/") and f.count("/") > 1})
room_token = path_token(rooms)  # src-relative, read in src/, include/ and tests/ only
# Forms, not paths: <name>, globs, {a,b}, $VAR, ..., and N / L / W / K standing for a number.
placeholder = re.compile(r"[<>*{}$]|(^|[/_x-])[NLWK](?=$|[/_x.-])|\.\.\.")

bad = []
checked = 0
for f in files:
    name = os.path.basename(f)
    if not (name.endswith(READ) or name == "CMakeLists.txt" or f.startswith(".ci/")):
        continue
    try:
        text = open(os.path.join(root, f), encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        continue
    in_code = f.startswith(("src/", "include/", "tests/"))
    for n, line in enumerate(text.splitlines(), 1):
        found = list(token.finditer(line))
        if in_code and not re.match(r"\s*#\s*include", line):
            found += [m for m in room_token.finditer(line) if not token.match(line, m.start())]
        if name.endswith(".md"):  # [text](target) links, relative to the page
            for link in re.findall(r"\]\(([^)\s]+)\)", line):
                target = link.split("#")[0]
                if target and not re.match(r"[a-z]+:", target):
                    checked += 1
                    if not os.path.exists(os.path.join(root, os.path.dirname(f), target)):
                        bad.append(f"{f}:{n}: {link} (link)")
        for m in found:
            if line[m.end():m.end() + 1] in ("<", "*", "{", "$"):  # tests/torch/test_*.py, perf/<date>/
                continue
            path = m.group(0).rstrip(".,;:-/")  # end of a sentence, a :line suffix, a folder's slash
            if placeholder.search(path) or path in ALLOWED or "/" not in path:
                continue
            checked += 1
            # From the repository root, or from the naming file's folder (plugins/torch/README.md
            # names the files of plugins/torch/cmake as cmake/...).
            bases = [root, os.path.join(root, os.path.dirname(f))] + ([os.path.join(root, "src")] if in_code else [])
            if not any(os.path.exists(os.path.join(b, path)) or glob.glob(os.path.join(b, path) + ".*") for b in bases):
                bad.append(f"{f}:{n}: {path}")
for b in bad:
    print(b)
print(f"paths_exist: {'FAIL' if bad else 'ok'} ({checked} paths named, {len(bad)} that do not exist)")
sys.exit(1 if bad else 0)
