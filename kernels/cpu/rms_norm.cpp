// CPU RMSNorm in fp32, with vLLM's fused residual add, in one pass over each row.
// Built by kernels/cpu/rms_norm.py with -ffp-contract=off; its twin is
// workbench.layers.norm.RMSNorm's torch ops (HF's: variance = mean(x^2) in fp32,
// out = weight * (x * rsqrt(variance + eps))):
//
//   rms_norm(out, x, weight, eps)                   out = norm(x)
//   fused_add_rms_norm_(x, residual, weight, eps)   residual <- x + residual; x <- norm(residual)
//
// Every elementwise step rounds as torch's ops do (the add, x * r, weight * (x * r);
// rsqrt = 1 / sqrt as ATen's vectorised rsqrt); only the order of the sum of squares differs
// (torch's cascade sum vs 16 lanes here), so a row's scale can differ in the last bit: the
// tests bound it. Rows are [T, D] with any row stride and contiguous columns.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstdint>

#include <torch/csrc/utils/pybind.h>

namespace {

inline float sum_squares(const float* __restrict x, int64_t d) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < d; ++i) s += x[i] * x[i];
  return s;
}

inline float inv_rms(float sum_sq, int64_t d, double eps) {
  const float variance = sum_sq / static_cast<float>(d);
  return 1.0f / std::sqrt(variance + static_cast<float>(eps));
}

inline void scale_row(float* __restrict out, const float* __restrict x,
                      const float* __restrict w, float r, int64_t d) {
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) out[i] = w[i] * (x[i] * r);
}

void rms_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps) {
  const int64_t rows = x.size(0), d = x.size(1), sx = x.stride(0), so = out.stride(0);
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* xr = xp + t * sx;
      scale_row(op + t * so, xr, wp, inv_rms(sum_squares(xr, d), d, eps), d);
    }
  });
}

void fused_add_rms_norm_(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight,
                         double eps) {
  const int64_t rows = x.size(0), d = x.size(1), sx = x.stride(0), sr = residual.stride(0);
  float* xp = x.data_ptr<float>();
  float* rp = residual.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* __restrict xr = xp + t * sx;
      float* __restrict rr = rp + t * sr;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) rr[i] = xr[i] + rr[i];
      scale_row(xr, rr, wp, inv_rms(sum_squares(rr, d), d, eps), d);
    }
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "out = RMSNorm(x) * weight (fp32 rows)", pybind11::arg("out"),
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("eps"),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("fused_add_rms_norm_", &fused_add_rms_norm_,
        "residual += x; x = RMSNorm(residual) * weight, in place (fp32 rows)",
        pybind11::arg("x"), pybind11::arg("residual"), pybind11::arg("weight"),
        pybind11::arg("eps"), pybind11::call_guard<pybind11::gil_scoped_release>());
}
