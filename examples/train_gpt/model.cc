#include "model.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace train_gpt {

using hicoll::sharded::ParamSpec;
using hicoll::sharded::UnitSpec;

std::vector<UnitSpec> gptUnits(const GptConfig& c) {
  if (c.width % c.heads != 0)
    throw std::invalid_argument("--width " + std::to_string(c.width) + " is not a multiple of --heads " +
                                std::to_string(c.heads));
  const int64_t C = c.width, V = c.vocab, T = c.ctx;
  auto matrix = [](std::string n, std::vector<int64_t> s) { return ParamSpec{std::move(n), std::move(s), true}; };
  auto vector = [](std::string n, int64_t len) { return ParamSpec{std::move(n), {len}, false}; };
  std::vector<UnitSpec> units;
  units.push_back({"embed", {matrix("wte", {V, C}), matrix("wpe", {T, C})}});
  for (int l = 0; l < c.layers; ++l)
    units.push_back({"block" + std::to_string(l),
                     {vector("ln1.w", C), vector("ln1.b", C), matrix("attn.qkv.w", {3 * C, C}),
                      vector("attn.qkv.b", 3 * C), matrix("attn.proj.w", {C, C}), vector("attn.proj.b", C),
                      vector("ln2.w", C), vector("ln2.b", C), matrix("mlp.fc.w", {4 * C, C}), vector("mlp.fc.b", 4 * C),
                      matrix("mlp.proj.w", {C, 4 * C}), vector("mlp.proj.b", C)}});
  units.push_back({"head", {vector("lnf.w", C), vector("lnf.b", C), matrix("lm_head.w", {V, C})}});
  return units;
}

void initParam(const GptConfig& c, const std::vector<UnitSpec>& units, int u, int p, uint64_t seed, float* out,
               size_t n) {
  const std::string& name = units[u].params[p].name;
  auto t = torch::from_blob(out, {static_cast<int64_t>(n)}, torch::kFloat32);
  const bool is_norm_weight = name.find("ln") == 0 && name.back() == 'w';
  if (is_norm_weight) {
    t.fill_(1.0f);
    return;
  }
  if (!units[u].params[p].weight_decay) {  // biases
    t.zero_();
    return;
  }
  double std = 0.02;
  if (name == "attn.proj.w" || name == "mlp.proj.w") std /= std::sqrt(2.0 * c.layers);
  // One generator per parameter: the value depends on (seed, unit, param) only, not on the
  // world size, the degree or the order in which ranks initialise.
  const uint64_t s = seed * 1000003ULL + static_cast<uint64_t>(u) * 1009ULL + static_cast<uint64_t>(p);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(s);
  t.normal_(0.0, std, gen);
}

torch::Tensor embedForward(const std::vector<torch::Tensor>& P, const torch::Tensor& tokens) {
  const int64_t T = tokens.size(1);
  return torch::embedding(P[0], tokens) + P[1].narrow(0, 0, T).unsqueeze(0);
}

torch::Tensor blockForward(const std::vector<torch::Tensor>& P, const torch::Tensor& x, int heads) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hd = C / heads;
  auto h = torch::layer_norm(x, {C}, P[0], P[1], 1e-5);
  auto qkv = torch::linear(h, P[2], P[3]).chunk(3, -1);
  auto split = [&](const torch::Tensor& t) { return t.view({B, T, heads, hd}).transpose(1, 2); };
  auto q = split(qkv[0]), k = split(qkv[1]), v = split(qkv[2]);
  auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  auto mask = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool)).triu(1);
  att = torch::softmax(att.masked_fill(mask, -INFINITY), -1);
  auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});
  auto r = x + torch::linear(y, P[4], P[5]);
  auto m = torch::layer_norm(r, {C}, P[6], P[7], 1e-5);
  m = torch::linear(torch::gelu(torch::linear(m, P[8], P[9]), "tanh"), P[10], P[11]);
  return r + m;
}

torch::Tensor headLoss(const std::vector<torch::Tensor>& P, const torch::Tensor& x, const torch::Tensor& targets) {
  const int64_t C = x.size(2);
  auto h = torch::layer_norm(x, {C}, P[0], P[1], 1e-5);
  auto logits = torch::linear(h, P[2]);
  return torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), targets.reshape({-1}));
}

}  // namespace train_gpt
