// `tetra bench <what>`: cmd_bench.cpp creates the `bench` command and calls one function per
// benchmark, each adding its own subcommand (moe now; decode later).
#pragma once
#include <CLI/CLI.hpp>

#include "bench/report_output.h"

namespace tetra::cli {

// Exit code of a benchmark that cannot run here (no CUDA GPU); bad arguments exit 1.
inline constexpr int kExitNoGpu = 4;

// `tetra bench moe`: one MoE layer of a preset's shapes on the GPU (bench/moe_bench.h).
void add_bench_moe(CLI::App& bench);

// --json [PATH] and --markdown PATH of a benchmark that prints a markdown table: --json alone
// prints the JSON report instead (bench/report_output.h).
void add_report_options(CLI::App& cmd, bench::ReportOutput& out);

}  // namespace tetra::cli
