// See router_fold.h.
#include "moe/router_fold.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"

namespace tetra::moe {

std::vector<uint8_t> router_fold_tiles(const uint16_t* W, const uint16_t* g, int E, int H) {
  TETRA_CHECK(E > 0 && E <= kRouterFoldMaxExperts && H > 0 && H % kRouterFoldTile == 0,
              "router fold: E=", E, " H=", H);
  const size_t tb = router_fold_tile_bytes(E);
  std::vector<uint8_t> tiles(tb * size_t(H / kRouterFoldTile));
  for (int t = 0; t < H / kRouterFoldTile; ++t) {
    uint8_t* dst = tiles.data() + size_t(t) * tb;
    std::memcpy(dst, g + size_t(t) * kRouterFoldTile, 32);
    for (int e = 0; e < E; ++e)
      std::memcpy(dst + 32 + size_t(e) * kRouterFoldTile * 2,
                  W + size_t(e) * H + size_t(t) * kRouterFoldTile, kRouterFoldTile * 2);
  }
  return tiles;
}

void router_fold_sums(const std::vector<uint8_t>& tiles, const uint16_t* h, int E, int H,
                      std::vector<double>& sums, std::vector<uint16_t>& gx) {
  const size_t tb = router_fold_tile_bytes(E);
  TETRA_CHECK(tiles.size() == tb * size_t(H / kRouterFoldTile), "router fold: ", tiles.size(),
              " bytes of tiles for E=", E, " H=", H);
  sums.assign(size_t(E) + 1, 0.0);
  gx.resize(size_t(H));
  for (int t = 0; t < H / kRouterFoldTile; ++t) {
    const uint8_t* src = tiles.data() + size_t(t) * tb;
    const int i0 = t * kRouterFoldTile;
    float gh[kRouterFoldTile];
    float ss = 0.0f;  // the device's order: fused multiply-adds over the tile's rows
    for (int j = 0; j < kRouterFoldTile; ++j) {
      uint16_t g;
      std::memcpy(&g, src + 2 * j, 2);
      const float hv = bf16_to_float(h[i0 + j]);
      ss = std::fma(hv, hv, ss);
      gh[j] = bf16_to_float(g) * hv;
      gx[size_t(i0 + j)] = float_to_bf16(gh[j]);
    }
    sums[size_t(E)] += double(ss);
    for (int e = 0; e < E; ++e) {
      float p = 0.0f;
      for (int j = 0; j < kRouterFoldTile; ++j) {
        uint16_t w;
        std::memcpy(&w, src + 32 + (size_t(e) * kRouterFoldTile + j) * 2, 2);
        p = std::fma(bf16_to_float(w), gh[j], p);
      }
      sums[size_t(e)] += double(p);
    }
  }
}

float router_fold_inv_rms(const double* sums, int E, int H, float eps) {
  return 1.0f / std::sqrt(float(sums[E]) / float(H) + eps);
}

}  // namespace tetra::moe
