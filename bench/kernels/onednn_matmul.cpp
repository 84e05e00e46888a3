#include "onednn_matmul.h"

#include <vector>

#include <oneapi/dnnl/dnnl.hpp>
#ifdef MOESERVE_BENCH_OPENMP
#include <omp.h>
#endif

namespace moeserve::bench {

using dnnl::memory;

struct OneDnnMatmul::Impl {
  int64_t m, n, k;
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  std::vector<memory> weights;
};

OneDnnMatmul::OneDnnMatmul(int64_t m, int64_t n, int64_t k) : impl_(new Impl) {
  Impl& s = *impl_;
  s.m = m, s.n = n, s.k = k;
  memory::desc src({m, k}, memory::data_type::bf16, memory::format_tag::ab);
  memory::desc wei({k, n}, memory::data_type::bf16, memory::format_tag::any);
  memory::desc dst({m, n}, memory::data_type::f32, memory::format_tag::ab);
  s.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), s.eng);
  s.prim = dnnl::matmul(s.pd);
}

OneDnnMatmul::~OneDnnMatmul() = default;

void OneDnnMatmul::add_weight(const uint16_t* w) {
  Impl& s = *impl_;
  // W [n, k] row-major is the {k, n} matrix in format "ba".
  memory user({{s.k, s.n}, memory::data_type::bf16, memory::format_tag::ba}, s.eng,
              const_cast<uint16_t*>(w));
  memory packed(s.pd.weights_desc(), s.eng);
  dnnl::reorder(user, packed).execute(s.stream, user, packed);
  s.stream.wait();
  s.weights.push_back(packed);
}

int OneDnnMatmul::copies() const {
  return int(impl_->weights.size());
}

void OneDnnMatmul::run(int copy, const uint16_t* x, float* y) {
  Impl& s = *impl_;
  memory src({{s.m, s.k}, memory::data_type::bf16, memory::format_tag::ab}, s.eng,
             const_cast<uint16_t*>(x));
  memory dst({{s.m, s.n}, memory::data_type::f32, memory::format_tag::ab}, s.eng, y);
  s.prim.execute(
      s.stream,
      {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, s.weights[size_t(copy)]}, {DNNL_ARG_DST, dst}});
  s.stream.wait();
}

void set_onednn_threads(int threads) {
#ifdef MOESERVE_BENCH_OPENMP
  omp_set_num_threads(threads);
#else
  (void)threads;
#endif
}

}  // namespace moeserve::bench
