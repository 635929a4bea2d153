// CPU paged-attention decode: one query token per sequence attends to its context, reading
// K/V rows in place through the block table (no gather copy). Built by paged_decode.py with
// torch.utils.cpp_extension.load_inline; the pure-PyTorch twin is TorchAttentionBackend._decode.
//
//   query        [n, Hq, D]                 (any strides, last dim contiguous)
//   k/v_cache    [num_blocks, bs, Hkv, D]   (any strides, last dim contiguous)
//   block_tables [n, W] int64               context position p of sequence i lives in block
//                                           block_tables[i][p / bs], offset p % bs
//   seq_lens     [n] int64                  positions >= seq_len are never read
//   out          [n, Hq, D] contiguous, query's dtype (allocated by the caller); q head hq
//                                           reads kv head hq / (Hq / Hkv)
//
// Work items are (sequence, kv head, context split). An item loads its G = Hq / Hkv query
// heads (pre-scaled, fp32), walks its token range in chunks of kChunk tokens: scores for all
// G heads (each K row fetched from memory once), then an exact online-softmax update (running
// max, fp32 sum, rescale of the fp32 accumulator), then P @ V (each V row fetched once).
// Two implementations of one item: attend_vec<D> (fp32, D = 32 / 64 / 128 through simd_f32.h:
// W = 16 (AVX-512) or 8 (AVX2) scores at a time through one transpose tree, P @ V with the
// accumulators in registers) and the portable attend<D, T> (plain loops the compiler
// vectorises; bf16 / fp16 rows upcast on load; any D).
// Contexts are split across items only when (sequence, kv head) pairs alone are too few to
// keep every thread busy; split partials (max, sum, unnormalised acc) are then merged exactly.
// Items are handed out longest first from an atomic counter inside one at::parallel_for,
// so threads come from (and are counted by) torch's own OpenMP pool.
//
// KIVI low-bit KV (`paged_decode_kivi`, kv_cache_dtype int8 / int4 / int2; formats in
// kernels/quant/kv_kivi.py): a block whose slot_of[block] >= 0 is still full precision and its
// rows are read from the residual pool [slots, bs, Hkv, D] (query dtype) at that slot; any
// other block is dequantized row by row as it is read, x = q * scale + zero in fp32, with keys'
// scale / zero per (block, head, channel) [blocks, Hkv, D] and values' per (block, token,
// head, group of D / NG channels) [blocks, bs, Hkv, NG]; codes [blocks, bs, Hkv, D * bits / 8]
// uint8, 8 / bits per byte, lowest bits first. A chunk's rows are dequantized once into an
// fp32 buffer (codes through a per-byte table; a block's key scales converted once) and then
// scored for all G heads (attend_kivi; portable loops, no transposed SIMD scoring yet).
//
// Only light headers (not <torch/extension.h>, which alone takes ~30 s to parse): the caller
// allocates every tensor, the kernel just reads and writes data pointers.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include <torch/csrc/utils/pybind.h>

namespace {

constexpr int64_t kChunk = 128;  // tokens scored between two softmax rescales
constexpr int64_t kMinSplit = 64;  // never split a context into pieces shorter than this

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }
inline float to_float(c10::Half x) { return static_cast<float>(x); }

// ---------------------------------------------------------------------------------- dot
// q (fp32, pre-scaled) . k row; D > 0 is the compile-time head size, 0 = use d.
template <int D, typename T>
inline float dot(const float* __restrict q, const T* __restrict k, int64_t d) {
  const int64_t n = D > 0 ? D : d;
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += q[i] * to_float(k[i]);
  return s;
}

// ---------------------------------------------------------------------------------- exp
// s[i] = exp(s[i] - m) for i < n; returns the sum (fp32).
inline float exp_sub_sum(float* __restrict s, int64_t n, float m) {
  int64_t i = 0;
  float sum = 0.f;
#if WB_SIMD_LANES
  constexpr int W = simd::W;
  const simd::V mv = simd::set1(m);
  simd::V acc = simd::zero();
  for (; i + W <= n; i += W) {
    const simd::V e = simd::exp_neg(simd::sub(simd::load(s + i), mv));
    simd::store(s + i, e);
    acc = simd::add(acc, e);
  }
#ifdef __AVX512F__
  if (i < n) {  // masked tail: the same polynomial for every score
    const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 e = simd::exp_neg(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), mv));
    _mm512_mask_storeu_ps(s + i, k, e);
    acc = _mm512_mask_add_ps(acc, k, acc, e);
    i = n;
  }
#endif
  sum = simd::reduce_add(acc);
#endif
  for (; i < n; ++i) {
    s[i] = std::exp(s[i] - m);
    sum += s[i];
  }
  return sum;
}

