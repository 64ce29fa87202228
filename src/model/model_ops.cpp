// Buffer names/widths and the backend registry.
#include "model/model_ops.h"

#include <algorithm>
#include <map>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "model/cpu_model_ops.h"

namespace tetra::model {

const char* buf_name(Buf b) {
  switch (b) {
    case Buf::Residual: return "residual";
    case Buf::Normed: return "normed";
    case Buf::Q: return "q";
    case Buf::K: return "k";
    case Buf::V: return "v";
    case Buf::Attn: return "attn";
    case Buf::Gate: return "gate";
    case Buf::Up: return "up";
    case Buf::Out: return "out";
    case Buf::QLatent: return "q_latent";
    case Buf::KvA: return "kv_a";
    case Buf::QAbsorbed: return "q_absorbed";
    case Buf::AttnLatent: return "attn_latent";
    case Buf::IdxQ: return "index_q";
    case Buf::IdxK: return "index_k";
    case Buf::IdxW: return "index_weights";
    case Buf::Count: break;
  }
  return "?";
}

int64_t buf_width(Buf b, const ModelConfig& c) {
  const bool mla = c.attention == AttentionKind::MLA;
  const int64_t heads = c.num_attention_heads;
  switch (b) {
    case Buf::Residual:
    case Buf::Normed:
    case Buf::Out: return c.hidden_size;
    case Buf::Q: return heads * c.head_dim;
    case Buf::Attn: return heads * (mla ? c.v_head_dim : c.head_dim);
    case Buf::K:
    case Buf::V: return mla ? 0 : c.num_key_value_heads * c.head_dim;
    case Buf::Gate:
    case Buf::Up: return c.intermediate_size;
    case Buf::QLatent: return mla ? c.q_lora_rank : 0;
    case Buf::KvA: return mla ? c.kv_lora_rank + c.qk_rope_head_dim : 0;
    case Buf::QAbsorbed: return mla ? heads * (c.kv_lora_rank + c.qk_rope_head_dim) : 0;
    case Buf::AttnLatent: return mla ? heads * c.kv_lora_rank : 0;
    case Buf::IdxQ: return c.index_n_heads * c.index_head_dim;
    case Buf::IdxK: return c.index_n_heads > 0 ? c.index_head_dim : 0;
    case Buf::IdxW: return c.index_n_heads;
    case Buf::Count: break;
  }
  TETRA_FAIL("buf_width: not a buffer");
}

const char* linear_id_name(LinearId id) {
  switch (id) {
    case LinearId::Q: return "q_proj";
    case LinearId::K: return "k_proj";
    case LinearId::V: return "v_proj";
    case LinearId::O: return "o_proj";
    case LinearId::DenseGate: return "mlp.gate_proj";
    case LinearId::DenseUp: return "mlp.up_proj";
    case LinearId::DenseDown: return "mlp.down_proj";
    case LinearId::QA: return "q_a_proj";
    case LinearId::KvA: return "kv_a_proj_with_mqa";
    case LinearId::IdxQ: return "indexer.wq_b";
    case LinearId::IdxK: return "indexer.wk";
    case LinearId::IdxW: return "indexer.weights_proj";
  }
  return "?";
}

namespace {

std::map<std::string, ModelOpsFactory>& registry() {
  // The CPU reference is always there: it is named here, so it is always linked.
  static std::map<std::string, ModelOpsFactory> r = {{"cpu", &make_cpu_model_ops}};
  return r;
}

std::string names_list() {
  std::string s;
  for (const std::string& n : model_ops_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

ModelOpsRegistration::ModelOpsRegistration(const char* name, ModelOpsFactory factory) {
  registry()[name] = factory;
}

std::vector<std::string> model_ops_names() {
  std::vector<std::string> out;
  for (const auto& [n, f] : registry()) out.push_back(n);
  return out;
}

std::string resolve_model_ops_name(std::string_view name) {
  if (name != "auto") return std::string(name);
  return registry().count("cuda") && cuda_available() ? "cuda" : "cpu";
}

std::unique_ptr<ModelOps> make_model_ops(std::string_view name) {
  const std::string resolved = resolve_model_ops_name(name);
  const auto it = registry().find(resolved);
  if (it == registry().end()) {
    if (resolved == "cuda")
      TETRA_FAIL("backend 'cuda' is not built into this binary; available backends: ", names_list());
    TETRA_FAIL("unknown backend '", resolved, "'; available: auto, ", names_list());
  }
  if (resolved == "cuda" && !cuda_available())
    TETRA_FAIL("backend 'cuda' needs a CUDA GPU and none is available on this machine");
  return it->second();
}

void logprobs_of_sampled(ModelOps& ops, const SampleBatch& b, const int32_t* tokens) {
  if (b.logprob_top == nullptr) return;
  TETRA_CHECK(b.logprobs != nullptr, "sample: logprob_top without an output");
  std::vector<ops::LogprobQuery> queries;
  std::vector<int> asked;  // [queries] their rows
  for (int i = 0; i < b.rows; ++i) {
    b.logprobs[i] = {};
    if (b.logprob_top[i] < 0 || tokens[i] < 0) continue;
    queries.push_back({b.logit_rows ? b.logit_rows[i] : i, tokens[i], b.logprob_top[i]});
    asked.push_back(i);
  }
  if (queries.empty()) return;
  std::vector<ops::PositionLogprobs> answers(queries.size());
  ops.logprobs(queries.data(), int(queries.size()), answers.data());
  for (size_t q = 0; q < queries.size(); ++q) b.logprobs[asked[q]] = std::move(answers[q]);
}

}  // namespace tetra::model
