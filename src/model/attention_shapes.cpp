#include "model/attention_shapes.h"

#include <cmath>

namespace tetra::model {
namespace {

int rotary_dim_of(const ModelConfig& c) {
  return int(std::lround(double(c.head_dim) * c.rope.partial_rotary_factor));
}

}  // namespace

ops::RopeShape rope_shape_of(const ModelConfig& c) {
  ops::RopeShape r;
  r.head_dim = int(c.head_dim);
  r.rotary_dim = rotary_dim_of(c);
  r.n_q_heads = int(c.num_attention_heads);
  r.n_k_heads = int(c.num_key_value_heads);
  r.q_stride = c.num_attention_heads * c.head_dim;
  r.k_stride = c.num_key_value_heads * c.head_dim;
  r.style = c.rope.interleave ? ops::RopeStyle::GptJ : ops::RopeStyle::NeoX;
  ops::check_rope_shape(r);
  return r;
}

std::vector<float> rope_inv_freq_of(const ModelConfig& c) {
  return ops::rope_inv_freq(c.rope.theta, rotary_dim_of(c));
}

ops::AttentionShape attention_shape_of(const ModelConfig& c) {
  ops::AttentionShape a;
  a.n_heads = int(c.num_attention_heads);
  a.n_kv_heads = int(c.num_key_value_heads);
  a.head_dim = int(c.head_dim);
  a.scale = float(1.0 / std::sqrt(double(c.head_dim)));
  ops::check_attention_shape(a);
  return a;
}

}  // namespace tetra::model
