// Sharded checkpoints. Layout of a checkpoint directory:
//   meta.json              degree, world, layer state, every unit and parameter with its
//                          placement, and the caller's extra JSON; written last (its presence
//                          marks a complete checkpoint)
//   shard-P-of-D.bin       partition rank P's fp32 shards, unit after unit: master, exp_avg,
//                          exp_avg_sq (shard elements each, padding included)
//   persistent.bin         the replicated parameters: master, exp_avg, exp_avg_sq
// Because a parameter's position in its unit's flat buffer does not depend on the degree,
// a reader at any degree or world size finds each element by (unit, param, index).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "sharded/internal.h"

namespace hicoll::sharded {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "hicoll-sharded/1";

std::string shardFile(int part, int degree) {
  return "shard-" + std::to_string(part) + "-of-" + std::to_string(degree) + ".bin";
}

// Writes `pieces` (pointer, bytes) to path through a temporary file and a rename, so a reader
// never sees a half-written file under the final name.
void writeFile(const fs::path& path, const std::vector<std::pair<const void*, size_t>>& pieces) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error("cannot create " + tmp.string() + ": " + std::strerror(errno));
    for (const auto& [p, n] : pieces)
      if (n) f.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    f.close();
    if (!f) throw Error("writing " + tmp.string() + " failed (disk full?)");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw Error("cannot rename " + tmp.string() + " to " + path.string() + ": " + ec.message());
}

class Fd {
 public:
  explicit Fd(const fs::path& p) : path_(p.string()), fd_(::open(path_.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) throw Error("cannot open " + path_ + ": " + std::strerror(errno));
  }
  ~Fd() { ::close(fd_); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  void readFloats(size_t float_offset, float* dst, size_t n) const {
    char* out = reinterpret_cast<char*>(dst);
    size_t left = n * 4;
    off_t at = static_cast<off_t>(float_offset * 4);
    while (left) {
      const ssize_t r = ::pread(fd_, out, left, at);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        throw Error(path_ + " is too short or unreadable: " + std::to_string(n) + " floats wanted at float offset " +
                    std::to_string(float_offset) + (r < 0 ? std::string(": ") + std::strerror(errno) : std::string()));
      out += r;
      left -= static_cast<size_t>(r);
      at += r;
    }
  }

 private:
  std::string path_;
  int fd_;
};

// The layout a checkpoint was written with, and reads by (unit, param, array, index).
class StoredLayout {
 public:
  StoredLayout(const fs::path& dir, const json& meta) : dir_(dir), meta_(meta) {
    degree_ = meta.at("degree").get<int>();
    persistent_ = meta.at("persistent_numel").get<size_t>();
    size_t off = 0;
    for (const json& u : meta.at("units")) {
      shard_.push_back(u.at("shard").get<size_t>());
      unit_off_.push_back(off);
      off += 3 * shard_.back();
    }
  }

  // Elements [a, a+n) of parameter p of unit u; array k: 0 master, 1 exp_avg, 2 exp_avg_sq.
  void read(size_t u, size_t p, int k, size_t a, size_t n, float* dst) {
    const json& pm = meta_.at("units").at(u).at("params").at(p);
    const size_t offset = pm.at("offset").get<size_t>();
    if (pm.at("persistent").get<bool>()) {
      file("persistent.bin").readFloats(k * persistent_ + offset + a, dst, n);
      return;
    }
    size_t idx = offset + a;
    const size_t shard = shard_.at(u);
    while (n) {
      const int part = static_cast<int>(idx / shard);
      const size_t within = idx % shard;
      const size_t c = std::min(n, shard - within);
      file(shardFile(part, degree_)).readFloats(unit_off_[u] + k * shard + within, dst, c);
      dst += c;
      idx += c;
      n -= c;
    }
  }

 private:
  const Fd& file(const std::string& name) {
    auto it = files_.find(name);
    if (it == files_.end()) it = files_.emplace(name, std::make_unique<Fd>(dir_ / name)).first;
    return *it->second;
  }

