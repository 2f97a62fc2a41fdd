"""Every hcConfig_t field reaches torch users: hicoll.h's struct is read here and each field
must be a knob of the knob table (src/, HICOLL_KNOBS) with the variable hicoll.h names, a key of
hicoll.torch.Options, of the plugin's Options -> hcConfig_t conversion (csrc/backend.cc), of
config()'s dict (csrc/bindings.cc) and of plugins/torch/README.md's list, under one key and
in the map of its type. A field added to hcConfig_t and missed in one of them fails here.

Reads the sources only: no build, no torch import."""
from __future__ import annotations

import ast
import glob
import os
import re

import pytest

from harness import REPO

PLUGIN = os.path.join(REPO, "plugins", "torch")
HEADER_FIELDS = ("size", "magic", "version")  # the struct's own bookkeeping, not settings
TYPES = {"const char*": "text", "long long": "int"}


def read(*parts: str) -> str:
    with open(os.path.join(*parts), encoding="utf-8") as f:
        return f.read()


def strip_c_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


def config_fields() -> dict[str, tuple[str, str | None]]:
    """hcConfig_t's settings: field -> (text | int, the variable its comment names)."""
    src = read(REPO, "include", "hicoll", "hicoll.h")
    end = re.search(r"\}\s*hcConfig_t;", src)
    assert end, "hcConfig_t not found in include/hicoll/hicoll.h"
    begin = src.rfind("typedef struct {", 0, end.start())
    fields = {}
    for line in src[begin + len("typedef struct {"):end.start()].splitlines():
        d = re.match(r"\s*(const char\*|long long|size_t|unsigned int)\s+(\w+);\s*(?:/\*(.*?)\*/)?",
                     line)
        if not d:
            assert not line.strip() or line.strip().startswith(("/*", "*")), \
                f"hicoll.h: hcConfig_t line not understood by this test: {line!r}"
            continue
        ctype, name, comment = d.groups()
        if name in HEADER_FIELDS:
            continue
        assert ctype in TYPES, f"hcConfig_t.{name}: type {ctype} has no Options conversion"
        var = re.match(r"\s*([A-Z][A-Z0-9_]+)\b", comment or "")
        fields[name] = (TYPES[ctype], var.group(1) if var else None)
    assert len(fields) >= 10, fields
    return fields


def knob_table() -> dict[str, str]:
    """The knob table: knob id -> variable (wherever under src/ it lives)."""
    for path in sorted(glob.glob(os.path.join(REPO, "src", "**", "*.h"), recursive=True)):
        text = read(path)
        if "#define HICOLL_KNOBS(X)" in text:
            return dict(re.findall(r"X\((\w+),\s*\"(\w+)\"", text))
    pytest.fail("no header under src/ defines HICOLL_KNOBS(X)")


def pairs(block: str, ref: str) -> dict[str, str]:
    """{"key", <ref>field} pairs of a C++ initializer list: field -> key."""
    found = re.findall(r"\{\s*\"(\w+)\"\s*,\s*" + re.escape(ref) + r"(\w+)\s*\}", block)
    return {field: key for key, field in found}


def backend_conversion() -> dict[str, tuple[str, str]]:
    """csrc/backend.cc hcConfigOf: field -> (text | int, Options key)."""
    src = strip_c_comments(read(PLUGIN, "hicoll", "csrc", "backend.cc"))
    body = re.search(r"hcConfig_t hcConfigOf\(.*?\n\}", src, re.S)
    assert body, "hcConfigOf not found in csrc/backend.cc"
    out = {}
    for kind, ctype in (("text", r"const char\*\*"), ("int", r"long long\*")):
        m = re.search(r"std::map<std::string,\s*" + ctype + r">\s*\w+\s*=\s*\{(.*?)\};",
                      body.group(0), re.S)
        assert m, f"hcConfigOf: no map of {ctype} fields"
        for field, key in pairs(m.group(1), "&c.").items():
            out[field] = (kind, key)
    return out


