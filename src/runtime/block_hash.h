// Chain hashes of full KV blocks for prefix caching: block i's hash covers its tokens and block
// i - 1's hash, so equal hashes mean equal whole prefixes. 128 bits (two 64-bit lanes of
// different keys): a false match among a million cached blocks is ~1e-27 likely, and the cache
// compares each matched block's own tokens as well.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

namespace tetra::runtime {

struct BlockHash {
  uint64_t lo = 0, hi = 0;
  bool operator==(const BlockHash&) const = default;
};

// splitmix64's finaliser: every input bit reaches every output bit.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The hash of a block holding tokens[0, n) after a block hashed `parent` (the first block's
// parent is BlockHash{}).
inline BlockHash chain_hash(const BlockHash& parent, const int32_t* tokens, int n) {
  BlockHash h{mix64(parent.lo ^ 0x243F6A8885A308D3ull), mix64(parent.hi ^ 0x13198A2E03707344ull)};
  for (int i = 0; i < n; ++i) {
    const uint64_t t = uint32_t(tokens[i]);
    h.lo = mix64(h.lo + t + 0x9E3779B97F4A7C15ull);
    h.hi = mix64(h.hi ^ (t * 0xA4093822299F31D0ull + uint64_t(i)));
  }
  return h;
}

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return size_t(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull)); }
};

}  // namespace tetra::runtime
