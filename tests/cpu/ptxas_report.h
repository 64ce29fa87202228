// ptxas' report (nvcc -Xptxas -v) of every kernel of a source file, compiled for sm_90a with the
// flags of the top-level CMakeLists.txt on any machine: registers, spills and static shared memory
// per entry function.
#pragma once
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace tetra::test {

struct KernelBudget {
  std::string name;  // mangled entry name
  int registers = -1;
  int spill_stores = -1;  // bytes
  int spill_loads = -1;   // bytes
  int static_smem = 0;    // bytes of __shared__ variables
};

// "Compiling entry function 'K'", then "... S bytes spill stores, L bytes spill loads", then
// "Used R registers, ... B bytes smem" (device functions' properties come without the
// "Compiling" line; a kernel without __shared__ variables has no "bytes smem").
inline std::vector<KernelBudget> parse_ptxas_report(const std::string& text) {
  const std::regex entry(R"(Compiling entry function '(\w+)')");
  const std::regex spills(R"((\d+) bytes spill stores, (\d+) bytes spill loads)");
  const std::regex used(R"(Used (\d+) registers)");
  const std::regex smem(R"((\d+) bytes smem)");
  std::vector<KernelBudget> kernels;
  std::istringstream lines(text);
  std::string line;
  std::smatch m;
  while (std::getline(lines, line)) {
    if (std::regex_search(line, m, entry)) {
      kernels.push_back({m[1].str()});
    } else if (!kernels.empty() && kernels.back().spill_stores < 0 &&
               std::regex_search(line, m, spills)) {
      kernels.back().spill_stores = std::stoi(m[1].str());
      kernels.back().spill_loads = std::stoi(m[2].str());
    } else if (!kernels.empty() && kernels.back().registers < 0 &&
               std::regex_search(line, m, used)) {
      kernels.back().registers = std::stoi(m[1].str());
      if (std::regex_search(line, m, smem)) kernels.back().static_smem = std::stoi(m[1].str());
    }
  }
  return kernels;
}

// source (relative to the repository) -> its kernels; a file that yields none fails the test.
// Each compile is a script of its own, run by `xargs -P` one per core.
inline std::map<std::string, std::vector<KernelBudget>> compile_and_read(
    const std::vector<std::string>& sources) {
  const std::string root = std::string(TETRA_TEST_DATA_DIR) + "/../..";
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tetra_ptxas_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<std::string> commands;
  for (size_t i = 0; i < sources.size(); ++i) {
    const std::string base = (dir / std::to_string(i)).string();
    commands.push_back(std::string(TETRA_NVCC) + " -I" + root +
                       "/src -gencode=arch=compute_90a,code=sm_90a -std=c++20 -O3 -DNDEBUG "
                       "--expt-relaxed-constexpr -lineinfo -Xptxas -v -cubin " + root + "/" +
                       sources[i] + " -o " + base + ".cubin > " + base + ".txt 2>&1");
    std::ofstream(base + ".sh") << commands.back() << "\n";
  }
  const unsigned jobs = std::max(1u, std::thread::hardware_concurrency());
  const std::string run = "ls " + dir.string() + "/*.sh | xargs -P " + std::to_string(jobs) +
                          " -n 1 sh";
  EXPECT_EQ(std::system(run.c_str()), 0) << run;
  std::map<std::string, std::vector<KernelBudget>> out;
  for (size_t i = 0; i < sources.size(); ++i) {
    std::ifstream in(dir / (std::to_string(i) + ".txt"));
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    out[sources[i]] = parse_ptxas_report(text);
    EXPECT_FALSE(out[sources[i]].empty()) << "no ptxas report from: " << commands[i] << "\n" << text;
  }
  std::filesystem::remove_all(dir);
  return out;
}

inline std::vector<KernelBudget> compile_and_read(const std::string& source) {
  return compile_and_read(std::vector<std::string>{source})[source];
}

inline std::vector<KernelBudget> matching(const std::vector<KernelBudget>& all,
                                          const std::string& re) {
  const std::regex name(re);
  std::vector<KernelBudget> out;
  for (const KernelBudget& k : all)
    if (std::regex_search(k.name, name)) out.push_back(k);
  return out;
}

}  // namespace tetra::test
