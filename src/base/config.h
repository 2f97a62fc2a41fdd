// Strictly parsed configuration read once per communicator from the knob table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/config_table.h"
#include "hicoll/hicoll.h"

namespace hicoll {

enum class KnobType { String, Int, Size, Size8K, Bool, Enum, List };

enum class KnobScope { Local, Agree };

enum class Knob {
#define HC_KNOB_ENUM(id, name, type, def, allowed, lo, hi, agree, doc) id,
  HICOLL_KNOBS(HC_KNOB_ENUM)
#undef HC_KNOB_ENUM
      Count
};

struct KnobInfo {
  Knob id;
  const char* name;
  KnobType type;
  const char* def;
  const char* allowed;
  int64_t min, max;  // Int and Size knobs: the accepted range
  KnobScope scope;   // Agree: every rank must have the same value
  const char* doc;
};

const std::vector<KnobInfo>& knobTable();
const char* knobTypeName(KnobType t);

class Config {
 public:
  // Reads every knob from the environment; throws hcInvalidArgument naming the variable and
  // the value on anything that does not parse.
  static Config fromEnv();
  // Same, with an explicit lookup (tests).
  template <class Lookup>
  static Config from(Lookup&& getenv_fn);

  // This configuration with a caller's hcConfig_t on top: the fields set (within its size)
  // replace their knobs, parsed like the variables. Throws hcInvalidArgument naming the field.
  Config withOverrides(const hcConfig_t* config) const;
  // Every knob field of *out from this configuration (strings point into it; name untouched).
  void fill(hcConfig_t* out) const;

  const std::string& str(Knob k) const { return raw_[idx(k)]; }
  int64_t num(Knob k) const { return num_[idx(k)]; }
  bool flag(Knob k) const { return num_[idx(k)] != 0; }
  // For List knobs: is word in the list ("all" matches every word).
  bool listHas(Knob k, const std::string& word) const;
  bool isDefault(Knob k) const { return from_default_[idx(k)]; }
  // HICOLL_FORCE_FALLBACK as a bit per hcColl_t, and HICOLL_ALGO=ring: parsed once, read per call.
  uint32_t forceFallbackMask() const { return force_fallback_mask_; }
  bool algoRing() const { return algo_ring_; }
  bool algoAuto() const { return algo_auto_; }
  // The largest message a net chunk may be: HICOLL_NET_CHUNK_SIZE, or under HICOLL_ALGO=auto
  // with that knob at its default up to HICOLL_CHUNK_SIZE (the model may raise the chunk:
  // plan/cost_model.h, modelChunking).
  size_t netChunkCap() const;
  // Values that must agree across ranks (KnobScope::Agree), hashed; 0 for the others. Ranks
  // compare them per knob, so a difference names the knob.
  std::vector<uint64_t> consistencyHashes() const;

 private:
  static size_t idx(Knob k) { return static_cast<size_t>(k); }
  void set(const KnobInfo& info, const char* value);
  void derive();
  uint32_t force_fallback_mask_ = 0;
  bool algo_ring_ = false;
  bool algo_auto_ = false;
  std::vector<std::string> raw_ = std::vector<std::string>(static_cast<size_t>(Knob::Count));
  std::vector<int64_t> num_ = std::vector<int64_t>(static_cast<size_t>(Knob::Count));
  std::vector<bool> from_default_ = std::vector<bool>(static_cast<size_t>(Knob::Count), true);
};

template <class Lookup>
Config Config::from(Lookup&& getenv_fn) {
  Config c;
  for (const KnobInfo& k : knobTable()) {
    const char* v = getenv_fn(k.name);
    c.set(k, v ? v : k.def);
    c.from_default_[idx(k.id)] = (v == nullptr);
  }
  c.derive();
  return c;
}

// Parse helpers, exposed for tests and agbench (sizes with K/M/G binary suffixes).
int64_t parseInt(const std::string& name, const std::string& value);
int64_t parseSize(const std::string& name, const std::string& value);

}  // namespace hicoll