// ---------------------------------------------------------------------------------- params
struct Params {
  const void* q;
  int64_t q_s0, q_s1;  // query strides (elements): sequence, head
  const void* k;
  const void* v;
  int64_t k_sb, k_st, k_sh;  // cache strides: block, token, head
  int64_t v_sb, v_st, v_sh;
  const int64_t* tables;
  int64_t t_s0;  // block table row stride
  const int64_t* lens;
  int64_t lens_s0;
  void* out;  // [n, Hq, D] contiguous
  int64_t n, hq, hkv, g, d, bs;
  float scale;
  // split partials: [n, Hkv, S, G] max / sum, [n, Hkv, S, G, D] unnormalised acc
  float* part_m;
  float* part_l;
  float* part_acc;
  int64_t max_splits;
  // KIVI (paged_decode_kivi): codes, fp16 scales / zeros, the residual pool and slot_of
  bool kivi;
  int64_t bits, group;  // bits per code; value channels per scale / zero
  const uint8_t* kc;
  const uint8_t* vc;
  int64_t c_sb, c_st, c_sh;  // code strides (bytes): block, token, head
  const c10::Half* ks;
  const c10::Half* kz;
  int64_t ks_sb, ks_sh;  // key scale / zero strides: block, head (channels contiguous)
  const c10::Half* vs;
  const c10::Half* vz;
  int64_t vs_sb, vs_st, vs_sh;  // value scale / zero strides: block, token, head
  const void* rk;
  const void* rv;
  int64_t r_sb, r_st, r_sh;  // residual strides: slot, token, head
  const int64_t* slot_of;
};

struct Item {
  int64_t seq, head, split, t0, t1;
};

// Online-softmax step for one chunk of scores sc[g * kChunk + j], j < len: raise the running
// max m[g] (rescaling the sum l[g] and the accumulator acc[g, :] to it), then turn the scores
// into exp(s - m) in place and add them to l. Exact: every exponent is max-subtracted.
inline void softmax_update(float* __restrict sc, int64_t len, int64_t G, int64_t d,
                           float* __restrict m, float* __restrict l, float* __restrict acc) {
  for (int64_t g = 0; g < G; ++g) {
    float* s = sc + g * kChunk;
    float mx = m[g];
    int64_t j = 0;
#if WB_SIMD_LANES
    simd::V vmx = simd::set1(mx);
    for (; j + simd::W <= len; j += simd::W) vmx = simd::max(vmx, simd::load(s + j));
    mx = simd::reduce_max(vmx);
#endif
    for (; j < len; ++j) mx = std::max(mx, s[j]);
    if (mx > m[g]) {
      const float alpha = std::exp(m[g] - mx);  // 0 on the first chunk (m = -inf)
      l[g] *= alpha;
      float* a = acc + g * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) a[i] *= alpha;
      m[g] = mx;
    }
    l[g] += exp_sub_sum(s, len, mx);
  }
}

#if WB_SIMD_LANES
// Lane j = q . rows[j] for W fp32 K rows of D values (two accumulators per row, then one
// transpose-and-add tree for all W rows).
template <int D>
inline simd::V qk_rows(const float* __restrict q, const float* const* rows) {
  constexpr int W = simd::W, C = D / W;
  simd::V qv[C], v[W];
  for (int c = 0; c < C; ++c) qv[c] = simd::load(q + W * c);
  for (int j = 0; j < W; ++j) {
    const float* r = rows[j];
    simd::V a = simd::mul(qv[0], simd::load(r));
    if constexpr (C == 1) {
      v[j] = a;
    } else {
      simd::V b = simd::mul(qv[1], simd::load(r + W));
      int c = 2;
      for (; c + 1 < C; c += 2) {
        a = simd::fmadd(qv[c], simd::load(r + W * c), a);
        b = simd::fmadd(qv[c + 1], simd::load(r + W * c + W), b);
      }
      if (c < C) a = simd::fmadd(qv[c], simd::load(r + W * c), a);
      v[j] = simd::add(a, b);
    }
  }
  return simd::transpose_sum(v);
}

// acc[g, :] += sum_j w[g * kChunk + j] * rows[j] for GT heads held in registers.
template <int D, int GT>
inline void pv_tile(float* __restrict acc, const float* __restrict w, const float* const* rows,
                    int64_t len) {
  constexpr int W = simd::W, C = D / W;
  simd::V a[GT][C];
  for (int g = 0; g < GT; ++g)
    for (int c = 0; c < C; ++c) a[g][c] = simd::load(acc + g * D + W * c);
  for (int64_t j = 0; j < len; ++j) {
    const float* r = rows[j];
    simd::V v[C];
    for (int c = 0; c < C; ++c) v[c] = simd::load(r + W * c);
    for (int g = 0; g < GT; ++g) {
      const simd::V wg = simd::set1(w[g * kChunk + j]);
      for (int c = 0; c < C; ++c) a[g][c] = simd::fmadd(wg, v[c], a[g][c]);
    }
  }
  for (int g = 0; g < GT; ++g)
    for (int c = 0; c < C; ++c) simd::store(acc + g * D + W * c, a[g][c]);
}

