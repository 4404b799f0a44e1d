#pragma once
// CRC32C (Castagnoli, the polynomial of iSCSI, ext4 metadata and Google's crc32c library), used to
// checksum checkpoint data: SSE4.2's crc32 instruction on x86, the ARMv8 CRC instructions on
// aarch64 (chosen at run time), a table otherwise — all bit-identical.
#include <cstddef>
#include <cstdint>

namespace so {

// CRC32C of n bytes continuing `crc` (0 to start): crc32c(b, crc32c(a)) == crc32c(a || b).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace so
