// The entry of a kernel in the MoE routing chain (router logits -> route -> layout -> row
// bookkeeping) when launched as a programmatic dependent (core/kernel_launch.h): it lets the next
// kernel of the chain be staged at once, then waits until the kernel before it has finished and
// its writes are visible. Both instructions are no-ops in a plain launch.
#pragma once

namespace tetra::moe::cuda::detail {

__device__ __forceinline__ void pdl_chain_entry() {
  asm volatile("griddepcontrol.launch_dependents;");
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

}  // namespace tetra::moe::cuda::detail
