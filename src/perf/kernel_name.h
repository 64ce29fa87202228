// Kernel names for people: what CUPTI reports is the mangled symbol.
#pragma once
#include <string>

namespace tetra::perf {

// "void tetra::ns::kern<A, B>(Args)" -> "kern<A, B>": demangled (when mangled), namespaces,
// return type and parameter list removed; template arguments kept (they tell GEMM1 from GEMM2).
std::string short_kernel_name(const std::string& mangled);

}  // namespace tetra::perf