template <int D>
inline void pv(float* acc, const float* w, const float* const* rows, int64_t len, int64_t G) {
  // tiles of heads whose accumulators fit the register budget: with AVX-512 4 / 2 / 1 heads
  // (D = 64), 2 / 1 (D = 128), 8 / 2 / 1 (D = 32); with AVX2 2 / 1 (D = 32), else 1
  constexpr int kTile = simd::kAccFloats / D > 1 ? simd::kAccFloats / D : 1;
  int64_t g = 0;
  for (; g + kTile <= G; g += kTile) pv_tile<D, kTile>(acc + g * D, w + g * kChunk, rows, len);
  if constexpr (kTile > 2) {
    for (; g + 2 <= G; g += 2) pv_tile<D, 2>(acc + g * D, w + g * kChunk, rows, len);
  }
  for (; g < G; ++g) pv_tile<D, 1>(acc + g * D, w + g * kChunk, rows, len);
}

// attend() for fp32 and D a multiple of the vector width: K/V row pointers for the whole range
// first, then per chunk W scores at a time (one transpose tree instead of W reductions) and
// P @ V with the accumulators in registers. (Software prefetching of the next rows, and
// walking all kv heads of a block together, measured no faster: on the machines measured the
// random block reads themselves are the limit, see docs/benchmarks.md.)
// kp / vp: room for (t1 - t0) rounded up to W, plus W.
template <int D>
void attend_vec(const Params& p, const Item& it, const float* __restrict qs,
                float* __restrict acc, float* __restrict m, float* __restrict l,
                float* __restrict sc, const float** kp, const float** vp) {
  constexpr int W = simd::W;
  const int64_t G = p.g, bs = p.bs, n = it.t1 - it.t0;
  const float* kbase = static_cast<const float*>(p.k) + it.head * p.k_sh;
  const float* vbase = static_cast<const float*>(p.v) + it.head * p.v_sh;
  const int64_t* bt = p.tables + it.seq * p.t_s0;
  for (int64_t g = 0; g < G; ++g) {
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0.f;
  }
  std::fill(acc, acc + G * D, 0.f);
  if (n <= 0) return;
  int64_t j = 0;
  for (int64_t t = it.t0; t < it.t1;) {
    const int64_t off = t % bs, cnt = std::min(bs - off, it.t1 - t);
    const float* kr = kbase + bt[t / bs] * p.k_sb + off * p.k_st;
    const float* vr = vbase + bt[t / bs] * p.v_sb + off * p.v_st;
    for (int64_t c = 0; c < cnt; ++c, ++j) {
      kp[j] = kr + c * p.k_st;
      vp[j] = vr + c * p.v_st;
    }
    t += cnt;
  }
  for (; j % W != 0; ++j) {  // pad the last group of W with a real row (its lanes are unused)
    kp[j] = kp[0];
    vp[j] = vp[0];
  }
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t len = std::min(kChunk, n - c0);
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t j0 = 0; j0 < len; j0 += W) {
        simd::store(sc + g * kChunk + j0, qk_rows<D>(qs + g * D, kp + c0 + j0));
      }
    }
    softmax_update(sc, len, G, D, m, l, acc);
    pv<D>(acc, sc, vp + c0, len, G);
  }
}
#endif

// Attend query heads [head*G, head*G + G) of sequence `seq` to context positions [t0, t1).
// Leaves the running max in m, the fp32 sum in l, the unnormalised output in acc [G, D].
template <int D, typename T>
void attend(const Params& p, const Item& it, const float* __restrict qs, float* __restrict acc,
            float* __restrict m, float* __restrict l, float* __restrict sc) {
  const int64_t d = D > 0 ? D : p.d;
  const int64_t G = p.g, bs = p.bs;
  const T* kbase = static_cast<const T*>(p.k) + it.head * p.k_sh;
  const T* vbase = static_cast<const T*>(p.v) + it.head * p.v_sh;
  const int64_t* bt = p.tables + it.seq * p.t_s0;
  for (int64_t g = 0; g < G; ++g) {
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0.f;
  }
  std::fill(acc, acc + G * d, 0.f);

  for (int64_t c0 = it.t0; c0 < it.t1; c0 += kChunk) {
    const int64_t c1 = std::min(it.t1, c0 + kChunk), len = c1 - c0;
    // 1. scores sc[g * kChunk + j] = (q_g * scale) . k_{c0 + j}
    for (int64_t t = c0; t < c1;) {
      const int64_t off = t % bs, cnt = std::min(bs - off, c1 - t);
      const T* kp = kbase + bt[t / bs] * p.k_sb + off * p.k_st;
      for (int64_t j = t - c0; j < t - c0 + cnt; ++j, kp += p.k_st) {
        for (int64_t g = 0; g < G; ++g) sc[g * kChunk + j] = dot<D>(qs + g * d, kp, d);
      }
      t += cnt;
    }
    // 2. online softmax: new max, rescale what came before, exponentiate this chunk
    softmax_update(sc, len, G, d, m, l, acc);
    // 3. acc_g += p_g[j] * v_{c0 + j}
    for (int64_t t = c0; t < c1;) {
      const int64_t off = t % bs, cnt = std::min(bs - off, c1 - t);
      const T* vp = vbase + bt[t / bs] * p.v_sb + off * p.v_st;
      for (int64_t j = t - c0; j < t - c0 + cnt; ++j, vp += p.v_st) {
        for (int64_t g = 0; g < G; ++g) {
          const float w = sc[g * kChunk + j];
          float* __restrict a = acc + g * d;
#pragma omp simd
          for (int64_t i = 0; i < d; ++i) a[i] += w * to_float(vp[i]);
        }
      }
      t += cnt;
    }
  }
}

