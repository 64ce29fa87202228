// CUDA NVFP4 kernels against the CPU reference, byte for byte, on awkward shapes and ranges.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/half.h"
#include "format/nvfp4.h"
#include "format/scale_layout.h"
#include "ops/nvfp4/gpu_quantizer.h"
#include "ops/nvfp4/nvfp4_cuda.h"

using namespace tetra;
namespace nv = tetra::nvfp4;

namespace {

// Owns `bytes` of device memory.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    TETRA_CUDA_CHECK(cudaMalloc(&ptr_, bytes ? bytes : 1));
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  void upload(const void* src, size_t bytes, size_t offset = 0) {
    TETRA_CUDA_CHECK(
        cudaMemcpy(static_cast<char*>(ptr_) + offset, src, bytes, cudaMemcpyHostToDevice));
  }
  void fill(int byte) { TETRA_CUDA_CHECK(cudaMemset(ptr_, byte, bytes_)); }
  template <typename T>
  std::vector<T> download(size_t count, size_t offset = 0) const {
    std::vector<T> out(count);
    TETRA_CUDA_CHECK(cudaMemcpy(out.data(), static_cast<const char*>(ptr_) + offset,
                                count * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

class Nvfp4Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// A tensor in one input dtype plus its exact float values.
struct HostTensor {
  DType dtype;
  std::vector<float> values;   // [n] exact values of the stored elements
  std::vector<uint8_t> bytes;  // [n * dtype_size] the stored elements
};

HostTensor make_tensor(const std::vector<float>& x, DType dtype) {
  HostTensor t{dtype, x, std::vector<uint8_t>(x.size() * dtype_size(dtype))};
  for (size_t i = 0; i < x.size(); ++i) {
    if (dtype == DType::F32) {
      std::memcpy(&t.bytes[i * 4], &x[i], 4);
      continue;
    }
    const uint16_t h = dtype == DType::F16 ? float_to_f16(x[i]) : float_to_bf16(x[i]);
    std::memcpy(&t.bytes[i * 2], &h, 2);
    t.values[i] = dtype == DType::F16 ? f16_to_float(h) : bf16_to_float(h);
  }
  return t;
}

// Gaussian with outliers; each block of 16 scaled by 2^[-span, 0]; some blocks zeroed.
std::vector<float> random_values(size_t n, uint32_t seed, float magnitude, int span) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> block_exp(-span, 0), pick(0, 99);
  std::vector<float> x(n);
  float mul = 1;
  for (size_t i = 0; i < n; ++i) {
    if (i % 16 == 0) mul = pick(rng) < 3 ? 0.0f : std::ldexp(magnitude, block_exp(rng));
    x[i] = normal(rng) * mul * (pick(rng) == 0 ? 20.0f : 1.0f);
  }
  return x;
}

struct Quantized {
  std::vector<uint8_t> packed;  // [rows, cols/2]
  std::vector<uint8_t> scales;  // [rows, cols/16]
};

Quantized cpu_quantize(const HostTensor& t, int64_t rows, int64_t cols, float s2) {
  Quantized q{std::vector<uint8_t>(size_t(rows * cols / 2)),
              std::vector<uint8_t>(size_t(rows * cols / 16))};
  nv::quantize_weight(t.bytes.data(), t.dtype, rows, cols, s2, q.packed.data(), q.scales.data());
  return q;
}

void expect_bytes_equal(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(int(got[i]), int(want[i])) << what << " byte " << i;
}

// Runs amax, weight quantization, both dequantizations and activation quantization of `x` on the
// GPU and compares every output with the CPU reference.
void check_all_ops(const std::vector<float>& x, int64_t rows, int64_t cols, DType dtype,
                   const std::string& label) {
  const HostTensor t = make_tensor(x, dtype);
  const size_t n = size_t(rows * cols);
  DeviceBuffer d_src(t.bytes.size()), d_packed(n / 2), d_scales(n / 16), d_amax(4), d_flag(4);
  d_src.upload(t.bytes.data(), t.bytes.size());

  const float cpu_amax = nv::amax(t.bytes.data(), dtype, n, label);
  ASSERT_EQ(cudaSuccess, nv::cuda::amax(d_src.get(), dtype, int64_t(n), d_amax.get<float>(),
                                        d_flag.get<int>(), nullptr));
  EXPECT_EQ(d_amax.download<float>(1)[0], cpu_amax) << label;
  EXPECT_EQ(d_flag.download<int>(1)[0], 0) << label;

  const float s2 = nv::global_scale_from_amax(cpu_amax);
  const Quantized want = cpu_quantize(t, rows, cols, s2);
  d_packed.fill(0xee);
  d_scales.fill(0xee);
  ASSERT_EQ(cudaSuccess,
            nv::cuda::quantize_weight(d_src.get(), dtype, rows, cols, s2, d_packed.get<uint8_t>(),
                                      d_scales.get<uint8_t>(), nullptr));
  expect_bytes_equal(d_scales.download<uint8_t>(n / 16), want.scales, label + " scales");
  expect_bytes_equal(d_packed.download<uint8_t>(n / 2), want.packed, label + " packed");

  // Dequantize the CPU's bytes on both sides.
  d_packed.upload(want.packed.data(), want.packed.size());
  d_scales.upload(want.scales.data(), want.scales.size());
  std::vector<float> cpu_f(n);
  std::vector<uint16_t> cpu_b(n);
  nv::dequantize_weight(want.packed.data(), want.scales.data(), s2, rows, cols, cpu_f.data());
  nv::dequantize_weight_bf16(want.packed.data(), want.scales.data(), s2, rows, cols, cpu_b.data());
  DeviceBuffer d_f(n * 4), d_b(n * 2);
  ASSERT_EQ(cudaSuccess,
            nv::cuda::dequantize_weight(d_packed.get<uint8_t>(), d_scales.get<uint8_t>(), s2, rows,
                                        cols, d_f.get<float>(), nullptr));
  ASSERT_EQ(cudaSuccess,
            nv::cuda::dequantize_weight_bf16(d_packed.get<uint8_t>(), d_scales.get<uint8_t>(), s2,
                                             rows, cols, d_b.get<uint16_t>(), nullptr));
  const std::vector<float> gpu_f = d_f.download<float>(n);
  const std::vector<uint16_t> gpu_b = d_b.download<uint16_t>(n);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(float_to_bits(gpu_f[i]), float_to_bits(cpu_f[i])) << label << " dequant " << i;
    ASSERT_EQ(gpu_b[i], cpu_b[i]) << label << " dequant bf16 " << i;
  }

  // Activation quantization with a calibration-like input_scale.
  // (1 / input_scale must be finite: a subnormal input_scale is refused.)
  const float calibrated = cpu_amax / 2688.0f * 0.75f;
  const float input_scale = calibrated > 0 && std::isfinite(1.0f / calibrated) ? calibrated : 1.0f;
  Quantized act{std::vector<uint8_t>(n / 2), std::vector<uint8_t>(n / 16)};
  nv::quantize_activation(t.bytes.data(), dtype, rows, cols, input_scale, act.packed.data(),
                          act.scales.data());
  ASSERT_EQ(cudaSuccess, nv::cuda::quantize_activation(d_src.get(), dtype, rows, cols, input_scale,
                                                       d_packed.get<uint8_t>(),
                                                       d_scales.get<uint8_t>(), nullptr));
  expect_bytes_equal(d_scales.download<uint8_t>(n / 16), act.scales, label + " act scales");
  expect_bytes_equal(d_packed.download<uint8_t>(n / 2), act.packed, label + " act packed");
  ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
}

}  // namespace

TEST_F(Nvfp4Cuda, OddShapesAllDtypesMatchCpu) {
  uint32_t seed = 1;
  for (int64_t rows : {1, 3, 19, 99, 989, 4096})
    for (int64_t cols : {16, 48, 2048, 6144 + 16})
      for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
        const auto x = random_values(size_t(rows * cols), seed++, 0.03f, 14);
        check_all_ops(
            x, rows, cols, dt,
            std::string(dtype_name(dt)) + " " + std::to_string(rows) + "x" + std::to_string(cols));
      }
}

