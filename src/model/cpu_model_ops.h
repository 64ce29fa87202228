// The CPU backend of the model runtime: the reference every other backend is compared with.
// Weights are dequantized to float32 once (NVFP4 through format/nvfp4.h), activations are bf16
// between ops like on the GPU, every op computes in float32 and rounds its output to bf16 once
// (logits stay float32). The MoE block runs the MoE layer runner's cpu backend
// (moe/moe_layer.h: float32 on dequantized weights, intermediate rounded to bf16 like the GPU).
// Slow on purpose: plain loops, parallel over output features for the linears.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "model/model_ops.h"

namespace tetra::model {

std::unique_ptr<ModelOps> make_cpu_model_ops();

// Tensor parallel on the CPU (the sharding tests): all_reduce(Buf) calls hook(data, count) with
// the buffer's first T rows, count bf16 elements.
using CpuAllReduceHook = std::function<void(uint16_t* data, size_t count)>;
std::unique_ptr<ModelOps> make_cpu_model_ops(CpuAllReduceHook hook);

}  // namespace tetra::model