// Codes of one row (d values, 8 / BITS per byte, lowest bits first) as fp32 in dst: a byte
// at a time through a 256-entry table of its PER values (int4 / int2), or a plain widening.
template <int BITS>
inline void unpack_row(const uint8_t* __restrict c, float* __restrict dst, int64_t d) {
  constexpr int PER = 8 / BITS;
  if constexpr (PER == 1) {
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) dst[i] = static_cast<float>(c[i]);
  } else {
    static const std::vector<float> lut = [] {
      std::vector<float> t(256 * PER);
      for (int b = 0; b < 256; ++b)
        for (int k = 0; k < PER; ++k)
          t[b * PER + k] = static_cast<float>((b >> (BITS * k)) & ((1 << BITS) - 1));
      return t;
    }();
    const float* tab = lut.data();
    for (int64_t j = 0; j < d / PER; ++j) {
      const float* e = tab + c[j] * PER;
      for (int k = 0; k < PER; ++k) dst[j * PER + k] = e[k];
    }
  }
}

inline void unpack_codes(int64_t bits, const uint8_t* c, float* dst, int64_t d) {
  if (bits == 8) return unpack_row<8>(c, dst, d);
  if (bits == 4) return unpack_row<4>(c, dst, d);
  unpack_row<2>(c, dst, d);
}

// K (key = true) or V rows of context positions [t0, t0 + len) of item `it` as fp32 in
// rows[(t - t0) * d, ...]: a block holding a residual slot is copied from the residual;
// any other block's codes are dequantized, q * scale + zero, its key scale / zero converted
// once per block (sz: 2 * d floats of scratch), a value's once per group.
template <typename T>
void kivi_rows(const Params& p, const Item& it, int64_t t0, int64_t len, bool key,
               float* __restrict rows, float* __restrict sz) {
  const int64_t d = p.d, bs = p.bs, head = it.head;
  const int64_t* bt = p.tables + it.seq * p.t_s0;
  for (int64_t t = t0; t < t0 + len;) {
    const int64_t off = t % bs, cnt = std::min(bs - off, t0 + len - t);
    const int64_t block = bt[t / bs];
    const int64_t slot = p.slot_of[block];
    float* dst = rows + (t - t0) * d;
    if (slot >= 0) {
      const T* r = static_cast<const T*>(key ? p.rk : p.rv) + slot * p.r_sb + off * p.r_st +
                   head * p.r_sh;
      for (int64_t j = 0; j < cnt; ++j, r += p.r_st, dst += d)
        for (int64_t i = 0; i < d; ++i) dst[i] = to_float(r[i]);
      t += cnt;
      continue;
    }
    const uint8_t* c = (key ? p.kc : p.vc) + block * p.c_sb + off * p.c_st + head * p.c_sh;
    if (key) {
      const c10::Half* ks = p.ks + block * p.ks_sb + head * p.ks_sh;
      const c10::Half* kz = p.kz + block * p.ks_sb + head * p.ks_sh;
      float* sf = sz;
      float* zf = sz + d;
      for (int64_t i = 0; i < d; ++i) {
        sf[i] = static_cast<float>(ks[i]);
        zf[i] = static_cast<float>(kz[i]);
      }
      for (int64_t j = 0; j < cnt; ++j, c += p.c_st, dst += d) {
        unpack_codes(p.bits, c, dst, d);
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) dst[i] = dst[i] * sf[i] + zf[i];
      }
    } else {
      const int64_t gs = p.group, ng = d / gs;
      for (int64_t j = 0; j < cnt; ++j, c += p.c_st, dst += d) {
        unpack_codes(p.bits, c, dst, d);
        const int64_t at = block * p.vs_sb + (off + j) * p.vs_st + head * p.vs_sh;
        for (int64_t g = 0; g < ng; ++g) {
          const float sv = static_cast<float>(p.vs[at + g]);
          const float zv = static_cast<float>(p.vz[at + g]);
          float* x = dst + g * gs;
#pragma omp simd
          for (int64_t i = 0; i < gs; ++i) x[i] = x[i] * sv + zv;
        }
      }
    }
    t += cnt;
  }
}