TEST_F(Nvfp4Cuda, TinyHugeSubnormalAndZeroRanges) {
  // F32 only holds 1e-30 and 1e30; bf16 also keeps a wide exponent range.
  check_all_ops(random_values(19 * 48, 7, 1e-30f, 8), 19, 48, DType::F32, "tiny f32");
  check_all_ops(random_values(19 * 48, 8, 1e30f, 8), 19, 48, DType::F32, "huge f32");
  check_all_ops(random_values(19 * 48, 9, 1e-38f, 4), 19, 48, DType::F32, "subnormal-s2 f32");
  check_all_ops(random_values(99 * 2048, 10, 1.0f, 40), 99, 2048, DType::BF16, "wide bf16");
  check_all_ops(random_values(99 * 2048, 11, 1.0f, 20), 99, 2048, DType::F16, "wide f16");
  check_all_ops(std::vector<float>(3 * 48, 0.0f), 3, 48, DType::BF16, "all-zero bf16");
  check_all_ops(std::vector<float>(3 * 48, -0.0f), 3, 48, DType::F32, "all -0 f32");
}

TEST_F(Nvfp4Cuda, UnalignedPointersTakeTheScalarPathWithSameBytes) {
  const int64_t rows = 19, cols = 48;
  const size_t n = size_t(rows * cols);
  for (DType dt : {DType::F32, DType::BF16}) {
    const HostTensor t = make_tensor(random_values(n, 12, 1.0f, 6), dt);
    const size_t esz = dtype_size(dt);
    DeviceBuffer d_src(t.bytes.size() + esz), d_packed(n / 2 + 1), d_scales(n / 16);
    d_src.upload(t.bytes.data(), t.bytes.size(), esz);  // starts one element in: not 16-aligned
    const void* src = d_src.get<uint8_t>() + esz;
    uint8_t* packed = d_packed.get<uint8_t>() + 1;  // not 8-aligned
    const float s2 = nv::global_scale_from_amax(nv::amax(t.bytes.data(), dt, n, "u"));
    ASSERT_EQ(cudaSuccess, nv::cuda::quantize_weight(src, dt, rows, cols, s2, packed,
                                                     d_scales.get<uint8_t>(), nullptr));
    const Quantized want = cpu_quantize(t, rows, cols, s2);
    expect_bytes_equal(d_packed.download<uint8_t>(n / 2, 1), want.packed, "unaligned packed");
    expect_bytes_equal(d_scales.download<uint8_t>(n / 16), want.scales, "unaligned scales");
    DeviceBuffer d_amax(4), d_flag(4);
    ASSERT_EQ(cudaSuccess,
              nv::cuda::amax(src, dt, int64_t(n), d_amax.get<float>(), d_flag.get<int>(), nullptr));
    EXPECT_EQ(d_amax.download<float>(1)[0], nv::amax(t.bytes.data(), dt, n, "u"));
    // Dequantize into an output that is not 16-byte aligned.
    DeviceBuffer d_out((n + 1) * 4);
    ASSERT_EQ(cudaSuccess, nv::cuda::dequantize_weight(packed, d_scales.get<uint8_t>(), s2, rows,
                                                       cols, d_out.get<float>() + 1, nullptr));
    std::vector<float> cpu(n);
    nv::dequantize_weight(want.packed.data(), want.scales.data(), s2, rows, cols, cpu.data());
    const std::vector<float> gpu = d_out.download<float>(n, 4);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(float_to_bits(gpu[i]), float_to_bits(cpu[i])) << i;
  }
}

