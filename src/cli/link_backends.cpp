// Model backends register themselves (model/model_ops.h) from files of the static tetra_lib that
// no command names, so the linker would drop them. Naming each one here links them into the
// tetra binary for every command (generate, logits, serve, demo, bench decode).
#include "model/cuda/cuda_model_ops.h"

namespace tetra::cli {
namespace {

const bool kCudaBackendLinked = (model::cuda::link_cuda_model_ops(), true);

}  // namespace
}  // namespace tetra::cli
