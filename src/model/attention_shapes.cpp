#include "model/attention_shapes.h"

#include <cmath>

#include "core/error.h"

namespace tetra::model {
namespace {

bool is_mla(const ModelConfig& c) { return c.attention == AttentionKind::MLA; }

int rotary_dim_of(const ModelConfig& c) {
  if (is_mla(c)) return int(c.qk_rope_head_dim);
  return int(std::lround(double(c.head_dim) * c.rope.partial_rotary_factor));
}

bool yarn(const ModelConfig& c) { return c.rope.type == "yarn"; }

}  // namespace

ops::RopeShape rope_shape_of(const ModelConfig& c) {
  TETRA_CHECK(!is_mla(c), "rope_shape_of: an MLA model (use mla_shape_of)");
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
  if (!yarn(c)) return ops::rope_inv_freq(c.rope.theta, rotary_dim_of(c));
  ops::YarnParams y;
  y.factor = c.rope.factor;
  y.original_max_position = double(c.rope.original_max_position);
  y.beta_fast = c.rope.beta_fast;
  y.beta_slow = c.rope.beta_slow;
  return ops::rope_yarn_inv_freq(c.rope.theta, rotary_dim_of(c), y);
}

double rope_attention_factor(const ModelConfig& c) {
  if (!yarn(c)) return 1.0;
  const double f = c.rope.factor;
  if (c.rope.mscale != 0 && c.rope.mscale_all_dim != 0)
    return ops::yarn_mscale(f, c.rope.mscale) / ops::yarn_mscale(f, c.rope.mscale_all_dim);
  return ops::yarn_mscale(f, 1.0);
}

ops::AttentionShape attention_shape_of(const ModelConfig& c) {
  TETRA_CHECK(!is_mla(c), "attention_shape_of: an MLA model (use mla_shape_of)");
  ops::AttentionShape a;
  a.n_heads = int(c.num_attention_heads);
  a.n_kv_heads = int(c.num_key_value_heads);
  a.head_dim = int(c.head_dim);
  a.scale = float(1.0 / std::sqrt(double(c.head_dim)));
  ops::check_attention_shape(a);
  return a;
}

ops::MlaShape mla_shape_of(const ModelConfig& c) {
  TETRA_CHECK(is_mla(c), "mla_shape_of: not an MLA model");
  ops::MlaShape s;
  s.n_heads = int(c.num_attention_heads);
  s.kv_lora = int(c.kv_lora_rank);
  s.rope_dim = int(c.qk_rope_head_dim);
  s.nope_dim = int(c.qk_nope_head_dim);
  s.v_dim = int(c.v_head_dim);
  double scale = 1.0 / std::sqrt(double(c.qk_nope_head_dim + c.qk_rope_head_dim));
  if (yarn(c) && c.rope.mscale_all_dim != 0) {
    const double m = ops::yarn_mscale(c.rope.factor, c.rope.mscale_all_dim);
    scale *= m * m;
  }
  s.scale = float(scale);
  s.style = c.rope.interleave ? ops::RopeStyle::GptJ : ops::RopeStyle::NeoX;
  ops::check_mla_shape(s);
  return s;
}

ops::DsaShape dsa_shape_of(const ModelConfig& c) {
  TETRA_CHECK(is_mla(c) && c.index_n_heads > 0, "dsa_shape_of: no DSA indexer in this model");
  ops::DsaShape s;
  s.n_heads = int(c.index_n_heads);
  s.head_dim = int(c.index_head_dim);
  s.rope_dim = int(c.qk_rope_head_dim);
  s.topk = int(c.index_topk);
  s.style = c.indexer_rope_interleave ? ops::RopeStyle::GptJ : ops::RopeStyle::NeoX;
  ops::check_dsa_shape(s);
  return s;
}

}  // namespace tetra::model