// attend() over a KIVI cache: per chunk, dequantize its K rows once into `rows` [kChunk, d],
// score them for all G heads, the online-softmax step, then the V rows the same way.
template <typename T>
void attend_kivi(const Params& p, const Item& it, const float* __restrict qs,
                 float* __restrict acc, float* __restrict m, float* __restrict l,
                 float* __restrict sc, float* __restrict rows, float* __restrict sz) {
  const int64_t d = p.d, G = p.g;
  for (int64_t g = 0; g < G; ++g) {
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0.f;
  }
  std::fill(acc, acc + G * d, 0.f);
  for (int64_t c0 = it.t0; c0 < it.t1; c0 += kChunk) {
    const int64_t len = std::min(kChunk, it.t1 - c0);
    kivi_rows<T>(p, it, c0, len, true, rows, sz);
    for (int64_t j = 0; j < len; ++j)
      for (int64_t g = 0; g < G; ++g) sc[g * kChunk + j] = dot<0>(qs + g * d, rows + j * d, d);
    softmax_update(sc, len, G, d, m, l, acc);
    kivi_rows<T>(p, it, c0, len, false, rows, sz);
    for (int64_t j = 0; j < len; ++j) {
      const float* vr = rows + j * d;
      for (int64_t g = 0; g < G; ++g) {
        const float w = sc[g * kChunk + j];
        float* __restrict a = acc + g * d;
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) a[i] += w * vr[i];
      }
    }
  }
}

template <int D, typename T>
void run(const Params& p, const std::vector<Item>& items, const std::vector<int64_t>& nsplit) {
  const int64_t G = p.g, d = p.d;
  std::atomic<int64_t> next{0};
  const int64_t num_items = static_cast<int64_t>(items.size());
  int64_t total = 0;
  for (const Item& it : items) total += it.t1 - it.t0;
  // Tiny batches (one short request) are not worth waking the pool for.
  const int64_t threads =
      std::min<int64_t>(at::get_num_threads(), total * d < (1 << 14) ? 1 : num_items);

  int64_t max_len = 0;
  for (const Item& it : items) max_len = std::max(max_len, it.t1 - it.t0);

  auto worker = [&](int64_t, int64_t) {
    std::vector<float> buf(G * d * 2 + G * 2 + G * kChunk + (p.kivi ? (kChunk + 2) * d : 0));
#if WB_SIMD_LANES
    constexpr bool kFast = std::is_same_v<T, float> && D > 0 && D % simd::W == 0;
    std::vector<const float*> rows(kFast ? 2 * (max_len + 32) : 0);
#endif
    float* qs = buf.data();
    float* acc = qs + G * d;
    float* m = acc + G * d;
    float* l = m + G;
    float* sc = l + G;
    for (int64_t w; (w = next.fetch_add(1, std::memory_order_relaxed)) < num_items;) {
      const Item& it = items[w];
      const T* q = static_cast<const T*>(p.q) + it.seq * p.q_s0 + it.head * G * p.q_s1;
      for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < d; ++i) qs[g * d + i] = to_float(q[g * p.q_s1 + i]) * p.scale;
      if (p.kivi) {
        float* kv_rows = sc + G * kChunk;  // [kChunk, d], then 2 * d of scale / zero scratch
        attend_kivi<T>(p, it, qs, acc, m, l, sc, kv_rows, kv_rows + kChunk * d);
      } else {
#if WB_SIMD_LANES
        if constexpr (kFast)
          attend_vec<D>(p, it, qs, acc, m, l, sc, rows.data(), rows.data() + max_len + 32);
        else
#endif
          attend<D, T>(p, it, qs, acc, m, l, sc);
      }
      if (nsplit[it.seq] == 1) {
        T* o = static_cast<T*>(p.out) + (it.seq * p.hq + it.head * G) * d;
        for (int64_t g = 0; g < G; ++g) {
          const float inv = l[g] > 0.f ? 1.f / l[g] : 0.f;
          for (int64_t i = 0; i < d; ++i) o[g * d + i] = static_cast<T>(acc[g * d + i] * inv);
        }
      } else {
        const int64_t base = (it.seq * p.hkv + it.head) * p.max_splits + it.split;
        std::copy(m, m + G, p.part_m + base * G);
        std::copy(l, l + G, p.part_l + base * G);
        std::copy(acc, acc + G * d, p.part_acc + base * G * d);
      }
    }
  };
  if (threads <= 1) {
    worker(0, 1);
  } else {
    at::parallel_for(0, threads, 1, worker);
  }

  if (p.max_splits <= 1) return;
  // Merge the splits of each (sequence, kv head) exactly: rescale to the global max.
  at::parallel_for(0, p.n * p.hkv, 4, [&](int64_t b, int64_t e) {
    std::vector<float> o(d);
    for (int64_t sh = b; sh < e; ++sh) {
      const int64_t seq = sh / p.hkv, head = sh % p.hkv, S = nsplit[seq];
      if (S <= 1) continue;
      for (int64_t g = 0; g < G; ++g) {
        float M = -std::numeric_limits<float>::infinity();
        for (int64_t s = 0; s < S; ++s) M = std::max(M, p.part_m[(sh * p.max_splits + s) * G + g]);
        float L = 0.f;
        std::fill(o.begin(), o.end(), 0.f);
        for (int64_t s = 0; s < S; ++s) {
          const int64_t idx = (sh * p.max_splits + s) * G + g;
          if (p.part_l[idx] == 0.f) continue;  // an empty split
          const float w = std::exp(p.part_m[idx] - M);
          L += p.part_l[idx] * w;
          const float* a = p.part_acc + idx * d;
          for (int64_t i = 0; i < d; ++i) o[i] += w * a[i];
        }
        const float inv = L > 0.f ? 1.f / L : 0.f;
        T* out = static_cast<T*>(p.out) + (seq * p.hq + head * G + g) * d;
        for (int64_t i = 0; i < d; ++i) out[i] = static_cast<T>(o[i] * inv);
      }
    }
  });
}