TEST_F(Nvfp4Cuda, AmaxOddLengthsAndNonFiniteFlag) {
  for (size_t n : {size_t(1), size_t(7), size_t(33), size_t(1000003)}) {
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
      HostTensor t = make_tensor(random_values(n, uint32_t(n), 3.0f, 10), dt);
      DeviceBuffer d_src(t.bytes.size()), d_amax(4), d_flag(4);
      d_src.upload(t.bytes.data(), t.bytes.size());
      ASSERT_EQ(cudaSuccess, nv::cuda::amax(d_src.get(), dt, int64_t(n), d_amax.get<float>(),
                                            d_flag.get<int>(), nullptr));
      EXPECT_EQ(d_amax.download<float>(1)[0], nv::amax(t.bytes.data(), dt, n, "a")) << n;
      EXPECT_EQ(d_flag.download<int>(1)[0], 0);
      // Poison the last element (the scalar tail when n is not a multiple of the vector width).
      const size_t esz = dtype_size(dt);
      const std::vector<uint8_t> nan_bytes =
          dt == DType::F32 ? std::vector<uint8_t>{0x00, 0x00, 0xc0, 0x7f}
                           : (dt == DType::F16 ? std::vector<uint8_t>{0x00, 0x7e}
                                               : std::vector<uint8_t>{0xc0, 0x7f});
      d_src.upload(nan_bytes.data(), esz, (n - 1) * esz);
      ASSERT_EQ(cudaSuccess, nv::cuda::amax(d_src.get(), dt, int64_t(n), d_amax.get<float>(),
                                            d_flag.get<int>(), nullptr));
      EXPECT_EQ(d_flag.download<int>(1)[0], 1) << n;
    }
  }
}

TEST_F(Nvfp4Cuda, QuantizeReportsNonFiniteAndRefusesBadShapes) {
  std::vector<float> x(3 * 48, 1.0f);
  x[70] = std::numeric_limits<float>::infinity();
  DeviceBuffer d_src(x.size() * 4), d_packed(x.size() / 2), d_scales(x.size() / 16), d_flag(4);
  d_src.upload(x.data(), x.size() * 4);
  d_flag.fill(0);
  ASSERT_EQ(cudaSuccess,
            nv::cuda::quantize_weight(d_src.get(), DType::F32, 3, 48, 1.0f, d_packed.get<uint8_t>(),
                                      d_scales.get<uint8_t>(), nullptr, d_flag.get<int>()));
  EXPECT_EQ(d_flag.download<int>(1)[0], 1);
  EXPECT_EQ(cudaErrorInvalidValue,
            nv::cuda::quantize_weight(d_src.get(), DType::F32, 3, 40, 1.0f, d_packed.get<uint8_t>(),
                                      d_scales.get<uint8_t>(), nullptr));
  EXPECT_EQ(cudaErrorInvalidValue,
            nv::cuda::quantize_weight(d_src.get(), DType::I32, 3, 48, 1.0f, d_packed.get<uint8_t>(),
                                      d_scales.get<uint8_t>(), nullptr));
  EXPECT_EQ(cudaErrorInvalidValue, nv::cuda::quantize_activation(d_src.get(), DType::F32, 3, 48,
                                                                 0.0f, d_packed.get<uint8_t>(),
                                                                 d_scales.get<uint8_t>(), nullptr));
}

