// A small GPT-style decoder written as functions of explicit parameter tensors, so the same
// code runs on the sharded layer's gathered buffers and on ordinary leaf tensors.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "hicoll/sharded.hpp"

namespace train_gpt {

struct GptConfig {
  int vocab = 256;  // byte-level tokens
  int ctx = 64;     // sequence length
  int layers = 4;
  int heads = 4;
  int width = 64;  // embedding size; a multiple of heads
};

// Units in execution order: "embed", "block0".."block{L-1}", "head".
std::vector<hicoll::sharded::UnitSpec> gptUnits(const GptConfig& c);

// Deterministic initial value of parameter p of unit u, from the seed alone (GPT-2 scheme:
// N(0, 0.02) matrices, residual projections scaled by 1/sqrt(2L), zero biases, unit norms).
void initParam(const GptConfig& c, const std::vector<hicoll::sharded::UnitSpec>& units, int u, int p, uint64_t seed,
               float* out, size_t n);

// P holds the unit's parameters in spec order.
torch::Tensor embedForward(const std::vector<torch::Tensor>& P, const torch::Tensor& tokens);
torch::Tensor blockForward(const std::vector<torch::Tensor>& P, const torch::Tensor& x, int heads);
// Mean cross-entropy over all positions, computed in fp32.
torch::Tensor headLoss(const std::vector<torch::Tensor>& P, const torch::Tensor& x, const torch::Tensor& targets);

}  // namespace train_gpt