template <typename T>
void dispatch_d(const Params& p, const std::vector<Item>& items,
                const std::vector<int64_t>& nsplit) {
  if (p.d == 32) return run<32, T>(p, items, nsplit);
  if (p.d == 64) return run<64, T>(p, items, nsplit);
  if (p.d == 128) return run<128, T>(p, items, nsplit);
  return run<0, T>(p, items, nsplit);
}

}  // namespace

namespace {

// The part both entry points share: check query / out / tables, split contexts into work
// items, fill the common Params (the caller set the cache fields) and run.
void launch(Params& p, const at::Tensor& out, const at::Tensor& query,
            const at::Tensor& block_tables, const at::Tensor& seq_lens, int64_t num_blocks,
            int64_t bs, int64_t hkv, double scale, int64_t split_tokens) {
  TORCH_CHECK(query.device().is_cpu() && out.device().is_cpu() && block_tables.device().is_cpu() &&
                  seq_lens.device().is_cpu(),
              "paged_decode: CPU tensors only");
  TORCH_CHECK(query.dim() == 3, "query must be [n, Hq, D]");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && seq_lens.scalar_type() == at::kLong,
              "block_tables and seq_lens must be int64");
  TORCH_CHECK(block_tables.dim() == 2 && seq_lens.dim() == 1, "block_tables [n, W], seq_lens [n]");
  const int64_t n = query.size(0), hq = query.size(1), d = query.size(2);
  TORCH_CHECK(hkv > 0 && hq % hkv == 0, "Hq must be a multiple of Hkv");
  TORCH_CHECK(block_tables.size(0) == n && seq_lens.size(0) == n, "one table row per query");
  TORCH_CHECK(query.stride(2) == 1, "the query's head_dim axis must be contiguous");
  TORCH_CHECK(block_tables.size(1) == 0 || block_tables.stride(1) == 1,
              "block_tables rows must be contiguous");
  TORCH_CHECK(out.scalar_type() == query.scalar_type() && out.sizes() == query.sizes() &&
                  out.is_contiguous(),
              "out must be a contiguous tensor shaped and typed like query");
  if (n == 0) return;
  const int64_t W = block_tables.size(1);
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  const int64_t t_s0 = block_tables.stride(0), l_s0 = seq_lens.stride(0);

