// The RoPE and attention shapes a model's config implies, for every backend. GQA: q/k read
// packed ([T, heads, head_dim]), partial rotary from partial_rotary_factor, softmax scale
// head_dim^-0.5. MLA: the qk_rope_head_dim dims rotate, scale (nope + rope)^-0.5 times YaRN's
// mscale(factor, mscale_all_dim)^2 where the config gives mscale_all_dim (as DeepSeek-V3 does).
#pragma once
#include <vector>

#include "format/model_config.h"
#include "ops/attention/attention.h"
#include "ops/attention/dsa.h"
#include "ops/attention/mla.h"
#include "ops/rope/rope.h"

namespace tetra::model {

// Checked with ops::check_rope_shape (tetra::Error on an inconsistent config). GQA only.
ops::RopeShape rope_shape_of(const ModelConfig& c);
// inv_freq [rotary_dim / 2]: plain or YaRN (config rope type).
std::vector<float> rope_inv_freq_of(const ModelConfig& c);
// The factor YaRN multiplies cos and sin by (1 without YaRN, and for DeepSeek-V3's
// mscale == mscale_all_dim). The runtime refuses configs where it is not 1.
double rope_attention_factor(const ModelConfig& c);
// Checked with ops::check_attention_shape. GQA only.
ops::AttentionShape attention_shape_of(const ModelConfig& c);
// Checked with ops::check_mla_shape. MLA only.
ops::MlaShape mla_shape_of(const ModelConfig& c);
// GLM-5's DSA indexer: its heads, the qk_rope_head_dim leading dims turning (pairs per
// indexer_rope_interleave, the MLA's inv_freq table), index_topk. Checked with
// ops::check_dsa_shape. Models with an indexer only.
ops::DsaShape dsa_shape_of(const ModelConfig& c);
// LayerNorm eps of the indexer's key norm (the reference's).
inline constexpr float kDsaKeyNormEps = 1e-6f;

}  // namespace tetra::model