  fs::path dir_;
  const json& meta_;
  int degree_ = 1;
  size_t persistent_ = 0;
  std::vector<size_t> shard_, unit_off_;
  std::map<std::string, std::unique_ptr<Fd>> files_;
};

json readMeta(const fs::path& dir) {
  const fs::path p = dir / "meta.json";
  std::ifstream f(p);
  if (!f) throw Error("no checkpoint at " + dir.string() + " (" + p.string() + " is missing)");
  json meta;
  try {
    f >> meta;
  } catch (const std::exception& e) {
    throw Error(p.string() + " is not valid JSON: " + e.what());
  }
  if (meta.value("format", "") != kFormat)
    throw Error(p.string() + " has format '" + meta.value("format", "") + "', expected '" + kFormat + "'");
  return meta;
}

// The stored units and parameters must be the model's, in the same order.
void checkMatches(const json& meta, const std::vector<UnitSpec>& specs) {
  const json& units = meta.at("units");
  if (units.size() != specs.size())
    throw Error("the checkpoint has " + std::to_string(units.size()) + " units, the model " +
                std::to_string(specs.size()));
  for (size_t u = 0; u < specs.size(); ++u) {
    const json& ju = units[u];
    const std::string where = "unit " + std::to_string(u) + " '" + specs[u].name + "'";
    if (ju.at("name").get<std::string>() != specs[u].name)
      throw Error(where + " is called '" + ju.at("name").get<std::string>() + "' in the checkpoint");
    const json& ps = ju.at("params");
    if (ps.size() != specs[u].params.size())
      throw Error(where + " has " + std::to_string(ps.size()) + " parameters in the checkpoint, " +
                  std::to_string(specs[u].params.size()) + " in the model");
    for (size_t p = 0; p < ps.size(); ++p) {
      const ParamSpec& sp = specs[u].params[p];
      if (ps[p].at("name").get<std::string>() != sp.name || ps[p].at("numel").get<size_t>() != sp.numel())
        throw Error(where + " parameter " + std::to_string(p) + ": checkpoint has '" +
                    ps[p].at("name").get<std::string>() + "' with " + std::to_string(ps[p].at("numel").get<size_t>()) +
                    " elements, the model '" + sp.name + "' with " + std::to_string(sp.numel()));
    }
  }
}

}  // namespace

void ShardedParams::save(const std::string& dir_str, const std::string& extra_json) {
  Impl& im = *impl_;
  im.queue->waitAll();
  if (im.micro != 0)
    throw Error("save(): gradients of " + std::to_string(im.micro) +
                " micro-batches are "
                "pending; save after step()");
  json extra;
  try {
    extra = json::parse(extra_json);
  } catch (const std::exception& e) {
    throw Error(std::string("save(): extra_json is not valid JSON: ") + e.what());
  }
  if (!extra.is_object()) throw Error("save(): extra_json must be a JSON object");
  const fs::path dir(dir_str);

  std::string err;
  if (im.rank == 0) {
    try {
      fs::create_directories(dir);
      fs::remove(dir / "meta.json");                       // incomplete until the new one is written
      for (const auto& e : fs::directory_iterator(dir)) {  // shards of another degree
        const std::string n = e.path().filename().string();
        if (n.rfind("shard-", 0) == 0) fs::remove(e.path());
      }
    } catch (const std::exception& e) {
      err = bareMessage(e);
    }
  }
  im.agreeOrThrow(err, "save(): preparing " + dir.string());

  try {
    if (im.rrank == 0) {  // one replica of each shard is enough
      std::vector<std::pair<const void*, size_t>> pieces;
      for (const UnitState& s : im.units)
        for (const Buffer* b : {&s.master, &s.exp_avg, &s.exp_avg_sq}) pieces.emplace_back(b->data(), b->size());
      writeFile(dir / shardFile(im.prank, im.degree), pieces);
    }
    if (im.rank == 0)
      writeFile(dir / "persistent.bin", {{im.p_master.data(), im.p_master.size()},
                                         {im.p_avg.data(), im.p_avg.size()},
                                         {im.p_avg_sq.data(), im.p_avg_sq.size()}});
  } catch (const std::exception& e) {
    err = bareMessage(e);
  }
  im.agreeOrThrow(err, "save(): writing shards to " + dir.string());

  if (im.rank == 0) {
    try {
      json meta;
      meta["format"] = kFormat;
      meta["world"] = im.world;
      meta["degree"] = im.degree;
      meta["compute_dtype"] = dtypeName(im.opt.compute_dtype);
      meta["adam_step"] = im.adam_step;
      meta["loss_scale"] = im.loss_scale;
      meta["good_steps"] = im.good_steps;
      meta["persistent_numel"] = im.pnumel;
      json units = json::array();
      for (size_t u = 0; u < im.plans.size(); ++u) {
        const UnitPlan& plan = im.plans[u];
        json ps = json::array();
        for (size_t p = 0; p < plan.params.size(); ++p)
          ps.push_back({{"name", im.specs[u].params[p].name},
                        {"shape", im.specs[u].params[p].shape},
                        {"numel", plan.params[p].numel},
                        {"persistent", plan.params[p].persistent},
                        {"offset", plan.params[p].offset}});
        units.push_back({{"name", plan.name},
                         {"numel", plan.shard.numel},
                         {"padded", plan.shard.padded},
                         {"shard", plan.shard.shard},
                         {"params", ps}});
      }
      meta["units"] = units;
      meta["extra"] = extra;
      const std::string text = meta.dump(1);
      writeFile(dir / "meta.json", {{text.data(), text.size()}});
    } catch (const std::exception& e) {
      err = bareMessage(e);
    }
  }
  im.agreeOrThrow(err, "save(): writing " + (dir / "meta.json").string());
}