def bindings_config() -> dict[str, tuple[str, str]]:
    """csrc/bindings.cc .def("config", ...): field -> (text | int, dict key)."""
    src = strip_c_comments(read(PLUGIN, "hicoll", "csrc", "bindings.cc"))
    m = re.search(r"\.def\(\s*\"config\",(.*?)\}\s*,\s*\"", src, re.S)
    assert m, 'no .def("config", ...) in csrc/bindings.cc'
    out = {}
    for kind, ctype in (("text", "const char*"), ("int", "long long")):
        for loop in re.findall(r"std::pair<const char\*,\s*" + re.escape(ctype) + r">(.*?)\)\s*\n",
                               m.group(1), re.S):
            for field, key in pairs(loop, "c.").items():
                out[field] = (kind, key)
    return out


def options_keys() -> tuple[list[str], list[str]]:
    """hicoll/torch.py class Options: FIELDS and __init__'s keyword arguments."""
    tree = ast.parse(read(PLUGIN, "hicoll", "torch.py"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Options")
    fields, kwargs = None, None
    for node in cls.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "FIELDS" for t in node.targets):
            fields = list(ast.literal_eval(node.value))
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            kwargs = [a.arg for a in node.args.kwonlyargs]
    assert fields is not None and kwargs is not None, "Options.FIELDS / __init__ not found"
    return fields, kwargs


def readme_keys() -> set[str]:
    text = read(PLUGIN, "README.md")
    m = re.search(r"## Per-group options\n(.*?)\n## ", text, re.S)
    assert m, "plugins/torch/README.md: no 'Per-group options' section"
    return set(re.findall(r"`(\w+)`", m.group(1)))


FIELDS = config_fields()


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_field_is_everywhere(field):
    kind, var = FIELDS[field]
    conv, cfg = backend_conversion(), bindings_config()
    opt_fields, opt_kwargs = options_keys()
    missing = []
    if field != "name":  # the communicator's label: not a variable
        knobs = {v: k for k, v in knob_table().items()}
        if var is None:
            missing.append("hicoll.h: a comment naming its variable (/* HICOLL_... */)")
        elif var not in knobs:
            missing.append(f"the knob table ({var})")
        elif knobs[var].lower() != field.lower():
            missing.append(f"the knob table names {var}'s knob {knobs[var]}, not {field}")
    if field not in conv:
        missing.append("csrc/backend.cc hcConfigOf (Options -> hcConfig_t)")
    if field not in cfg:
        missing.append("csrc/bindings.cc config()")
    key = (conv.get(field) or cfg.get(field) or (None, None))[1]
    if field in conv and field in cfg and conv[field] != cfg[field]:
        missing.append(f"backend.cc has {conv[field]}, bindings.cc {cfg[field]}")
    for where, got in (("backend.cc", conv.get(field)), ("bindings.cc", cfg.get(field))):
        if got and got[0] != kind:
            missing.append(f"{where} converts it as {got[0]}, hicoll.h declares {kind}")
    if key is not None:
        if key not in opt_fields:
            missing.append(f"hicoll.torch.Options.FIELDS ({key})")
        if key not in opt_kwargs:
            missing.append(f"hicoll.torch.Options.__init__ ({key}=None)")
        if key not in readme_keys():
            missing.append(f"plugins/torch/README.md 'Per-group options' (`{key}`)")
    assert not missing, f"hcConfig_t.{field} is missing from: " + "; ".join(missing)


def test_no_option_without_a_field():
    conv, cfg = backend_conversion(), bindings_config()
    opt_fields, opt_kwargs = options_keys()
    keys = {k for _, k in conv.values()}
    assert set(conv) <= set(FIELDS), f"backend.cc converts fields hicoll.h lacks: {set(conv) - set(FIELDS)}"
    assert set(cfg) <= set(FIELDS), f"bindings.cc reads fields hicoll.h lacks: {set(cfg) - set(FIELDS)}"
    assert set(opt_fields) == set(opt_kwargs), (opt_fields, opt_kwargs)
    assert set(opt_fields) <= keys, f"Options fields backend.cc rejects: {set(opt_fields) - keys}"
