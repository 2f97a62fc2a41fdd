#include "data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace train_gpt {

namespace fs = std::filesystem;

static std::vector<uint8_t> readAll(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read the corpus file " + p.string());
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::vector<uint8_t> loadCorpus(const std::string& path, std::string* description) {
  if (!path.empty()) {
    auto data = readAll(path);
    *description = path;
    return data;
  }
  const fs::path dir = "/usr/share/games/fortunes";
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && !e.path().has_extension()) files.push_back(e.path());  // not .dat/.u8
  if (files.empty())
    throw std::runtime_error("no corpus: " + dir.string() +
                             " has no fortune files (apt-get install fortunes-min) and --data "
                             "was not given");
  std::sort(files.begin(), files.end());
  std::vector<uint8_t> data;
  *description = "";
  for (const auto& f : files) {
    auto part = readAll(f);
    data.insert(data.end(), part.begin(), part.end());
    *description += (description->empty() ? "" : ",") + f.string();
  }
  return data;
}

static uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::vector<size_t> batchStarts(uint64_t seed, long step, int micro, int batch, size_t corpus_len, int ctx) {
  if (corpus_len < static_cast<size_t>(ctx) + 2)
    throw std::runtime_error("the corpus has " + std::to_string(corpus_len) +
                             " bytes, fewer than --ctx + 2 = " + std::to_string(ctx + 2));
  uint64_t state = seed ^ (static_cast<uint64_t>(step) << 20) ^ (static_cast<uint64_t>(micro) << 8);
  splitmix64(state);
  std::vector<size_t> starts(batch);
  const size_t range = corpus_len - ctx - 1;  // the target of the last position exists
  for (auto& s : starts) s = splitmix64(state) % range;
  return starts;
}

}  // namespace train_gpt