std::string ShardedParams::load(const std::string& dir_str) {
  Impl& im = *impl_;
  im.queue->waitAll();
  for (size_t u = 0; u < im.units.size(); ++u)
    if (im.units[u].live != UnitState::Live::Free)
      throw Error("load(): unit '" + im.plans[u].name + "' is gathered; reshard it first");
  const fs::path dir(dir_str);
  std::string err;
  json meta;
  try {
    meta = readMeta(dir);
    checkMatches(meta, im.specs);
  } catch (const std::exception& e) {
    err = bareMessage(e);
  }
  im.agreeOrThrow(err, "load(" + dir.string() + ")");

  try {
    StoredLayout stored(dir, meta);
    for (Buffer* b : {&im.p_master, &im.p_avg, &im.p_avg_sq})
      if (*b) std::memset(b->data(), 0, b->size());
    Buffer* parr[3] = {&im.p_master, &im.p_avg, &im.p_avg_sq};
    for (size_t u = 0; u < im.plans.size(); ++u) {
      UnitState& s = im.units[u];
      Buffer* arr[3] = {&s.master, &s.exp_avg, &s.exp_avg_sq};
      for (Buffer* b : arr)
        if (*b) std::memset(b->data(), 0, b->size());
      const UnitPlan& plan = im.plans[u];
      for (size_t p = 0; p < plan.params.size(); ++p) {
        const ParamPlacement& pl = plan.params[p];
        for (int k = 0; k < 3; ++k) {
          if (pl.persistent) {
            stored.read(u, p, k, 0, pl.numel, parr[k]->f32() + pl.offset);
            continue;
          }
          const ShardInfo::Overlap ov = plan.shard.overlap(pl.offset, pl.offset + pl.numel);
          if (ov.count) stored.read(u, p, k, ov.flat - pl.offset, ov.count, arr[k]->f32() + ov.local);
        }
      }
    }
  } catch (const std::exception& e) {
    err = bareMessage(e);
  }
  im.agreeOrThrow(err, "load(): reading the shards of " + dir.string());

  im.adam_step = meta.at("adam_step").get<long long>();
  im.good_steps = meta.at("good_steps").get<int>();
  im.loss_scale = im.opt.compute_dtype == DType::Float16 ? meta.at("loss_scale").get<double>() : 1.0;
  if (im.opt.compute_dtype == DType::Float16 && meta.at("compute_dtype") != "fp16")
    im.loss_scale = im.opt.initial_loss_scale;  // switching into fp16: start a fresh scale
  im.micro = 0;
  im.synced = false;
  im.zeroGrads();
  im.refreshCompute();
  return meta.at("extra").dump();
}

}  // namespace hicoll::sharded
