#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/bf16.h"
#include "core/error.h"
#include "core/json.h"

namespace atlas {
namespace {

// The safetensors format itself caps the header at 100 MB; anything larger is corruption
// (or a file that is not safetensors at all), not a header worth parsing.
constexpr uint64_t kMaxHeaderLen = 100'000'000;

// numel * elem_size with overflow detection; nullopt when it does not fit in 63 bits.
std::optional<uint64_t> checked_bytes(const std::vector<int64_t>& shape, size_t elem) {
  __int128 n = elem;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    n *= d;
    if (n > std::numeric_limits<int64_t>::max()) return std::nullopt;
  }
  return uint64_t(n);
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t TensorSpec::nbytes() const { return uint64_t(numel()) * dtype_size(dtype); }

// ---- reading ---------------------------------------------------------------------------

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, {}, std::string("cannot open: ") + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail(path, {}, std::string("cannot stat: ") + std::strerror(e));
  }
  f->size_ = uint64_t(st.st_size);
  if (f->size_ < 8) {
    ::close(fd);
    fail(path, "header", "file is " + std::to_string(f->size_) +
                             " bytes, too short for the 8-byte header length (truncated or not safetensors)");
  }
  // Read-only private mapping: the weights are never written through it, and pages are
  // shared with the page cache (zero-copy).
  void* m = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  ::close(fd);
  if (m == MAP_FAILED) fail(path, {}, std::string("cannot mmap: ") + std::strerror(map_errno));
  f->map_ = m;
  const auto* base = static_cast<const uint8_t*>(m);

  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];  // little-endian u64
  f->header_len_ = n;
  if (n > kMaxHeaderLen)
    fail(path, "header", "header length " + std::to_string(n) + " exceeds the format's 100 MB limit");
  if (n > f->size_ - 8)
    fail(path, "header",
         "header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(f->size_) +
             " bytes; truncated or not safetensors)");

  std::string text(reinterpret_cast<const char*>(base + 8), n);
  // ordered_json keeps the file's own key order, which tensors() promises.
  ojson h;
  try {
    h = ojson::parse(text);
  } catch (const ojson::parse_error& e) {
    fail(path, "header", std::string("malformed header JSON: ") + e.what());
  }
  if (!h.is_object()) fail(path, "header", "header JSON must be an object, got " + std::string(h.type_name()));

  const uint64_t data_start = 8 + n;
  const uint64_t data_len = f->size_ - data_start;
  const uint8_t* data = base + data_start;

  struct Range {
    uint64_t begin, end;
    size_t idx;
  };
  std::vector<Range> ranges;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const ojson& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(path, "__metadata__", "must be an object of strings");
      for (auto m2 = v.begin(); m2 != v.end(); ++m2) {
        if (!m2.value().is_string()) fail(path, "__metadata__." + m2.key(), "metadata values must be strings");
        f->metadata_[m2.key()] = m2.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) fail(path, name, "tensor entry must be an object");
    for (auto k = v.begin(); k != v.end(); ++k)
      if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets")
        fail(path, name, "unknown key \"" + k.key() + "\" in tensor entry");
    if (!v.contains("dtype") || !v["dtype"].is_string()) fail(path, name + ".dtype", "missing or not a string");
    std::string dts = v["dtype"].get<std::string>();
    auto dt = parse_dtype(dts);
    if (!dt) fail(path, name + ".dtype", "unknown dtype \"" + dts + "\"");
    if (!v.contains("shape") || !v["shape"].is_array()) fail(path, name + ".shape", "missing or not an array");
    TensorView t;
    t.name = name;
    t.dtype = *dt;
    t.file = path;
    for (const ojson& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        fail(path, name + ".shape", "dimensions must be non-negative integers, got " + v["shape"].dump());
      t.shape.push_back(d.get<int64_t>());
    }
    const ojson& off = v.contains("data_offsets") ? v["data_offsets"] : ojson();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(path, name + ".data_offsets", "must be [begin, end] with non-negative integers");
    uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (e < b) fail(path, name + ".data_offsets", "end " + std::to_string(e) + " < begin " + std::to_string(b));
    auto want = checked_bytes(t.shape, dtype_size(t.dtype));
    if (!want) fail(path, name + ".shape", "size overflows: " + shape_str(t.shape));
    if (e - b != *want)
      fail(path, name + ".data_offsets",
           "holds " + std::to_string(e - b) + " bytes but " + std::string(dtype_name(t.dtype)) + " " +
               shape_str(t.shape) + " needs " + std::to_string(*want));
    if (e > data_len)
      fail(path, name,
           "truncated file: the tensor's bytes [" + std::to_string(b) + ", " + std::to_string(e) +
               ") of the data section are cut off (the file holds " + std::to_string(data_len) + " data bytes)");
    t.data = data + b;
    t.nbytes = e - b;
    ranges.push_back({b, e, f->tensors_.size()});
    f->tensors_.push_back(std::move(t));
  }
  // Overlaps: two tensors may not share bytes (empty tensors occupy none).
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  const Range* prev = nullptr;
  for (const Range& r : ranges) {
    if (r.begin == r.end) continue;
    if (prev && r.begin < prev->end)
      fail(path, f->tensors_[r.idx].name,
           "data_offsets overlap those of \"" + f->tensors_[prev->idx].name + "\"");
    prev = &r;
  }
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_[f->tensors_[i].name] = i;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---- writing ---------------------------------------------------------------------------

