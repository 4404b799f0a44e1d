#include "so/data/megatron_dataset.h"

#include <cstring>

#include "so/core/error.h"

namespace so {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Bytes per token of an integer dtype code; 0 for the float codes (6, 7), which hold no token ids.
int integer_bytes(int code) {
  switch (code) {
    case 1:
    case 2: return 1;
    case 3:
    case 8: return 2;
    case 4: return 4;
    case 5: return 8;
    default: return 0;
  }
}

}  // namespace

MegatronIndexedDataset::MegatronIndexedDataset(const std::string& prefix)
    : prefix_(prefix), bin_(prefix + ".bin"), idx_(prefix + ".idx") {
  const std::string idx = prefix + ".idx";
  const uint8_t* h = idx_.data();
  SO_CHECK(idx_.size() >= kHeaderBytes && std::memcmp(h, kMagic, 9) == 0, "'", idx,
           "' does not start with Megatron's index magic MMIDIDX (is it a Megatron-LM .idx file?)");
  const uint64_t version = load<uint64_t>(h + 9);
  SO_CHECK(version == 1, "'", idx, "' has index version ", version, "; Megatron-LM writes (and this reads) version 1");
  dtype_code_ = h[17];
  dtype_bytes_ = integer_bytes(dtype_code_);
  SO_CHECK(dtype_bytes_ > 0, "'", idx, "' stores tokens of dtype code ", dtype_code_,
           dtype_code_ == 6 || dtype_code_ == 7 ? " (a float type): token ids must be integers" : " (unknown; 1-8)");
  const uint64_t seqs = load<uint64_t>(h + 18), docs = load<uint64_t>(h + 26);
  // Compared as counts: a crafted count times the entry size could wrap around.
  const uint64_t room = (idx_.size() - kHeaderBytes);
  SO_CHECK(seqs <= room / 12 && docs <= (room - seqs * 12) / 8, "'", idx, "' claims ", seqs, " sequences and ", docs,
           " document indices but holds ", idx_.size(), " bytes (truncated or corrupt)");
  SO_CHECK(docs >= 2, "'", idx, "' has ", docs, " document indices: not even one document");
  const uint8_t* lengths = h + kHeaderBytes;
  const uint8_t* pointers = lengths + 4 * seqs;
  const uint8_t* doc_index = pointers + 8 * seqs;
  // Sequence s starts where the last ended, in token units (the .bin is the tokens back to back).
  std::vector<int64_t> seq_start(seqs + 1, 0);
  for (uint64_t s = 0; s < seqs; ++s) {
    const int32_t len = load<int32_t>(lengths + 4 * s);
    const int64_t ptr = load<int64_t>(pointers + 8 * s);
    SO_CHECK(len >= 0, "'", idx, "': sequence ", s, " has length ", len);
    SO_CHECK(ptr == seq_start[s] * dtype_bytes_, "'", idx, "': sequence ", s, " starts at byte ", ptr, " of the .bin; ",
             "the sequences before it end at byte ", seq_start[s] * dtype_bytes_, " (not back to back: corrupt)");
    seq_start[s + 1] = seq_start[s] + len;
  }
  tokens_ = seq_start[seqs];
  SO_CHECK(static_cast<uint64_t>(tokens_) * dtype_bytes_ == bin_.size(), "'", prefix, ".bin' has ", bin_.size(),
           " bytes; its index describes ", tokens_, " tokens of ", dtype_bytes_, " bytes (", tokens_ * dtype_bytes_,
           "): the pair does not belong together, or one is truncated");
  int64_t last = -1;
  for (uint64_t d = 0; d < docs; ++d) {
    const int64_t s = load<int64_t>(doc_index + 8 * d);
    SO_CHECK(s > last && s <= static_cast<int64_t>(seqs) && (d > 0 || s == 0) &&
                 (d + 1 < docs || s == static_cast<int64_t>(seqs)),
             "'", idx, "': document index ", d, " is ", s, "; they must rise from 0 to the sequence count ", seqs);
    if (d + 1 < docs) doc_offsets_.push_back(seq_start[s]);
    last = s;
  }
}

void MegatronIndexedDataset::read(int64_t offset, int64_t count, int32_t* out) const {
  SO_CHECK(offset >= 0 && count >= 0 && offset + count <= tokens_, describe(), ": read of [", offset, ", ",
           offset + count, ") past its ", tokens_, " tokens");
  const uint8_t* p = bin_.data() + offset * dtype_bytes_;
  for (int64_t i = 0; i < count; ++i, p += dtype_bytes_) {
    int64_t v = 0;
    switch (dtype_code_) {
      case 1: v = *p; break;
      case 2: v = static_cast<int8_t>(*p); break;
      case 3: v = load<int16_t>(p); break;
      case 8: v = load<uint16_t>(p); break;
      case 4: v = load<int32_t>(p); break;
      default: v = load<int64_t>(p); break;
    }
    SO_CHECK(v >= 0 && v <= INT32_MAX, describe(), ": token ", v, " at index ", offset + i, " is not a token id");
    out[i] = static_cast<int32_t>(v);
  }
}

}  // namespace so
