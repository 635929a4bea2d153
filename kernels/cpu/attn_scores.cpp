// CPU attention scores for KV eviction (H2O, SnapKV, PyramidKV): the softmax probabilities a
// few query tokens give every cached key, summed over those queries, per query head. Reads K
// rows in place through the block table (no gather). Built by attn_scores.py with
// torch.utils.cpp_extension.load_inline; the pure-PyTorch twin is
// workbench.attention.scores.window_probs_torch.
//
//   out          [n, Hq, S_out] float32, contiguous, zero-filled by the caller
//   query        [T, Hq, D]               (any strides, last dim contiguous)
//   k_cache      [num_blocks, bs, Hkv, D] (any strides, last dim contiguous)
//   block_tables [n, W] int64             job i's context position p lives in block
//                                         block_tables[i][p / bs], offset p % bs
//   seq_lens     [n] int64                job i's context length (keys 0 .. seq_len - 1)
//   q_start      [n] int64                job i's queries are rows q_start .. q_start+q_count-1
//   q_count      [n] int64                of `query`; query j sits at context position
//                                         seq_len - q_count + j and sees keys 0 .. that (causal)
//   key_end      [n] int64                only keys p < key_end are written to out (the softmax
//                                         still normalises over every key the query sees)
//
//   out[i, h, p] = sum_j softmax_p(scale * q_{i,j,h} . k_{i,p,h / G})   for p < key_end[i]
//
// q head h reads kv head h / G (G = Hq / Hkv). Work items are (job, kv head): an item owns
// the G output rows of its heads, so no two threads write the same row. An item takes its
// queries in tiles of kQueryTile (x G heads) and its keys in chunks of kKeyChunk: a chunk's
// K rows are read once per tile (bf16 / fp16 upcast to fp32) and transposed, then every query
// of the tile scores the whole chunk with vector FMAs (no horizontal sums) into scratch
// logits; then per query: max, exp, sum, and exp / sum added to out.
//
// Light headers only (not <torch/extension.h>): the caller allocates every tensor.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <torch/csrc/utils/pybind.h>

namespace {

constexpr int64_t kQueryTile = 16;  // queries scored together (each K row read once per tile)
constexpr int64_t kKeyChunk = 64;  // keys transposed and scored together

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }
inline float to_float(c10::Half x) { return static_cast<float>(x); }

struct Params {
  float* out;
  int64_t o_s0, o_s1;  // out strides: job, head (the key axis is contiguous)
  const void* q;
  int64_t q_s0, q_s1;  // query strides: token, head
  const void* k;
  int64_t k_sb, k_st, k_sh;  // cache strides: block, token, head
  const int64_t* tables;
  int64_t t_s0;
  const int64_t* seq_lens;
  const int64_t* q_start;
  const int64_t* q_count;
  const int64_t* key_end;
  int64_t n, hq, hkv, g, d, bs;
  float scale;
};

template <typename T>
void run(const Params& p) {
  const T* q_base = static_cast<const T*>(p.q);
  const T* k_base = static_cast<const T*>(p.k);
  at::parallel_for(0, p.n * p.hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<const T*> rows;
    std::vector<float> qf, logits, kt(p.d * kKeyChunk);
    std::vector<int64_t> last;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / p.hkv, kvh = item % p.hkv;
      const int64_t seq_len = p.seq_lens[i], nq = p.q_count[i];
      const int64_t key_end = std::min(p.key_end[i], seq_len);
      if (nq <= 0 || seq_len <= 0 || key_end <= 0) continue;
      // K row pointers of this job and kv head, in context order
      rows.resize(seq_len);
      const int64_t* table = p.tables + i * p.t_s0;
      for (int64_t pos = 0; pos < seq_len; ++pos) {
        rows[pos] = k_base + table[pos / p.bs] * p.k_sb + (pos % p.bs) * p.k_st + kvh * p.k_sh;
      }
      for (int64_t j0 = 0; j0 < nq; j0 += kQueryTile) {
        // a tile of queries: r = j * G + g (query j0 + j, head kvh * G + g), fp32 copies
        const int64_t jn = std::min(kQueryTile, nq - j0), nr = jn * p.g;
        const int64_t top = seq_len - nq + j0 + jn;  // keys the tile's last query sees
        qf.resize(nr * p.d);
        last.resize(nr);
        logits.resize(nr * top);
        for (int64_t j = 0; j < jn; ++j) {
          for (int64_t g = 0; g < p.g; ++g) {
            const int64_t r = j * p.g + g;
            const T* qr = q_base + (p.q_start[i] + j0 + j) * p.q_s0 + (kvh * p.g + g) * p.q_s1;
            for (int64_t x = 0; x < p.d; ++x) qf[r * p.d + x] = to_float(qr[x]);
            last[r] = seq_len - nq + j0 + j;
          }
        }
        // scores, kKeyChunk keys at a time: the chunk's K rows upcast and transposed once
        // (kt[x][c] = k_{c0 + c}[x]), then per query acc[c] += q[x] * kt[x][c] over x: whole
        // vectors of keys, no horizontal sums
        for (int64_t c0 = 0; c0 < top; c0 += kKeyChunk) {
          const int64_t cn = std::min(kKeyChunk, top - c0);
          for (int64_t c = 0; c < cn; ++c) {
            const T* kr = rows[c0 + c];
            for (int64_t x = 0; x < p.d; ++x) kt[x * kKeyChunk + c] = to_float(kr[x]);
          }
          if (cn < kKeyChunk) {
            for (int64_t x = 0; x < p.d; ++x) {
              std::fill(kt.begin() + x * kKeyChunk + cn, kt.begin() + (x + 1) * kKeyChunk, 0.f);
            }
          }
          for (int64_t r = 0; r < nr; ++r) {
            if (last[r] < c0) continue;
            float acc[kKeyChunk] = {};
            const float* qr = qf.data() + r * p.d;
            for (int64_t x = 0; x < p.d; ++x) {
              const float qx = qr[x];
              const float* ktx = kt.data() + x * kKeyChunk;
#pragma omp simd
              for (int64_t c = 0; c < kKeyChunk; ++c) acc[c] += qx * ktx[c];
            }
            const int64_t valid = std::min(cn, last[r] + 1 - c0);
            float* lr = logits.data() + r * top + c0;
            for (int64_t c = 0; c < valid; ++c) lr[c] = acc[c] * p.scale;
          }
        }
        // softmax per query over the keys it sees; probabilities added to its head's row
        for (int64_t r = 0; r < nr; ++r) {
          float* lr = logits.data() + r * top;
          const int64_t n_keys = last[r] + 1;
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t pos = 0; pos < n_keys; ++pos) mx = std::max(mx, lr[pos]);
          float sum = 0.f;
          for (int64_t pos = 0; pos < n_keys; ++pos) {
            lr[pos] = std::exp(lr[pos] - mx);
            sum += lr[pos];
          }
          const float inv = 1.f / sum;
          float* o = p.out + i * p.o_s0 + (kvh * p.g + r % p.g) * p.o_s1;
          const int64_t upto = std::min(key_end, n_keys);
#pragma omp simd
          for (int64_t pos = 0; pos < upto; ++pos) o[pos] += lr[pos] * inv;
        }
      }
    }
  });
}

