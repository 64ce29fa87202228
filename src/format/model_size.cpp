#include "format/model_size.h"

#include <string>
#include <vector>

namespace tetra {
namespace {

double tensor_bytes(const TensorSpec& t) {
  double n = 1;
  for (int64_t d : t.shape) n *= static_cast<double>(d);
  return n * static_cast<double>(dtype_size(t.dtype));
}

int64_t tensor_elems(const TensorSpec& t) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  return n;
}

bool is_buffer(const TensorSpec& t) {
  const std::string suffix = "e_score_correction_bias";
  return t.name.size() >= suffix.size() &&
         t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void add(SizeBreakdown& s, int64_t params, double bytes) {
  s.params += params;
  s.bytes += bytes;
}

}  // namespace

ModelSize model_size(const ModelConfig& c, const QuantConfig& quant, DType high_precision) {
  const ModelLayout layout = model_layout(c);
  ModelSize out;
  // Routed experts per layer: [num_layers], summed over all experts of that layer.
  std::vector<SizeBreakdown> routed(static_cast<size_t>(c.num_layers));

  for (const auto& l : layout.linears) {
    const int64_t params = l.out_features * l.in_features;
    double bytes = 0;
    for (const auto& t : linear_tensors(l, linear_algo(l, quant), high_precision))
      bytes += tensor_bytes(t);
    add(out.total[l.kind], params, bytes);
    if (l.kind == ModuleKind::RoutedExpert) add(routed[static_cast<size_t>(l.layer)], params, bytes);
    else add(out.active[l.kind], params, bytes);
  }
  for (auto t : layout.others) {
    if (t.dtype == DType::BF16) t.dtype = high_precision;
    const int64_t params = is_buffer(t) ? 0 : tensor_elems(t);
    const double bytes = tensor_bytes(t);
    add(out.total[t.kind], params, bytes);
    if (t.kind == ModuleKind::Embedding && !c.tie_word_embeddings) {
      // A token reads one row; a tied table is also the lm_head, read in full.
      add(out.active[t.kind], c.hidden_size, bytes / static_cast<double>(c.vocab_size));
    } else if (t.kind == ModuleKind::RoutedExpert) {
      add(routed[static_cast<size_t>(t.layer)], params, bytes);
    } else {
      add(out.active[t.kind], params, bytes);
    }
  }
  for (const auto& r : routed) {
    if (r.params == 0) continue;
    // Experts of one layer are the same shape, so the top_k share is exact for params.
    add(out.active[ModuleKind::RoutedExpert], r.params * c.num_experts_per_tok / c.n_routed_experts,
        r.bytes * static_cast<double>(c.num_experts_per_tok) / static_cast<double>(c.n_routed_experts));
  }
  for (const auto& [kind, s] : out.total) add(out.total_all, s.params, s.bytes);
  for (const auto& [kind, s] : out.active) add(out.active_all, s.params, s.bytes);
  return out;
}

}  // namespace tetra
