#!/usr/bin/env python3
"""Fails when an include under src/ runs upward: every folder may include only its own files and
those of the folders below it (README.md, "Layout"). Run by ctest (label unit)."""
import os
import re
import sys

# Ground floor first. sharded/ is built on the public C API (and the ground floor's headers);
# launch/ (the launcher the tools and tests share) on nothing of hicoll.
LAYERS = ["base", "bootstrap", "transport", "plan", "core", "algorithms", "fallback", "device", "api", "tools"]
SIDE = {"sharded": {"base"}, "launch": set()}

src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
include = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/[^"]+"', re.M)
bad = []
for root, _, files in os.walk(src):
    for f in files:
        if not f.endswith((".h", ".cc", ".cu", ".hpp")):
            continue
        path = os.path.join(root, f)
        rel = os.path.relpath(path, src)
        folder = rel.split(os.sep)[0]
        if folder not in LAYERS and folder not in SIDE:
            bad.append(f"{rel}: folder '{folder}' has no floor in check_layers.py")
            continue
        for m in include.finditer(open(path, encoding="utf-8").read()):
            target = m.group(1)
            if target == folder or target == "hicoll":
                continue
            if folder in SIDE:
                ok = target in SIDE[folder]
            else:
                ok = target in LAYERS and LAYERS.index(target) < LAYERS.index(folder)
            if not ok:
                bad.append(f'{rel}: includes "{m.group(0).split(chr(34))[1]}" from a floor above (or beside) it')
for b in bad:
    print(b)
print(f"check_layers: {'FAIL' if bad else 'ok'} ({len(bad)} upward includes)")
sys.exit(1 if bad else 0)
