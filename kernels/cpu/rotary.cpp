// CPU rotary embedding (Neox / Hugging Face rotate_half style), in place on q and k.
// Built by kernels/cpu/rotary.py with -ffp-contract=off; its twin is
// workbench.layers.rotary.RotaryEmbedding.forward (the torch ops), and the results are
// bitwise equal: for each head, with h = head_size / 2 and c, s the position's cos / sin rows,
//
//   x[i]     <- x[i] * c[i]     - x[i + h] * s[i]        (torch: x*cos + (-x2)*sin)
//   x[i + h] <- x[i + h] * c[i + h] + x[i] * s[i + h]    (torch: x*cos + x1*sin)
//
// each product rounded to fp32 and then added, as torch's separate mul / mul / add do (a
// fused multiply-add would round once and differ in the last bit: hence no contraction).
//
//   positions  [T] int64, each < rows of the tables
//   q          [T, Hq * D] fp32, any row stride, rows contiguous
//   k          [T, Hk * D] fp32, any row stride, rows contiguous
//   cos / sin  [P, D] fp32 contiguous
// Tokens are spread over torch's OpenMP pool (at::parallel_for).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <cstdint>

#include <torch/csrc/utils/pybind.h>

namespace {

inline void rotate_rows(float* x, int64_t heads, int64_t d, const float* c, const float* s) {
  const int64_t h = d / 2;
  for (int64_t head = 0; head < heads; ++head) {
    float* __restrict lo = x + head * d;
    float* __restrict hi = lo + h;
    for (int64_t i = 0; i < h; ++i) {
      const float a = lo[i];
      const float b = hi[i];
      const float lo_cos = a * c[i];
      const float lo_sin = b * s[i];
      const float hi_cos = b * c[i + h];
      const float hi_sin = a * s[i + h];
      lo[i] = lo_cos - lo_sin;
      hi[i] = hi_cos + hi_sin;
    }
  }
}

void rotary_neox_(const at::Tensor& positions, at::Tensor& q, at::Tensor& k,
                  const at::Tensor& cos_cache, const at::Tensor& sin_cache, int64_t head_size) {
  const int64_t tokens = positions.size(0);
  const int64_t hq = q.size(1) / head_size;
  const int64_t hk = k.size(1) / head_size;
  const int64_t sq = q.stride(0);
  const int64_t sk = k.stride(0);
  const int64_t* pos = positions.data_ptr<int64_t>();
  float* qp = q.data_ptr<float>();
  float* kp = k.data_ptr<float>();
  const float* cp = cos_cache.data_ptr<float>();
  const float* sp = sin_cache.data_ptr<float>();
  at::parallel_for(0, tokens, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cp + pos[t] * head_size;
      const float* s = sp + pos[t] * head_size;
      rotate_rows(qp + t * sq, hq, head_size, c, s);
      rotate_rows(kp + t * sk, hk, head_size, c, s);
    }
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rotary_neox_", &rotary_neox_, "in-place Neox rotary embedding of q and k (fp32)",
        pybind11::arg("positions"), pybind11::arg("q"), pybind11::arg("k"),
        pybind11::arg("cos_cache"), pybind11::arg("sin_cache"), pybind11::arg("head_size"),
        pybind11::call_guard<pybind11::gil_scoped_release>());
}
