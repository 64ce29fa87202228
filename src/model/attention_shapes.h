// The RoPE and attention shapes a GQA model's config implies, for every backend: q/k read packed
// ([T, heads, head_dim]), partial rotary from partial_rotary_factor, softmax scale head_dim^-0.5.
#pragma once
#include <vector>

#include "format/model_config.h"
#include "ops/attention/attention.h"
#include "ops/rope/rope.h"

namespace tetra::model {

// Checked with ops::check_rope_shape (tetra::Error on an inconsistent config).
ops::RopeShape rope_shape_of(const ModelConfig& c);
// inv_freq [rotary_dim / 2] for rope_shape_of(c).
std::vector<float> rope_inv_freq_of(const ModelConfig& c);
// Checked with ops::check_attention_shape.
ops::AttentionShape attention_shape_of(const ModelConfig& c);

}  // namespace tetra::model
