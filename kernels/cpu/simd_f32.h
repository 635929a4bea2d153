// fp32 vector helpers shared by the CPU kernels: one small API over AVX-512 (16 lanes) and
// AVX2 + FMA (8 lanes), chosen by what -march=native enables on the building machine. Without
// either, WB_SIMD_LANES is 0 and the kernels use their portable loops.
//
// Passed to load_inline before the kernel source (kernels.cpu.build joins them into one
// translation unit), so it carries its own includes and no include guard is needed.

#include <cmath>
#include <cstdint>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace simd {

#if defined(__AVX512F__)
#define WB_SIMD_LANES 16
using V = __m512;
constexpr int W = 16;
// Accumulator budget, in floats, that stays in registers (16 of the 32 zmm registers).
constexpr int kAccFloats = 256;

inline V load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V set1(float x) { return _mm512_set1_ps(x); }
inline V zero() { return _mm512_setzero_ps(); }
inline V add(V a, V b) { return _mm512_add_ps(a, b); }
inline V sub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V mul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }  // a * b + c
inline V max(V a, V b) { return _mm512_max_ps(a, b); }
inline float reduce_add(V v) { return _mm512_reduce_add_ps(v); }
inline float reduce_max(V v) { return _mm512_reduce_max_ps(v); }
// 2^n for integral-valued n in [-126, 0]
inline V pow2(V x, V n) { return _mm512_scalef_ps(x, n); }
inline V round_nearest(V x) {
  return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// v[0..15] -> one vector whose lane j is the horizontal sum of v[j] (transpose-and-add tree:
// 30 shuffles + 15 adds for 16 rows instead of a full reduction per row).
inline V transpose_sum(const V* v) {
  __m512 a[8], b[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3]
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: that lane's sums of 4 rows
    const __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
    b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  constexpr int kEven = _MM_SHUFFLE(2, 0, 2, 0), kOdd = _MM_SHUFFLE(3, 1, 3, 1);
  const __m512 c0 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], kEven),
                                  _mm512_shuffle_f32x4(b[0], b[1], kOdd));
  const __m512 c1 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], kEven),
                                  _mm512_shuffle_f32x4(b[2], b[3], kOdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(c0, c1, kEven), _mm512_shuffle_f32x4(c0, c1, kOdd));
}

#elif defined(__AVX2__) && defined(__FMA__)
#define WB_SIMD_LANES 8
using V = __m256;
constexpr int W = 8;
constexpr int kAccFloats = 64;  // 8 of the 16 ymm registers

inline V load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, V v) { _mm256_storeu_ps(p, v); }
inline V set1(float x) { return _mm256_set1_ps(x); }
inline V zero() { return _mm256_setzero_ps(); }
inline V add(V a, V b) { return _mm256_add_ps(a, b); }
inline V sub(V a, V b) { return _mm256_sub_ps(a, b); }
inline V mul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V max(V a, V b) { return _mm256_max_ps(a, b); }
inline float reduce_add(V v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float reduce_max(V v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// x * 2^n for integral-valued n in [-126, 0]: n goes straight into the exponent field.
inline V pow2(V x, V n) {
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                       _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(x, _mm256_castsi256_ps(e));
}
inline V round_nearest(V x) {
  return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// v[0..7] -> lane j = horizontal sum of v[j] (three rounds of hadd, one cross-lane add).
inline V transpose_sum(const V* v) {
  const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
#else
#define WB_SIMD_LANES 0
#endif

#if WB_SIMD_LANES
// exp(x) for x <= 0 (Cephes expf polynomial on [-ln2/2, ln2/2], scaled by 2^n): ~1 ulp.
inline V exp_neg(V x) {
  x = max(x, set1(-87.0f));
  const V n = round_nearest(mul(x, set1(1.44269504088896341f)));
  V r = fmadd(n, set1(-0.693359375f), x);
  r = fmadd(n, set1(2.12194440e-4f), r);
  V p = set1(1.9875691500E-4f);
  p = fmadd(p, r, set1(1.3981999507E-3f));
  p = fmadd(p, r, set1(8.3334519073E-3f));
  p = fmadd(p, r, set1(4.1665795894E-2f));
  p = fmadd(p, r, set1(1.6666665459E-1f));
  p = fmadd(p, r, set1(5.0000001201E-1f));
  p = fmadd(p, mul(r, r), add(r, set1(1.0f)));
  return pow2(p, n);
}
#endif

}  // namespace simd
