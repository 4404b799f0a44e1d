#pragma once
// Functions that the CPU backend and the CUDA kernels share (one definition, the same bits on both)
// are marked SO_HOST_DEVICE: __host__ __device__ under nvcc, nothing elsewhere.
#if defined(__CUDACC__)
#define SO_HOST_DEVICE __host__ __device__
#else
#define SO_HOST_DEVICE
#endif