TEST_F(Nvfp4Cuda, SwizzleMatchesCpuIncludingPadding) {
  struct Shape {
    int64_t batch, rows, kb;
  };
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> byte(0, 255);
  for (const Shape s : {Shape{1, 1, 1}, Shape{3, 19, 3}, Shape{2, 128, 4}, Shape{8, 989, 129},
                        Shape{4, 4096, 384}, Shape{1, 99, 385}}) {
    const int64_t per = nv::swizzled_scale_bytes(s.rows, s.kb);
    std::vector<uint8_t> plain(size_t(s.batch * s.rows * s.kb));
    for (auto& v : plain) v = uint8_t(byte(rng));
    std::vector<uint8_t> want(size_t(s.batch * per));
    nv::swizzle_scales(plain.data(), s.batch, s.rows, s.kb, want.data());
    DeviceBuffer d_plain(plain.size()), d_sw(want.size()), d_back(plain.size());
    d_plain.upload(plain.data(), plain.size());
    d_sw.fill(0xff);  // padding must be overwritten with zeros
    ASSERT_EQ(cudaSuccess, nv::cuda::swizzle_scales(d_plain.get<uint8_t>(), s.batch, s.rows, s.kb,
                                                    d_sw.get<uint8_t>(), nullptr));
    expect_bytes_equal(d_sw.download<uint8_t>(want.size()), want, "swizzle");
    ASSERT_EQ(cudaSuccess, nv::cuda::unswizzle_scales(d_sw.get<uint8_t>(), s.batch, s.rows, s.kb,
                                                      d_back.get<uint8_t>(), nullptr));
    expect_bytes_equal(d_back.download<uint8_t>(plain.size()), plain, "unswizzle");
  }
}

TEST_F(Nvfp4Cuda, GpuWeightQuantizerMatchesCpuPath) {
  nv::GpuWeightQuantizer gq;
  uint32_t seed = 40;
  // Sizes go up and down so the device buffers are grown and reused.
  const int64_t shapes[][2] = {{19, 48}, {989, 2048}, {3, 16}, {4096, 6160}, {99, 48}};
  for (DType dt : {DType::BF16, DType::F32, DType::F16}) {
    for (const auto& sh : shapes) {
      const int64_t rows = sh[0], cols = sh[1];
      const size_t n = size_t(rows * cols);
      const HostTensor t = make_tensor(random_values(n, seed++, 0.02f, 16), dt);
      const float cpu_amax = nv::amax(t.bytes.data(), dt, n, "w");
      ASSERT_EQ(gq.amax(t.bytes.data(), dt, n, "w"), cpu_amax);
      const float s2 = nv::global_scale_from_amax(cpu_amax);
      Quantized got{std::vector<uint8_t>(n / 2), std::vector<uint8_t>(n / 16)};
      gq.quantize(t.bytes.data(), dt, rows, cols, s2, got.packed.data(), got.scales.data());
      const Quantized want = cpu_quantize(t, rows, cols, s2);
      expect_bytes_equal(got.scales, want.scales, "quantizer scales");
      expect_bytes_equal(got.packed, want.packed, "quantizer packed");
    }
  }
  // NaN: the error names the tensor, as the CPU path does.
  std::vector<float> bad(64, 1.0f);
  bad[40] = std::numeric_limits<float>::quiet_NaN();
  try {
    gq.amax(bad.data(), DType::F32, bad.size(), "layers.0.mlp.down_proj.weight");
    FAIL() << "NaN accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.mlp.down_proj.weight"), std::string::npos)
        << e.what();
  }
  std::vector<uint8_t> packed(32), scales(4);
  EXPECT_THROW(gq.quantize(bad.data(), DType::F32, 1, 64, 1.0f, packed.data(), scales.data()),
               Error);
  EXPECT_THROW(gq.quantize(bad.data(), DType::F32, 1, 60, 1.0f, packed.data(), scales.data()),
               Error);
  // Still usable after an error.
  bad[40] = 2.0f;
  EXPECT_EQ(gq.amax(bad.data(), DType::F32, bad.size(), "x"), 2.0f);
}
