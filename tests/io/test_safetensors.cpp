// safetensors: round trip, determinism, and one test per header/data validation rule.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "core/bf16.h"
#include "io_test_util.h"
#include "io/safetensors.h"

using namespace atlas;
using atlas::testing::expect_error;
using atlas::testing::ScratchDir;

namespace {

// A file from a hand-written header and data section (what a broken writer could produce).
void write_raw(const std::string& path, const std::string& header, const std::string& data, int64_t len = -1) {
  uint64_t n = len < 0 ? header.size() : uint64_t(len);
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = char((n >> (8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary) << out << header << data;
}

std::string bytes_of(const std::string& path) { return read_file(path); }

}  // namespace

TEST(Safetensors, RoundTripKeepsOrderDtypesShapesBytesAndMetadata) {
  ScratchDir d("st");
  std::vector<float> a = {1.0f, -2.5f, 0.0f, 3.25f, 1e-3f, 7.0f};     // [2, 3] F32
  std::vector<uint16_t> b = {f32_to_bf16(1.5f), f32_to_bf16(-0.125f)};  // [2] BF16
  std::vector<uint16_t> h = {f32_to_f16(0.5f), f32_to_f16(-4.0f), f32_to_f16(2.0f)};  // [3] F16
  std::vector<int32_t> c = {7, -9, 11, 0};                               // [2, 2] I32
  std::vector<TensorToWrite> ts = {
      {.name = "z.first", .dtype = DType::F32, .shape = {2, 3}, .data = a.data()},
      {.name = "a.second", .dtype = DType::BF16, .shape = {2}, .data = b.data()},
      {.name = "m.half", .dtype = DType::F16, .shape = {3}, .data = h.data()},
      {.name = "ids", .dtype = DType::I32, .shape = {2, 2}, .data = c.data()},
      {.name = "empty", .dtype = DType::F32, .shape = {0, 4}, .data = nullptr},
  };
  write_safetensors(d / "x.safetensors", ts, {{"format", "pt"}, {"note", "hello"}});

  auto f = SafetensorsFile::open(d / "x.safetensors");
  ASSERT_EQ(f->tensors().size(), 5u);
  // Header order is the order written, not alphabetical.
  EXPECT_EQ(f->tensors()[0].name, "z.first");
  EXPECT_EQ(f->tensors()[1].name, "a.second");
  EXPECT_EQ(f->tensors()[4].name, "empty");
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("note"), "hello");
  EXPECT_EQ(f->header_size() % 8, 0u) << "data section must start 8-byte aligned";

  const TensorView* t = f->find("z.first");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->nbytes, 24u);
  EXPECT_EQ(to_f32(*t), a);
  EXPECT_EQ(to_f32(*f->find("a.second")), (std::vector<float>{1.5f, -0.125f}));
  EXPECT_EQ(to_f32(*f->find("m.half")), (std::vector<float>{0.5f, -4.0f, 2.0f}));
  const TensorView* ids = f->find("ids");
  ASSERT_TRUE(ids);
  EXPECT_EQ(ids->dtype, DType::I32);
  EXPECT_EQ(std::memcmp(ids->data, c.data(), 16), 0);
  EXPECT_EQ(f->find("empty")->nbytes, 0u);
  EXPECT_EQ(f->find("missing"), nullptr);
  // Integer tensors are not silently converted.
  expect_error([&] { to_f32(*ids); }, {"x.safetensors", "ids", "I32"});
  // File size = header + the bytes of each tensor, nothing else.
  EXPECT_EQ(f->file_size(), f->header_size() + 24 + 4 + 6 + 16);
}

TEST(Safetensors, WritingIsDeterministicAndAtomic) {
  ScratchDir d("st");
  std::vector<float> a(100);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i) * 0.5f;
  std::vector<TensorToWrite> ts = {{.name = "w", .dtype = DType::F32, .shape = {10, 10}, .data = a.data()}};
  write_safetensors(d / "1.safetensors", ts, {{"k", "v"}});
  write_safetensors(d / "2.safetensors", ts, {{"k", "v"}});
  EXPECT_EQ(bytes_of(d / "1.safetensors"), bytes_of(d / "2.safetensors"));

  // A writer that is abandoned (an exception unwound past it) leaves no file behind.
  {
    SafetensorsWriter w(d / "3.safetensors", {{.name = "w", .dtype = DType::F32, .shape = {10, 10}}});
    w.write(a.data(), 40);
    expect_error([&] { w.commit(); }, {"3.safetensors", "w", "incomplete"});
  }
  EXPECT_FALSE(file_exists(d / "3.safetensors"));
  std::size_t n = 0;
  for (auto& e : std::filesystem::directory_iterator(d.path)) n += e.path().filename().string().rfind("3.", 0) == 0;
  EXPECT_EQ(n, 0u) << "temporary file left behind";
  // Duplicate names cannot be written.
  std::vector<TensorToWrite> dup = {ts[0], ts[0]};
  expect_error([&] { write_safetensors(d / "4.safetensors", dup); }, {"w", "duplicate"});
  EXPECT_FALSE(file_exists(d / "4.safetensors"));
}