std::string safetensors_header(const std::vector<TensorSpec>& specs,
                               const std::map<std::string, std::string>& metadata) {
  ojson h = ojson::object();
  if (!metadata.empty()) {
    ojson m = ojson::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  uint64_t off = 0;
  for (const TensorSpec& s : specs) {
    if (s.name == "__metadata__" || h.contains(s.name)) fail(s.name, {}, "duplicate or reserved tensor name");
    for (int64_t d : s.shape)
      if (d < 0) fail(s.name, "shape", "negative dimension");
    uint64_t nb = s.nbytes();
    h[s.name] = ojson{{"dtype", std::string(dtype_name(s.dtype))}, {"shape", s.shape}, {"data_offsets", {off, off + nb}}};
    off += nb;
  }
  std::string text = h.dump();
  // Pad with spaces so the data section starts 8-byte aligned (readers may then view
  // F32/BF16 data in place).
  while ((8 + text.size()) % 8) text.push_back(' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = char((n >> (8 * i)) & 0xff);
  return out + text;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<TensorSpec> specs,
                                     const std::map<std::string, std::string>& metadata)
    : specs_(std::move(specs)) {
  std::string header = safetensors_header(specs_, metadata);
  out_ = std::make_unique<AtomicFile>(path);
  out_->write(header);
  skip_empty();
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::skip_empty() {
  while (cur_ < specs_.size() && written_in_cur_ == specs_[cur_].nbytes()) {
    ++cur_;
    written_in_cur_ = 0;
  }
}

void SafetensorsWriter::write(const void* data, size_t n) {
  if (n == 0) return;
  if (cur_ >= specs_.size()) fail(out_->path(), {}, "internal: more bytes written than the header declares");
  const TensorSpec& s = specs_[cur_];
  if (written_in_cur_ + n > s.nbytes())
    fail(out_->path(), s.name, "internal: a write straddles the end of the tensor");
  out_->write(data, n);
  written_in_cur_ += n;
  skip_empty();
}

void SafetensorsWriter::commit() {
  if (cur_ != specs_.size())
    fail(out_->path(), specs_[cur_].name, "internal: tensor data incomplete at commit");
  out_->commit();
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& t : tensors) specs.push_back({.name = t.name, .dtype = t.dtype, .shape = t.shape});
  SafetensorsWriter w(path, specs, metadata);
  for (size_t i = 0; i < tensors.size(); ++i) {
    size_t nb = specs[i].nbytes();
    if (nb && !tensors[i].data) fail(path, tensors[i].name, "no data given");
    w.write(tensors[i].data, nb);
  }
  w.commit();
}

// ---- conversion ------------------------------------------------------------------------

std::vector<float> to_f32(const TensorView& t) {
  const int64_t n = t.numel();
  std::vector<float> out(static_cast<size_t>(n));
  const uint8_t* p = t.data;
  switch (t.dtype) {
    case DType::F32:
      std::memcpy(out.data(), p, size_t(n) * 4);
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      break;
    default:
      fail(t.file, t.name, "dtype " + std::string(dtype_name(t.dtype)) + " is not a float type (F32/F16/BF16)");
  }
  return out;
}

}  // namespace atlas