void attn_scores(at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache,
                 const at::Tensor& block_tables, const at::Tensor& seq_lens,
                 const at::Tensor& q_start, const at::Tensor& q_count, const at::Tensor& key_end,
                 double scale) {
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.dim() == 3 && out.stride(2) == 1,
              "attn_scores: out must be float32 [n, Hq, S] with a contiguous last dim");
  TORCH_CHECK(query.dim() == 3 && query.stride(2) == 1, "attn_scores: query [T, Hq, D]");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.stride(3) == 1,
              "attn_scores: k_cache [num_blocks, bs, Hkv, D]");
  TORCH_CHECK(k_cache.scalar_type() == query.scalar_type(), "attn_scores: dtype mismatch");
  const int64_t n = out.size(0), hq = query.size(1), hkv = k_cache.size(2);
  TORCH_CHECK(out.size(1) == hq && hq % hkv == 0, "attn_scores: head counts");
  TORCH_CHECK(query.size(2) == k_cache.size(3), "attn_scores: head_dim mismatch");
  for (const at::Tensor* t : {&seq_lens, &q_start, &q_count, &key_end}) {
    TORCH_CHECK(t->scalar_type() == at::kLong && t->dim() == 1 && t->size(0) == n &&
                    t->is_contiguous(),
                "attn_scores: seq_lens / q_start / q_count / key_end must be int64 [n]");
  }
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.dim() == 2 &&
                  block_tables.size(0) == n && (block_tables.size(1) == 0 ||
                                                block_tables.stride(1) == 1),
              "attn_scores: block_tables int64 [n, W] with contiguous rows");
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  const int64_t* ends = key_end.data_ptr<int64_t>();
  const int64_t* starts = q_start.data_ptr<int64_t>();
  const int64_t* counts = q_count.data_ptr<int64_t>();
  const int64_t bs = k_cache.size(1);
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(lens[i] >= 0 && (lens[i] + bs - 1) / bs <= block_tables.size(1),
                "attn_scores: seq_len ", lens[i], " needs more block table columns");
    TORCH_CHECK(std::min(ends[i], lens[i]) <= out.size(2), "attn_scores: out too short");
    TORCH_CHECK(counts[i] <= lens[i] && starts[i] >= 0 &&
                    starts[i] + counts[i] <= query.size(0),
                "attn_scores: query rows of job ", i, " out of range");
  }

  Params p{};
  p.out = out.data_ptr<float>();
  p.o_s0 = out.stride(0);
  p.o_s1 = out.stride(1);
  p.q = query.data_ptr();
  p.q_s0 = query.stride(0);
  p.q_s1 = query.stride(1);
  p.k = k_cache.data_ptr();
  p.k_sb = k_cache.stride(0);
  p.k_st = k_cache.stride(1);
  p.k_sh = k_cache.stride(2);
  p.tables = block_tables.data_ptr<int64_t>();
  p.t_s0 = block_tables.size(1) ? block_tables.stride(0) : 0;
  p.seq_lens = lens;
  p.q_start = starts;
  p.q_count = counts;
  p.key_end = ends;
  p.n = n;
  p.hq = hq;
  p.hkv = hkv;
  p.g = hq / hkv;
  p.d = query.size(2);
  p.bs = bs;
  p.scale = static_cast<float>(scale);

  switch (query.scalar_type()) {
    case at::kFloat:
      run<float>(p);
      break;
    case at::kBFloat16:
      run<c10::BFloat16>(p);
      break;
    case at::kHalf:
      run<c10::Half>(p);
      break;
    default:
      TORCH_CHECK(false, "attn_scores: unsupported dtype ", query.scalar_type());
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attn_scores", &attn_scores,
        "out[i, h, p] += attention probability of job i's queries (head h) on key p",
        pybind11::arg("out"), pybind11::arg("query"), pybind11::arg("k_cache"),
        pybind11::arg("block_tables"), pybind11::arg("seq_lens"), pybind11::arg("q_start"),
        pybind11::arg("q_count"), pybind11::arg("key_end"), pybind11::arg("scale"),
        pybind11::call_guard<pybind11::gil_scoped_release>());
}
