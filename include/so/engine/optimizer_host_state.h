#pragma once
// The host memory of an offloaded optimizer: one HostBuffer per stream GraceAdam reads or writes
// (fp32 master weights, both moments, the gradients as they crossed the link, the bf16 weights for
// the device, and the exact rollback's snapshot of p, m, v), NUMA-placed and pinned alike, each
// with its own skew (stream_skew) so no two streams share an address modulo 4 KiB or 2 MiB, and
// on transparent huge pages where the kernel offers them (HostBuffer).
#include <cstdint>

#include "so/backend/host_buffer.h"
#include "so/core/dtype.h"
#include "so/optim/adamw.h"

namespace so {

class Backend;

struct OptimizerHostStateSpec {
  int64_t elements = 0;
  DType grad_dtype = DType::F32;
  bool has_out = false;  // the new weights are also written in out_dtype (cast on the host)
  DType out_dtype = DType::BF16;
  bool snapshot = false;  // exact rollback: a copy of p, m, v before each speculative step
  int numa_node = -1;
  Backend* pin_with = nullptr;  // pins the buffers the copy engines touch (not the snapshot)
  bool skew = true;             // false: every stream page-aligned (so_bench adam --layout aligned)
  bool huge_pages = true;       // false: ordinary pages, never madvised (so_bench adam --pages small)
};

class OptimizerHostState {
 public:
  OptimizerHostState() = default;
  explicit OptimizerHostState(const OptimizerHostStateSpec& spec);

  const OptimizerHostStateSpec& spec() const { return spec_; }
  size_t bytes() const;
  float* p() const { return p_.as<float>(); }
  float* m() const { return m_.as<float>(); }
  float* v() const { return v_.as<float>(); }
  void* grads() const { return grads_.data(); }
  void* out() const { return out_.data(); }
  bool huge_pages() const { return p_.huge_pages(); }  // the streams were madvised (HostBuffer::huge_pages)
  double huge_page_share() const;  // of the step's streams (p, m, v, grads, out), backed by huge pages now
  // GraceAdam's view of the arrays from element `first` on; the snapshot's only when asked for.
  AdamArrays arrays(int64_t first, bool with_snapshot) const;

 private:
  OptimizerHostStateSpec spec_;
  HostBuffer p_, m_, v_, grads_, out_, snapshot_p_, snapshot_m_, snapshot_v_;
};

}  // namespace so
