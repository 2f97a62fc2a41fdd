#include "base/machine_figures.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"

namespace hicoll {
namespace {

struct Field {
  const char* name;
  double MachineFigures::*member;
  bool optional = false;  // added after version 1's first files: absent keeps the default
};
constexpr Field kFields[] = {
    {"call_s", &MachineFigures::call_s},
    {"shm_alpha_s", &MachineFigures::shm_alpha_s},
    {"copy_Bps", &MachineFigures::copy_Bps},
    {"reduce_Bps", &MachineFigures::reduce_Bps},
    {"net_alpha_s", &MachineFigures::net_alpha_s},
    {"net_Bps", &MachineFigures::net_Bps},
    {"net_cpu_s_per_B", &MachineFigures::net_cpu_s_per_B},
    {"net_msg_s", &MachineFigures::net_msg_s},
    {"quant_Bps", &MachineFigures::quant_Bps, true},
};
// Bandwidths divide: they must be positive.
bool isRate(const Field& f) { return std::string(f.name).find("_Bps") != std::string::npos; }

}  // namespace

MachineFigures defaultFigures(const std::string& provider) {
  MachineFigures m;
  if (provider.find("efa") != std::string::npos) {
    // RDMA: no kernel copies; one 100 Gbit/s NIC's worth per node (instances have several).
    m.source = "built-in defaults (efa)";
    m.net_alpha_s = 15e-6;
    m.net_Bps = 12.5e9;
    m.net_msg_s = 2e-6;
  } else {
    m.source = "built-in defaults (" + provider + ")";
    m.net_cpu_s_per_B = 0.5e-9;  // the kernel's copies on each side
  }
  return m;
}

MachineFigures parseFigures(const std::string& text, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    HC_THROW(hcInvalidArgument, "{}: not JSON ({})", what, e.what());
  }
  HC_CHECK(j.is_object(), hcInvalidArgument, "{}: not a JSON object", what);
  const int version = j.value("version", 0);
  HC_CHECK(version == 1, hcInvalidArgument, "{}: version {} (this library reads version 1)", what, version);
  MachineFigures m;
  m.source = what;
  for (const Field& f : kFields) {
    auto it = j.find(f.name);
    if (it == j.end() && f.optional) continue;
    HC_CHECK(it != j.end(), hcInvalidArgument, "{}: no field '{}'", what, f.name);
    HC_CHECK(it->is_number(), hcInvalidArgument, "{}: field '{}' is not a number", what, f.name);
    const double v = it->get<double>();
    HC_CHECK(v >= 0 && v < 1e300 && (!isRate(f) || v > 0), hcInvalidArgument, "{}: field '{}' = {} is out of range",
             what, f.name, v);
    m.*f.member = v;
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = it.key() == "version" || it.key() == "note";
    for (const Field& f : kFields) known = known || it.key() == f.name;
    HC_CHECK(known, hcInvalidArgument, "{}: unknown field '{}'", what, it.key());
  }
  return m;
}

MachineFigures loadFigures(const std::string& path, std::string* text) {
  std::ifstream in(path);
  HC_CHECK(in, hcInvalidArgument, "HICOLL_MODEL_FILE={}: cannot be read", path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (text) *text = ss.str();
  return parseFigures(ss.str(), "HICOLL_MODEL_FILE=" + path);
}

std::string figuresJson(const MachineFigures& m, const std::string& note) {
  nlohmann::ordered_json j;
  j["version"] = 1;
  if (!note.empty()) j["note"] = note;
  for (const Field& f : kFields) j[f.name] = m.*f.member;
  return j.dump(2) + "\n";
}

}  // namespace hicoll