TEST(Safetensors, StreamingWriterMatchesOneShotWriter) {
  ScratchDir d("st");
  std::vector<float> a(64), b(8);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = -float(i);
  write_safetensors(d / "one.safetensors", {{.name = "a", .dtype = DType::F32, .shape = {8, 8}, .data = a.data()},
                                            {.name = "b", .dtype = DType::F32, .shape = {8}, .data = b.data()}});
  SafetensorsWriter w(d / "stream.safetensors", {{.name = "a", .dtype = DType::F32, .shape = {8, 8}},
                                                 {.name = "b", .dtype = DType::F32, .shape = {8}}});
  for (int piece = 0; piece < 4; ++piece) w.write(a.data() + 16 * piece, 64);
  EXPECT_EQ(w.current(), 1u);
  w.write(b.data(), 32);
  w.commit();
  EXPECT_EQ(bytes_of(d / "one.safetensors"), bytes_of(d / "stream.safetensors"));
}

TEST(SafetensorsBadInput, FileShorterThanTheLengthField) {
  ScratchDir d("st");
  std::ofstream(d / "short.safetensors", std::ios::binary) << "abc";
  expect_error([&] { SafetensorsFile::open(d / "short.safetensors"); }, {"short.safetensors", "header", "too short"});
}

TEST(SafetensorsBadInput, MissingFile) {
  ScratchDir d("st");
  expect_error([&] { SafetensorsFile::open(d / "nope.safetensors"); }, {"nope.safetensors", "cannot open"});
}

TEST(SafetensorsBadInput, HeaderLengthBeyondFile) {
  ScratchDir d("st");
  write_raw(d / "long.safetensors", "{}", "", 4096);
  expect_error([&] { SafetensorsFile::open(d / "long.safetensors"); },
               {"long.safetensors", "header", "header length 4096 runs past the end"});
  write_raw(d / "huge.safetensors", "{}", "", int64_t(1) << 40);
  expect_error([&] { SafetensorsFile::open(d / "huge.safetensors"); }, {"huge.safetensors", "100 MB"});
}

TEST(SafetensorsBadInput, MalformedHeaderJson) {
  ScratchDir d("st");
  write_raw(d / "bad.safetensors", "{\"w\": {\"dtype\": \"F32\", ", "");
  expect_error([&] { SafetensorsFile::open(d / "bad.safetensors"); }, {"bad.safetensors", "header", "malformed header JSON"});
  write_raw(d / "arr.safetensors", "[1, 2]", "");
  expect_error([&] { SafetensorsFile::open(d / "arr.safetensors"); }, {"arr.safetensors", "must be an object"});
}

TEST(SafetensorsBadInput, EntryFieldsAreChecked) {
  ScratchDir d("st");
  const std::string data(16, '\0');
  struct Case {
    std::string header, field, what;
  };
  std::vector<Case> cases = {
      {R"({"w": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 16]}})", "w.dtype", "unknown dtype \"Q4\""},
      {R"({"w": {"shape": [4], "data_offsets": [0, 16]}})", "w.dtype", "missing"},
      {R"({"w": {"dtype": "F32", "data_offsets": [0, 16]}})", "w.shape", "missing"},
      {R"({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", "w.shape", "non-negative"},
      {R"({"w": {"dtype": "F32", "shape": [4]}})", "w.data_offsets", "[begin, end]"},
      {R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [8, 0]}})", "w.data_offsets", "end 0 < begin 8"},
      {R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})", "w.data_offsets", "needs 12"},
      {R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16], "x": 1}})", "w", "unknown key \"x\""},
      {R"({"w": 5})", "w", "must be an object"},
      {R"({"__metadata__": {"a": 1}})", "__metadata__.a", "strings"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", "b", "overlap those of \"a\""},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string p = d / ("c" + std::to_string(i) + ".safetensors");
    write_raw(p, cases[i].header, data);
    SCOPED_TRACE(cases[i].header);
    expect_error([&] { SafetensorsFile::open(p); }, {p, cases[i].field + ": ", cases[i].what});
  }
}

TEST(SafetensorsBadInput, TruncatedDataNamesTheCutTensor) {
  ScratchDir d("st");
  std::vector<float> a(16, 1.0f), b(16, 2.0f);
  write_safetensors(d / "t.safetensors", {{.name = "first", .dtype = DType::F32, .shape = {16}, .data = a.data()},
                                          {.name = "second", .dtype = DType::F32, .shape = {16}, .data = b.data()}});
  ASSERT_NO_THROW(SafetensorsFile::open(d / "t.safetensors"));
  atlas::testing::truncate_by(d / "t.safetensors", 4);
  expect_error([&] { SafetensorsFile::open(d / "t.safetensors"); }, {"t.safetensors", "second", "truncated"});
  // Cut into the first tensor too: the first tensor (in file order) that is cut is named.
  atlas::testing::truncate_by(d / "t.safetensors", 64);
  expect_error([&] { SafetensorsFile::open(d / "t.safetensors"); }, {"t.safetensors", "first", "truncated"});
}
