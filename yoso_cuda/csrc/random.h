// The counter-based random numbers of the CPU kernels' dropout (softmax_dropout.cpp, dropout.cpp): a hash of the
// seed and of the element's coordinates, so a backward regenerates the forward's mask instead of storing it, and no
// draw depends on the thread count or the order of the work.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "simd.h"

namespace yoso {
namespace {

typedef uint32_t Uints __attribute__((vector_size(32)));

// The murmur3 finaliser: a bijection of 32-bit words whose every output bit depends on every input
// bit. Written once for a word and for 8 lanes (the operators are the same).
template <typename Word>
YOSO_INLINE Word mix(Word x) {
  x ^= x >> 16;
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  x ^= x >> 16;
  return x;
}

// An element is dropped when its hash is below `threshold` = round(p 2^32): probability p to within 2^-33.
inline uint32_t drop_threshold(double dropout) {
  return static_cast<uint32_t>(std::min(std::nearbyint(std::ldexp(dropout, 32)), 4294967295.0));
}

}  // namespace
}  // namespace yoso
