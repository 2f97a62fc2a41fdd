// hicoll_info: every configuration knob with its current value (like ucc_info -caf), and the
// generator of env.md (--markdown).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/config.h"
#include "base/error.h"
#include "hicoll/hicoll.h"

using namespace hicoll;

static void markdown() {
  std::printf("# hicoll environment variables\n\n");
  std::printf("Generated from `src/base/config_table.h` by `hicoll_info --markdown`; a test checks that\n"
              "this file and the table agree. Every value is parsed strictly: an invalid value fails\n"
              "communicator creation with a message naming the variable. Variables marked \"same on\n"
              "every rank\" are compared across ranks when a communicator is created: a difference fails\n"
              "creation on every rank, naming the variable and the ranks' values.\n\n");
  std::printf("| Variable | Type | Default | Range | Same on every rank | Description |\n|---|---|---|---|---|---|\n");
  for (const KnobInfo& k : knobTable()) {
    std::string type = knobTypeName(k.type);
    if (k.type == KnobType::Enum || k.type == KnobType::List) {
      std::string allowed = k.allowed;
      for (char& c : allowed)
        if (c == '|') c = ',';
      type += std::string(" `") + allowed + "`";
    }
    std::string range = "";
    if (k.type == KnobType::Int || k.type == KnobType::Size || k.type == KnobType::Size8K)
      range = std::to_string(k.min) + " .. " + std::to_string(k.max);
    std::printf("| `%s` | %s | `%s` | %s | %s | %s |\n", k.name, type.c_str(), *k.def ? k.def : "(empty)",
                range.c_str(), k.scope == KnobScope::Agree ? "yes" : "", k.doc);
  }
  std::printf("\n## Build-time variables\n\n"
              "Read when the torch plugin is built (`pip install`: plugins/torch/CMakeLists.txt and "
              "plugins/torch/cmake/torch_flags.py), not by the library:\n\n"
              "| Variable | Meaning |\n|---|---|\n"
              "| `HICOLL_BUILD_DIR` | a CMake build directory of this repository: libhicoll.so is taken from it |\n"
              "| `HICOLL_PREFIX` | an installed prefix (include/hicoll, lib/libhicoll.so) instead |\n"
              "| `HICOLL_PLUGIN_CUDA` | 0: build the plugin without CUDA; 1: a missing CUDA toolkit is an error; "
              "auto (unset): CUDA when torch has it and a matching toolkit is usable |\n"
              "\nThe build derives CMake variables of its own from the interpreter's torch (torch_flags.py; not "
              "for users to set): `HICOLL_TORCH_VERSION`, `HICOLL_TORCH_INCLUDE_DIRS`, `HICOLL_TORCH_LIBRARY_DIR`, "
              "`HICOLL_TORCH_LIBRARIES`, `HICOLL_TORCH_CXX11_ABI`, `HICOLL_TORCH_CXX_STANDARD`, "
              "`HICOLL_PLUGIN_WITH_CUDA`, `HICOLL_PLUGIN_CUDA_WHY`, `HICOLL_PLUGIN_CUDA_HOME`.\n");
  std::printf("\nThe sharded-parameter layer's knobs (`sharded_data_parallel_degree`, `sdp_*`) are\n"
              "fields of `hicoll::sharded::Options` and flags of the training examples, not\n"
              "environment variables.\n");
}

int main(int argc, char** argv) {
  std::string arg = argc > 1 ? argv[1] : "";
  if (arg == "--markdown") {
    markdown();
    return 0;
  }
  if (arg == "-h" || arg == "--help") {
    std::printf("usage: hicoll_info [--markdown]\n  prints every knob, its current value and where it came from\n");
    return 0;
  }
  int version = 0;
  hcGetVersion(&version);
  std::printf("# hicoll %d.%d.%d\n", version / 10000, version / 100 % 100, version % 100);
  int rc = 0;
  for (const KnobInfo& k : knobTable()) {
    const char* env = std::getenv(k.name);
    std::string value = env ? env : k.def;
    std::string status = env ? "set" : "default";
    try {
      Config::from([&](const char* name) -> const char* { return std::string(name) == k.name ? env : nullptr; });
    } catch (const Error& e) {
      status = std::string("INVALID: ") + e.what();
      rc = 1;
    }
    std::printf("%s=%s  # %s\n", k.name, value.c_str(), status.c_str());
  }
  return rc;
}