  // Validate every block the kernel will read, and pick the context split size.
  int64_t max_len = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = lens[i * l_s0];
    TORCH_CHECK(len >= 0 && len <= W * bs, "seq_len ", len, " does not fit ", W, " blocks of ",
                bs);
    for (int64_t b = 0; b < (len + bs - 1) / bs; ++b) {
      const int64_t id = tables[i * t_s0 + b];
      TORCH_CHECK(id >= 0 && id < num_blocks, "block id ", id, " out of range");
    }
    max_len = std::max(max_len, len);
  }
  const int64_t threads = at::get_num_threads();
  int64_t part = std::max<int64_t>(max_len, 1);  // tokens per split
  if (split_tokens > 0) {
    part = split_tokens;
  } else if (split_tokens < 0 && threads > 1 && n * hkv < 4 * threads) {
    const int64_t splits = (4 * threads + n * hkv - 1) / (n * hkv);
    part = std::max<int64_t>((max_len + splits - 1) / splits, kMinSplit);
  }
  part = std::max<int64_t>((part + bs - 1) / bs * bs, bs);  // whole blocks per split

  std::vector<int64_t> nsplit(n);
  int64_t max_splits = 1;
  std::vector<Item> items;
  items.reserve(n * hkv);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = lens[i * l_s0];
    nsplit[i] = std::max<int64_t>((len + part - 1) / part, 1);
    max_splits = std::max(max_splits, nsplit[i]);
    for (int64_t s = 0; s < nsplit[i]; ++s)
      for (int64_t h = 0; h < hkv; ++h)
        items.push_back({i, h, s, s * part, std::min(len, (s + 1) * part)});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.t1 - a.t0 > b.t1 - b.t0; });

  std::vector<float> part_m, part_l, part_acc;
  if (max_splits > 1) {
    const int64_t rows = n * hkv * max_splits * (hq / hkv);
    part_m.resize(rows);
    part_l.resize(rows);
    part_acc.resize(rows * d);
    p.part_m = part_m.data();
    p.part_l = part_l.data();
    p.part_acc = part_acc.data();
  }
  p.q = query.data_ptr();
  p.q_s0 = query.stride(0);
  p.q_s1 = query.stride(1);
  p.tables = tables;
  p.t_s0 = t_s0;
  p.lens = lens;
  p.lens_s0 = l_s0;
  p.out = out.data_ptr();  // contiguous: checked above
  p.n = n;
  p.hq = hq;
  p.hkv = hkv;
  p.g = hq / hkv;
  p.d = d;
  p.bs = bs;
  p.scale = static_cast<float>(scale);
  p.max_splits = max_splits;

  switch (query.scalar_type()) {
    case at::kFloat:
      dispatch_d<float>(p, items, nsplit);
      break;
    case at::kBFloat16:
      dispatch_d<c10::BFloat16>(p, items, nsplit);
      break;
    case at::kHalf:
      dispatch_d<c10::Half>(p, items, nsplit);
      break;
    default:
      TORCH_CHECK(false, "paged_decode: unsupported dtype ", query.scalar_type());
  }
}

}  // namespace

void paged_decode(const at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache,
                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                  const at::Tensor& seq_lens, double scale, int64_t split_tokens) {
  TORCH_CHECK(k_cache.device().is_cpu() && v_cache.device().is_cpu(),
              "paged_decode: CPU tensors only");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.dim() == 4, "k/v cache must be [blocks, bs, Hkv, D]");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "k and v caches differ in shape");
  TORCH_CHECK(k_cache.scalar_type() == query.scalar_type() &&
                  v_cache.scalar_type() == query.scalar_type(),
              "query and caches must share a dtype");
  TORCH_CHECK(query.dim() == 3 && k_cache.size(3) == query.size(2),
              "head_dim differs between query and cache");
  TORCH_CHECK(k_cache.stride(3) == 1 && v_cache.stride(3) == 1,
              "the head_dim axis must be contiguous");
  Params p{};
  p.k = k_cache.data_ptr();
  p.v = v_cache.data_ptr();
  p.k_sb = k_cache.stride(0);
  p.k_st = k_cache.stride(1);
  p.k_sh = k_cache.stride(2);
  p.v_sb = v_cache.stride(0);
  p.v_st = v_cache.stride(1);
  p.v_sh = v_cache.stride(2);
  launch(p, out, query, block_tables, seq_lens, k_cache.size(0), k_cache.size(1),
         k_cache.size(2), scale, split_tokens);
}

