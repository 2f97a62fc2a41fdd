#include "base/config.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "base/coll.h"
#include "base/error.h"

namespace hicoll {
namespace {

std::vector<std::string> splitWords(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// FNV-1a: the same value in every process and build (std::hash promises neither).
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

const std::vector<KnobInfo>& knobTable() {
  static const std::vector<KnobInfo> table = {
#define HC_KNOB_INFO(id, name, type, def, allowed, lo, hi, agree, doc) \
  {Knob::id, name, KnobType::type, def, allowed, lo, hi, KnobScope::agree, doc},
      HICOLL_KNOBS(HC_KNOB_INFO)
#undef HC_KNOB_INFO
  };
  return table;
}

const char* knobTypeName(KnobType t) {
  switch (t) {
    case KnobType::String: return "string";
    case KnobType::Int: return "integer";
    case KnobType::Size: return "bytes";
    case KnobType::Size8K: return "bytes, multiple of 8192";
    case KnobType::Bool: return "bool";
    case KnobType::Enum: return "one of";
    case KnobType::List: return "comma-separated list of";
  }
  return "?";
}

int64_t parseInt(const std::string& name, const std::string& value) {
  std::string v = trim(value);
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE)
    HC_THROW(hcInvalidArgument, "{}='{}' is not an integer", name, value);
  return x;
}

int64_t parseSize(const std::string& name, const std::string& value) {
  std::string v = trim(value);
  size_t digits = 0;
  while (digits < v.size() && std::isdigit(static_cast<unsigned char>(v[digits]))) ++digits;
  if (digits == 0)
    HC_THROW(hcInvalidArgument, "{}='{}' is not a size in bytes (a non-negative integer, optionally with K, M or G)",
             name, value);
  std::string suffix = lower(v.substr(digits));
  int shift = 0;
  if (suffix.empty() || suffix == "b") shift = 0;
  else if (suffix == "k" || suffix == "kib") shift = 10;
  else if (suffix == "m" || suffix == "mib") shift = 20;
  else if (suffix == "g" || suffix == "gib") shift = 30;
  else HC_THROW(hcInvalidArgument, "{}='{}' has an unknown size suffix '{}' (use K, M or G)", name, value, suffix);
  errno = 0;
  unsigned long long x = std::strtoull(v.substr(0, digits).c_str(), nullptr, 10);
  if (errno == ERANGE || x > (static_cast<unsigned long long>(INT64_MAX) >> shift))
    HC_THROW(hcInvalidArgument, "{}='{}' is too large", name, value);
  return static_cast<int64_t>(x << shift);
}

void Config::set(const KnobInfo& k, const char* value) {
  std::string v = value;
  size_t i = idx(k.id);
  raw_[i] = v;
  num_[i] = 0;
  switch (k.type) {
    case KnobType::String: break;
    case KnobType::Int:
    case KnobType::Size:
      num_[i] = k.type == KnobType::Int ? parseInt(k.name, v) : parseSize(k.name, v);
      if (num_[i] < k.min || num_[i] > k.max)
        HC_THROW(hcInvalidArgument, "{}='{}' is outside the accepted range {} .. {}", k.name, value, k.min, k.max);
      break;
    case KnobType::Size8K:
      num_[i] = parseSize(k.name, v);
      if (num_[i] <= 0 || num_[i] % 8192 != 0)
        HC_THROW(hcInvalidArgument, "{}='{}' must be a positive multiple of 8192 bytes", k.name, value);
      if (num_[i] > k.max) HC_THROW(hcInvalidArgument, "{}='{}' is larger than {} bytes", k.name, value, k.max);
      break;
    case KnobType::Bool: {
      std::string l = lower(trim(v));
      if (l == "1" || l == "true" || l == "yes" || l == "on") num_[i] = 1;
      else if (l == "0" || l == "false" || l == "no" || l == "off" || l.empty()) num_[i] = 0;
      else HC_THROW(hcInvalidArgument, "{}='{}' is not a boolean (0/1/true/false)", k.name, value);
      break;
    }
    case KnobType::Enum: {
      std::string l = lower(trim(v));
      bool ok = false;
      for (const std::string& w : splitWords(k.allowed, '|'))
        if (lower(w) == l) {
          raw_[i] = w;
          ok = true;
        }
      if (!ok) HC_THROW(hcInvalidArgument, "{}='{}' is not one of {}", k.name, value, k.allowed);
      break;
    }
    case KnobType::List: {
      std::string norm;
      for (std::string w : splitWords(v, ',')) {
        w = lower(trim(w));
        if (w.empty()) continue;
        bool ok = false;
        for (const std::string& a : splitWords(k.allowed, '|')) ok = ok || a == w;
        if (!ok) HC_THROW(hcInvalidArgument, "{}='{}': '{}' is not one of {}", k.name, value, w, k.allowed);
        norm += (norm.empty() ? "" : ",") + w;
      }
      raw_[i] = norm;
      break;
    }
  }
}

bool Config::listHas(Knob k, const std::string& word) const {
  for (const std::string& w : splitWords(str(k), ','))
    if (w == word || w == "all") return true;
  return false;
}

size_t Config::netChunkCap() const {
  const int64_t net = num(Knob::NetChunkBytes);
  const bool model_chunk = algoAuto() && isDefault(Knob::NetChunkBytes);
  return static_cast<size_t>(model_chunk ? std::max(net, num(Knob::ChunkBytes)) : net);
}

void Config::derive() {
  force_fallback_mask_ = 0;
  for (int coll = 0; coll < hcNumColls; ++coll) {
    std::string name = lower(collName(static_cast<hcColl_t>(coll)));
    if (listHas(Knob::ForceFallback, name)) force_fallback_mask_ |= 1u << coll;
  }
  algo_ring_ = str(Knob::Algo) == "ring";
  algo_auto_ = str(Knob::Algo) == "auto";
}

namespace {

// hcConfig_t's knob fields.
struct Field {
  const char* name;
  Knob knob;
  size_t offset;
  bool text;
};
const Field kFields[] = {
    {"algo", Knob::Algo, offsetof(hcConfig_t, algo), true},
    {"forceFallback", Knob::ForceFallback, offsetof(hcConfig_t, forceFallback), true},
    {"debug", Knob::Debug, offsetof(hcConfig_t, debug), true},
    {"topoNode", Knob::TopoNode, offsetof(hcConfig_t, topoNode), true},
    {"timeoutMs", Knob::TimeoutMs, offsetof(hcConfig_t, timeoutMs), false},
    {"chunkBytes", Knob::ChunkBytes, offsetof(hcConfig_t, chunkBytes), false},
    {"netChunkBytes", Knob::NetChunkBytes, offsetof(hcConfig_t, netChunkBytes), false},
    {"netWindow", Knob::NetWindow, offsetof(hcConfig_t, netWindow), false},
    {"deviceChunkBytes", Knob::DeviceChunkBytes, offsetof(hcConfig_t, deviceChunkBytes), false},
    {"allreduceSmallBytes", Knob::AllReduceSmallBytes, offsetof(hcConfig_t, allreduceSmallBytes), false},
    {"scratchBytes", Knob::ScratchBytes, offsetof(hcConfig_t, scratchBytes), false},
    {"sortBytes", Knob::SortBytes, offsetof(hcConfig_t, sortBytes), false},
    {"quantMinNodes", Knob::QuantMinNodes, offsetof(hcConfig_t, quantMinNodes), false},
};

}  // namespace

Config Config::withOverrides(const hcConfig_t* config) const {
  Config c = *this;
  if (!config) return c;
  HC_CHECK(config->size >= offsetof(hcConfig_t, name) && config->magic == HC_CONFIG_MAGIC, hcInvalidArgument,
           "hcConfig_t: size {} / magic {:#x}: initialize it with HC_CONFIG_INITIALIZER", config->size, config->magic);
  // The header's version the caller was built with: hcConfig_t came with 0.2.0; a later one's
  // fields are unknown here (its size alone cannot say what they mean).
  constexpr unsigned kFirstConfigVersion = 200;
  HC_CHECK(config->version >= kFirstConfigVersion && config->version <= HICOLL_VERSION_CODE, hcInvalidArgument,
           "hcConfig_t.version is {} ({:#x}): this library ({}) reads versions {} to {}; initialize it with "
           "HC_CONFIG_INITIALIZER",
           config->version, config->version, HICOLL_VERSION_CODE, kFirstConfigVersion, HICOLL_VERSION_CODE);
  const char* base = reinterpret_cast<const char*>(config);
  for (const Field& f : kFields) {
    if (f.offset + (f.text ? sizeof(const char*) : sizeof(long long)) > config->size) continue;  // an older caller
    std::string value;
    if (f.text) {
      const char* v = nullptr;
      std::memcpy(&v, base + f.offset, sizeof v);
      if (!v) continue;
      value = v;
    } else {
      long long v = 0;
      std::memcpy(&v, base + f.offset, sizeof v);
      if (v == HC_CONFIG_UNDEF_INT) continue;
      value = std::to_string(v);
    }
    KnobInfo k = knobTable()[idx(f.knob)];
    const std::string field = std::string("hcConfig_t.") + f.name + " (" + k.name + ")";
    k.name = field.c_str();
    c.set(k, value.c_str());
    c.from_default_[idx(f.knob)] = false;
  }
  c.derive();
  return c;
}

void Config::fill(hcConfig_t* out) const {
  char* base = reinterpret_cast<char*>(out);
  for (const Field& f : kFields) {
    if (f.offset + (f.text ? sizeof(const char*) : sizeof(long long)) > out->size) continue;
    if (f.text) {
      const char* v = str(f.knob).c_str();
      std::memcpy(base + f.offset, &v, sizeof v);
    } else {
      const long long v = num(f.knob);
      std::memcpy(base + f.offset, &v, sizeof v);
    }
  }
}

Config Config::fromEnv() {
  return from([](const char* name) -> const char* { return std::getenv(name); });
}

std::vector<uint64_t> Config::consistencyHashes() const {
  std::vector<uint64_t> h;
  for (const KnobInfo& k : knobTable()) h.push_back(k.scope == KnobScope::Agree ? fnv1a(raw_[idx(k.id)]) : 0);
  return h;
}

}  // namespace hicoll
