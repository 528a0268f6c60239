// safetensors files: memory-mapped reading (zero-copy) and atomic writing.
//
// Layout: u64 little-endian header length N, N bytes of JSON header
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data section; offsets are relative to the start of the data section.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/file.h"

namespace atlas {

// A tensor inside a mapped file (or any borrowed buffer). Does not own its bytes.
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // where it came from, for error messages

  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps the file and validates the header: JSON well-formed, every dtype known, every
  // shape non-negative, offsets inside the file and consistent with dtype x shape, no
  // overlaps. Any violation is an atlas::Error naming the file (and tensor/field).
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }  // in header order
  const TensorView* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t file_size() const { return size_; }
  uint64_t header_size() const { return header_len_ + 8; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  uint64_t size_ = 0, header_len_ = 0;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write; data must hold numel * dtype_size bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Streaming writer: the header (names, dtypes, shapes, offsets) is fixed up front, then each
// tensor's bytes are appended in header order, in as many pieces as the caller likes, so a
// multi-gigabyte shard never has to sit in memory. Atomic like AtomicFile: nothing appears at
// PATH unless commit() succeeds after every byte was written.
struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  int64_t numel() const;
  uint64_t nbytes() const;
};

class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, std::vector<TensorSpec> specs,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends bytes of the current tensor (in header order); pieces may not straddle tensors.
  void write(const void* data, size_t n);
  // Index of the tensor the next write() belongs to (== specs.size() when all are written).
  size_t current() const { return cur_; }
  void commit();

 private:
  std::unique_ptr<AtomicFile> out_;
  std::vector<TensorSpec> specs_;
  size_t cur_ = 0;
  uint64_t written_in_cur_ = 0;
  void skip_empty();
};

// Serialised header (u64 length + padded JSON) for these tensors, as the writer emits it.
std::string safetensors_header(const std::vector<TensorSpec>& specs,
                               const std::map<std::string, std::string>& metadata);

// Writes tensors in the order given (atomically: temp file + rename). The header is
// serialised deterministically (keys in the given order, no whitespace) and padded with
// spaces to a multiple of 8 bytes, so equal inputs give byte-identical files.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads a tensor of any float dtype (F32/F16/BF16) into float32.
std::vector<float> to_f32(const TensorView& t);

}  // namespace atlas