void paged_decode_kivi(const at::Tensor& out, const at::Tensor& query, const at::Tensor& k_codes,
                       const at::Tensor& v_codes, const at::Tensor& k_scale,
                       const at::Tensor& k_zero, const at::Tensor& v_scale,
                       const at::Tensor& v_zero, const at::Tensor& res_k,
                       const at::Tensor& res_v, const at::Tensor& slot_of,
                       const at::Tensor& block_tables, const at::Tensor& seq_lens, int64_t bits,
                       double scale, int64_t split_tokens) {
  for (const at::Tensor* t : {&k_codes, &v_codes, &k_scale, &k_zero, &v_scale, &v_zero, &res_k,
                              &res_v, &slot_of})
    TORCH_CHECK(t->device().is_cpu(), "paged_decode_kivi: CPU tensors only");
  TORCH_CHECK(bits == 8 || bits == 4 || bits == 2, "bits must be 8, 4 or 2");
  TORCH_CHECK(query.dim() == 3, "query must be [n, Hq, D]");
  const int64_t d = query.size(2);
  TORCH_CHECK(k_codes.dim() == 4 && k_codes.sizes() == v_codes.sizes() &&
                  k_codes.strides() == v_codes.strides() &&
                  k_codes.scalar_type() == at::kByte && v_codes.scalar_type() == at::kByte,
              "k/v codes must be uint8 [blocks, bs, Hkv, D * bits / 8] with equal strides");
  const int64_t num_blocks = k_codes.size(0), bs = k_codes.size(1), hkv = k_codes.size(2);
  TORCH_CHECK(k_codes.size(3) * (8 / bits) == d && k_codes.stride(3) == 1,
              "codes' last dim must be head_dim * bits / 8, contiguous");
  TORCH_CHECK(k_scale.dim() == 3 && k_scale.size(0) == num_blocks && k_scale.size(1) == hkv &&
                  k_scale.size(2) == d && k_scale.stride(2) == 1 &&
                  k_zero.sizes() == k_scale.sizes() && k_zero.strides() == k_scale.strides() &&
                  k_scale.scalar_type() == at::kHalf && k_zero.scalar_type() == at::kHalf,
              "key scale / zero must be float16 [blocks, Hkv, D] with equal strides");
  TORCH_CHECK(v_scale.dim() == 4 && v_scale.size(0) == num_blocks && v_scale.size(1) == bs &&
                  v_scale.size(2) == hkv && v_scale.size(3) >= 1 &&
                  d % v_scale.size(3) == 0 && v_scale.stride(3) == 1 &&
                  v_zero.sizes() == v_scale.sizes() && v_zero.strides() == v_scale.strides() &&
                  v_scale.scalar_type() == at::kHalf && v_zero.scalar_type() == at::kHalf,
              "value scale / zero must be float16 [blocks, bs, Hkv, NG] with equal strides");
  TORCH_CHECK(res_k.dim() == 4 && res_k.sizes() == res_v.sizes() &&
                  res_k.strides() == res_v.strides() && res_k.size(1) == bs &&
                  res_k.size(2) == hkv && res_k.size(3) == d && res_k.stride(3) == 1 &&
                  res_k.scalar_type() == query.scalar_type() &&
                  res_v.scalar_type() == query.scalar_type(),
              "residual K / V must be [slots, bs, Hkv, D] in the query's dtype, equal strides");
  TORCH_CHECK(slot_of.dim() == 1 && slot_of.size(0) == num_blocks &&
                  slot_of.scalar_type() == at::kLong && slot_of.is_contiguous(),
              "slot_of must be a contiguous int64 [blocks]");
  const int64_t num_slots = res_k.size(0);
  const int64_t* so = slot_of.data_ptr<int64_t>();
  for (int64_t b = 0; b < num_blocks; ++b)
    TORCH_CHECK(so[b] < num_slots, "slot_of[", b, "] = ", so[b], " is not a residual slot");
  Params p{};
  p.kivi = true;
  p.bits = bits;
  p.group = d / v_scale.size(3);
  p.kc = k_codes.data_ptr<uint8_t>();
  p.vc = v_codes.data_ptr<uint8_t>();
  p.c_sb = k_codes.stride(0);
  p.c_st = k_codes.stride(1);
  p.c_sh = k_codes.stride(2);
  p.ks = k_scale.data_ptr<c10::Half>();
  p.kz = k_zero.data_ptr<c10::Half>();
  p.ks_sb = k_scale.stride(0);
  p.ks_sh = k_scale.stride(1);
  p.vs = v_scale.data_ptr<c10::Half>();
  p.vz = v_zero.data_ptr<c10::Half>();
  p.vs_sb = v_scale.stride(0);
  p.vs_st = v_scale.stride(1);
  p.vs_sh = v_scale.stride(2);
  p.rk = res_k.data_ptr();
  p.rv = res_v.data_ptr();
  p.r_sb = res_k.stride(0);
  p.r_st = res_k.stride(1);
  p.r_sh = res_k.stride(2);
  p.slot_of = so;
  launch(p, out, query, block_tables, seq_lens, num_blocks, bs, hkv, scale, split_tokens);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "CPU paged-attention decode (in-place block reads)",
        py::arg("out"), py::arg("query"), py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"),
        py::arg("seq_lens"), py::arg("scale"), py::arg("split_tokens") = -1,
        py::call_guard<py::gil_scoped_release>());
  m.def("paged_decode_kivi", &paged_decode_kivi,
        "CPU paged-attention decode over a KIVI low-bit KV cache (in-place dequantizing reads)",
        py::arg("out"), py::arg("query"), py::arg("k_codes"), py::arg("v_codes"),
        py::arg("k_scale"), py::arg("k_zero"), py::arg("v_scale"), py::arg("v_zero"),
        py::arg("res_k"), py::arg("res_v"), py::arg("slot_of"), py::arg("block_tables"),
        py::arg("seq_lens"), py::arg("bits"), py::arg("scale"), py::arg("split_tokens") = -1,
        py::call_guard<py::gil_scoped_release>());
  m.def("simd_lanes", [] { return WB_SIMD_LANES; },
        "fp32 lanes of the vector path this build has (16 AVX-512, 8 AVX2, 0 portable only)");
}
