// Byte-level corpus and the global batch of each step (identical at every world size).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace train_gpt {

// Reads `path`, or when empty the text files of the Debian fortunes packages
// (/usr/share/games/fortunes). Throws std::runtime_error naming what is missing.
std::vector<uint8_t> loadCorpus(const std::string& path, std::string* description);

// Start offsets of the `batch` sequences of micro-batch `micro` of step `step` (1-based):
// a pure function of (seed, step, micro), so a resumed run sees the same data.
std::vector<size_t> batchStarts(uint64_t seed, long step, int micro, int batch, size_t corpus_len, int ctx);

}  // namespace train_gpt
