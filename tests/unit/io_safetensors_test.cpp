// Safetensors reader/writer and checkpoint directories: round trips, deterministic bytes, and one test per
// way a file or an index can be wrong, each checking that the message names the file and the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "io/json_file.hpp"
#include "io/safetensors.hpp"

namespace deltaflow::io {
namespace {

namespace fs = std::filesystem;
using core::DType;

constexpr DType kAllDTypes[] = {DType::kBF16, DType::kF16, DType::kF32, DType::kF8E4M3,
                                DType::kU8,   DType::kI8,  DType::kI32, DType::kI64};

// 8-byte little-endian length, the header text, then the data section.
std::string raw_file(const std::string& header, const std::string& data = "", uint64_t length_override = 0) {
  const uint64_t n = length_override ? length_override : header.size();
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + header + data;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TensorToWrite make_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                          uint32_t seed = 1) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  return TensorToWrite{name, dtype, shape,
                       pattern(static_cast<size_t>(numel) * core::dtype_size(dtype), seed)};
}

// The message must exist and contain every piece (file name, tensor name, what is wrong).
template <class R>
void expect_error(const R& r, const std::vector<std::string>& pieces) {
  ASSERT_FALSE(r.is_ok()) << "expected an error containing '" << pieces.front() << "'";
  for (const auto& p : pieces)
    EXPECT_NE(r.message().find(p), std::string::npos) << "'" << p << "' not in: " << r.message();
}

core::Expected<SafetensorsHeader> parse(const std::string& bytes) {
  return parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                  "f.safetensors");
}

// One tensor entry of a hand-written header, and a header object of such entries. Built by appending:
// `"literal" + std::string` trips a GCC 12 -O3 -Wrestrict false positive.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t b,
                  uint64_t e) {
  std::string s = "\"";
  s += name;
  s += "\":{\"dtype\":\"";
  s += dtype;
  s += "\",\"shape\":";
  s += shape;
  s += ",\"data_offsets\":[";
  s += std::to_string(b);
  s += ",";
  s += std::to_string(e);
  s += "]}";
  return s;
}

std::string object(const std::vector<std::string>& entries) {
  std::string s = "{";
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i) s += ",";
    s += entries[i];
  }
  s += "}";
  return s;
}

class SafetensorsTest : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(testing::TempDir()) /
           ("df_io_test_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// ---- round trips and the writer's bytes

TEST_F(SafetensorsTest, RoundTripEveryDType) {
  std::vector<TensorToWrite> in;
  uint32_t seed = 1;
  for (DType t : kAllDTypes) {
    const std::string base(core::dtype_name(t));
    in.push_back(make_tensor(base + ".matrix", t, {2, 3}, seed++));
    in.push_back(make_tensor(base + ".scalar", t, {}, seed++));
    in.push_back(make_tensor(base + ".empty", t, {0, 4}, seed++));
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "round trip"}};
  ASSERT_TRUE(write_safetensors(path("m.safetensors"), in, meta).is_ok());

  auto f = SafetensorsFile::open(path("m.safetensors"));
  ASSERT_TRUE(f.is_ok()) << f.message();
  EXPECT_EQ((*f)->header().metadata, meta);
  ASSERT_EQ((*f)->header().tensors.size(), in.size());
  for (const TensorToWrite& t : in) {
    const auto& entries = (*f)->header().tensors;
    const auto it =
        std::find_if(entries.begin(), entries.end(), [&](const TensorEntry& e) { return e.name == t.name; });
    ASSERT_NE(it, entries.end()) << t.name;
    EXPECT_EQ(it->dtype, t.dtype) << t.name;
    EXPECT_EQ(it->shape, t.shape) << t.name;
    ASSERT_EQ(it->end - it->begin, t.bytes.size()) << t.name;
    EXPECT_EQ(std::vector<uint8_t>((*f)->tensor_data(*it), (*f)->tensor_data(*it) + t.bytes.size()), t.bytes)
        << t.name;
  }

  fs::rename(path("m.safetensors"), path("model.safetensors"));
  auto ck = Checkpoint::open(dir_.string());
  ASSERT_TRUE(ck.is_ok()) << ck.message();
  ASSERT_EQ(ck->tensors().size(), in.size());
  for (const TensorToWrite& t : in) {
    const Tensor* got = ck->find(t.name);
    ASSERT_NE(got, nullptr) << t.name;
    EXPECT_EQ(got->dtype, t.dtype);
    EXPECT_EQ(got->shape, t.shape);
    EXPECT_EQ(got->numel() * static_cast<int64_t>(core::dtype_size(t.dtype)),
              static_cast<int64_t>(t.bytes.size()));
    EXPECT_EQ(std::vector<uint8_t>(got->data, got->data + got->nbytes), t.bytes) << t.name;
    EXPECT_EQ(*got->file, path("model.safetensors"));
  }
  EXPECT_EQ(ck->find("no.such.tensor"), nullptr);
}

TEST_F(SafetensorsTest, WriterIsDeterministic) {
  std::vector<TensorToWrite> a = {make_tensor("z", DType::kF32, {3}, 1),
                                  make_tensor("a", DType::kBF16, {5}, 2),
                                  make_tensor("m", DType::kI64, {1, 2}, 3)};
  std::vector<TensorToWrite> b = {a[2], a[0], a[1]};  // same tensors, other order
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  ASSERT_TRUE(write_safetensors(path("a.safetensors"), a, meta).is_ok());
  ASSERT_TRUE(write_safetensors(path("b.safetensors"), b, meta).is_ok());
  ASSERT_TRUE(write_safetensors(path("c.safetensors"), a, meta).is_ok());
  const std::string bytes = read_bytes(path("a.safetensors"));
  EXPECT_EQ(bytes, read_bytes(path("b.safetensors")));
  EXPECT_EQ(bytes, read_bytes(path("c.safetensors")));

  // Layout: header padded with spaces to a multiple of 8, "__metadata__" first, then tensors by element size
  // (largest first) and name, data contiguous in that order, so every tensor starts aligned to its element
  // size.
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  const std::string header = bytes.substr(8, n);
  const std::string json_text = header.substr(0, header.find_last_not_of(' ') + 1);
  EXPECT_EQ(header.substr(json_text.size()), std::string(header.size() - json_text.size(), ' '));
  EXPECT_EQ(json_text,
            "{\"__metadata__\":{\"format\":\"pt\"},"
            "\"m\":{\"dtype\":\"I64\",\"shape\":[1,2],\"data_offsets\":[0,16]},"
            "\"z\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[16,28]},"
            "\"a\":{\"dtype\":\"BF16\",\"shape\":[5],\"data_offsets\":[28,38]}}");
  const std::string data = bytes.substr(8 + n);
  EXPECT_EQ(data, std::string(a[2].bytes.begin(), a[2].bytes.end()) +
                      std::string(a[0].bytes.begin(), a[0].bytes.end()) +
                      std::string(a[1].bytes.begin(), a[1].bytes.end()));
  EXPECT_FALSE(fs::exists(path("a.safetensors.tmp-" + std::to_string(::getpid()))));
}

TEST_F(SafetensorsTest, WriterWithoutMetadataOrTensors) {
  ASSERT_TRUE(write_safetensors(path("e.safetensors"), {}, {}).is_ok());
  EXPECT_EQ(read_bytes(path("e.safetensors")), raw_file("{}      "));
  auto f = SafetensorsFile::open(path("e.safetensors"));
  ASSERT_TRUE(f.is_ok()) << f.message();
  EXPECT_TRUE((*f)->header().tensors.empty());
  EXPECT_TRUE((*f)->header().metadata.empty());
}

TEST_F(SafetensorsTest, WriterRejectsWrongByteCount) {
  TensorToWrite t = make_tensor("w", DType::kF32, {2, 2});
  t.bytes.pop_back();
  expect_error(write_safetensors(path("w.safetensors"), {t}, {}),
               {path("w.safetensors"), "tensor 'w'", "15 bytes", "16"});
  EXPECT_FALSE(fs::exists(path("w.safetensors")));
}

TEST_F(SafetensorsTest, WriterRejectsDuplicateNames) {
  expect_error(write_safetensors(path("d.safetensors"),
                                 {make_tensor("x", DType::kU8, {1}), make_tensor("x", DType::kU8, {2})}, {}),
               {path("d.safetensors"), "tensor 'x'", "duplicate name"});
}

TEST_F(SafetensorsTest, WriterReportsUnwritablePath) {
  const std::string p = path("no/such/dir/x.safetensors");
  expect_error(write_safetensors(p, {make_tensor("x", DType::kU8, {1})}, {}), {p, "cannot create"});
}

// ---- header validation (parse_safetensors_header on bytes)

TEST(SafetensorsHeader, ValidHeaderSortsByOffset) {
  const std::string h = object(
      {entry("b", "F32", "[2]", 0, 8), entry("a", "U8", "[4]", 8, 12), "\"__metadata__\":{\"k\":\"v\"}"});
  auto r = parse(raw_file(h, std::string(12, '\0')));
  ASSERT_TRUE(r.is_ok()) << r.message();
  ASSERT_EQ(r->tensors.size(), 2u);
  EXPECT_EQ(r->tensors[0].name, "b");
  EXPECT_EQ(r->tensors[1].name, "a");
  EXPECT_EQ(r->tensors[1].begin, 8u);
  EXPECT_EQ(r->tensors[0].numel(), 2);
  EXPECT_EQ(r->data_offset, 8 + h.size());
  EXPECT_EQ(r->metadata.at("k"), "v");
}

TEST(SafetensorsHeader, TooSmallForLength) {
  expect_error(parse("\x01\x02\x03"), {"f.safetensors", "3 bytes", "too small"});
}

TEST(SafetensorsHeader, ZeroLength) {
  expect_error(parse(raw_file("", "", 0)), {"f.safetensors", "header length is 0"});
}

TEST(SafetensorsHeader, LengthLargerThanFile) {
  expect_error(parse(raw_file("{}", "", 1000)),
               {"f.safetensors", "header length 1000", "exceeds the 2 bytes"});
}

TEST(SafetensorsHeader, LengthAboveBound) {
  expect_error(parse(raw_file("{}", "", kMaxHeaderBytes + 1)),
               {"f.safetensors", std::to_string(kMaxHeaderBytes + 1), "exceeds the limit"});
}

TEST(SafetensorsHeader, InvalidJson) {
  expect_error(parse(raw_file("{\"a\": ")), {"f.safetensors", "invalid JSON header", "parse error"});
  expect_error(parse(raw_file("{\"a\":1} x")), {"f.safetensors", "invalid JSON header"});
}

TEST(SafetensorsHeader, NotAnObject) {
  expect_error(parse(raw_file("[1,2]   ")), {"f.safetensors", "not a JSON object"});
}

TEST(SafetensorsHeader, DuplicateName) {
  const std::string h = object({entry("w", "U8", "[1]", 0, 1), entry("w", "U8", "[1]", 1, 2)});
  expect_error(parse(raw_file(h, "ab")), {"f.safetensors", "tensor 'w'", "duplicate name"});
}

TEST(SafetensorsHeader, DuplicateKeyInsideEntry) {
  const std::string h = R"({"w":{"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]}})";
  expect_error(parse(raw_file(h, "a")), {"f.safetensors", "tensor 'w'", "duplicate key 'dtype'"});
}

TEST(SafetensorsHeader, UnknownDType) {
  expect_error(parse(raw_file(object({entry("w", "F64", "[1]", 0, 8)}), std::string(8, '\0'))),
               {"f.safetensors", "tensor 'w'", "unsupported dtype F64"});
}

TEST(SafetensorsHeader, NegativeShape) {
  expect_error(parse(raw_file(object({entry("w", "U8", "[2,-2]", 0, 0)}))),
               {"f.safetensors", "tensor 'w'", "shape[1] = -2 is negative"});
}

TEST(SafetensorsHeader, NonIntegerShape) {
  expect_error(parse(raw_file(object({entry("w", "U8", "[1.5]", 0, 0)}))),
               {"f.safetensors", "tensor 'w'", "shape[0]", "not a non-negative integer"});
  expect_error(parse(raw_file(object({entry("w", "U8", "[9223372036854775808]", 0, 0)}))),
               {"f.safetensors", "tensor 'w'", "too large"});
}

TEST(SafetensorsHeader, OffsetsOutOfRange) {
  expect_error(parse(raw_file(object({entry("w", "F32", "[2]", 0, 8)}), std::string(7, '\0'))),
               {"f.safetensors", "tensor 'w'", "[0, 8]", "past the end of the data section (7 bytes)"});
}

TEST(SafetensorsHeader, OffsetsReversed) {
  expect_error(parse(raw_file(object({entry("w", "U8", "[0]", 4, 2)}), std::string(8, '\0'))),
               {"f.safetensors", "tensor 'w'", "begin > end"});
}

TEST(SafetensorsHeader, OffsetsMalformed) {
  const std::string h = R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})";
  expect_error(parse(raw_file(h, "a")), {"f.safetensors", "tensor 'w'", "data_offsets"});
  const std::string h3 = R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})";
  expect_error(parse(raw_file(h3, "a")), {"f.safetensors", "tensor 'w'", "data_offsets"});
}

TEST(SafetensorsHeader, OverlappingRanges) {
  const std::string h = object({entry("a", "U8", "[8]", 0, 8), entry("b", "U8", "[8]", 4, 12)});
  expect_error(parse(raw_file(h, std::string(12, '\0'))),
               {"f.safetensors", "tensor 'b'", "overlap tensor 'a'"});
  // A range inside an earlier, longer one overlaps too, even if a shorter range sits between them.
  const std::string h2 =
      object({entry("a", "U8", "[10]", 0, 10), entry("b", "U8", "[2]", 1, 3), entry("c", "U8", "[2]", 5, 7)});
  expect_error(parse(raw_file(h2, std::string(10, '\0'))),
               {"f.safetensors", "tensor 'b'", "overlap tensor 'a'"});
}

TEST(SafetensorsHeader, ZeroLengthTensorsMayShareOffsets) {
  const std::string h = object(
      {entry("a", "U8", "[4]", 0, 4), entry("e1", "F32", "[0]", 2, 2), entry("e2", "BF16", "[3,0]", 4, 4)});
  auto r = parse(raw_file(h, std::string(4, '\0')));
  EXPECT_TRUE(r.is_ok()) << r.message();
}

TEST(SafetensorsHeader, NumelTimesSizeMismatch) {
  expect_error(parse(raw_file(object({entry("w", "F32", "[3]", 0, 8)}), std::string(8, '\0'))),
               {"f.safetensors", "tensor 'w'", "needs 12 bytes", "span 8"});
}

TEST(SafetensorsHeader, ShapeOverflow) {
  expect_error(parse(raw_file(object({entry("w", "F32", "[4611686018427387904,4]", 0, 0)}))),
               {"f.safetensors", "tensor 'w'", "overflows"});
}

TEST(SafetensorsHeader, EntryKeys) {
  expect_error(parse(raw_file(R"({"w":{"dtype":"U8","shape":[0]}})")),
               {"f.safetensors", "tensor 'w'", "missing 'data_offsets'"});
  expect_error(parse(raw_file(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":1}})")),
               {"f.safetensors", "tensor 'w'", "unexpected key 'x'"});
  expect_error(parse(raw_file(R"({"w":[1]})")), {"f.safetensors", "tensor 'w'", "not a JSON object"});
  expect_error(parse(raw_file(R"({"w":{"dtype":7,"shape":[0],"data_offsets":[0,0]}})")),
               {"f.safetensors", "tensor 'w'", "dtype is not a string"});
}

TEST(SafetensorsHeader, MetadataMustBeStrings) {
  expect_error(parse(raw_file(R"({"__metadata__":{"k":1}})")), {"f.safetensors", "__metadata__ 'k'"});
  expect_error(parse(raw_file(R"({"__metadata__":"x"})")), {"f.safetensors", "__metadata__ is not"});
}

// ---- SafetensorsFile::open

TEST_F(SafetensorsTest, OpenMissingFile) {
  expect_error(SafetensorsFile::open(path("nope.safetensors")), {path("nope.safetensors"), "cannot open"});
}

TEST_F(SafetensorsTest, OpenEmptyFile) {
  write_bytes(path("empty.safetensors"), "");
  expect_error(SafetensorsFile::open(path("empty.safetensors")), {path("empty.safetensors"), "empty"});
}

TEST_F(SafetensorsTest, OpenDirectory) {
  expect_error(SafetensorsFile::open(dir_.string()), {dir_.string(), "not a regular file"});
}

TEST_F(SafetensorsTest, OpenTruncatedDataSection) {
  ASSERT_TRUE(write_safetensors(path("t.safetensors"),
                                {make_tensor("a", DType::kF32, {4}), make_tensor("b", DType::kF32, {4})}, {})
                  .is_ok());
  fs::resize_file(path("t.safetensors"), fs::file_size(path("t.safetensors")) - 3);
  expect_error(SafetensorsFile::open(path("t.safetensors")),
               {path("t.safetensors"), "tensor 'b'", "past the end of the data section", "truncated"});
}

TEST_F(SafetensorsTest, OpenTruncatedHeader) {
  ASSERT_TRUE(write_safetensors(path("t.safetensors"), {make_tensor("a", DType::kF32, {4})}, {}).is_ok());
  fs::resize_file(path("t.safetensors"), 20);
  expect_error(SafetensorsFile::open(path("t.safetensors")),
               {path("t.safetensors"), "header length", "truncated"});
}

// ---- Checkpoint directories

class SafetensorsCheckpointTest : public SafetensorsTest {
 protected:
  // Shard 1 holds a.weight and b.weight, shard 2 holds c.weight.
  void write_shards() {
    ASSERT_TRUE(write_safetensors(path(kShard1),
                                  {make_tensor("b.weight", DType::kBF16, {2, 2}, 1),
                                   make_tensor("a.weight", DType::kF32, {3}, 2)},
                                  {{"format", "pt"}})
                    .is_ok());
    ASSERT_TRUE(write_safetensors(path(kShard2), {make_tensor("c.weight", DType::kI8, {5}, 3)}, {}).is_ok());
  }
  void write_index(const std::string& weight_map) {
    write_bytes(path("model.safetensors.index.json"),
                "{\"metadata\":{\"total_size\":29},\"weight_map\":{" + weight_map + "}}");
  }
  static constexpr const char* kShard1 = "model-00001-of-00002.safetensors";
  static constexpr const char* kShard2 = "model-00002-of-00002.safetensors";
  std::string index_path() const { return path("model.safetensors.index.json"); }
};

TEST_F(SafetensorsCheckpointTest, TwoShardsThroughIndex) {
  write_shards();
  write_index(
      R"("a.weight":"model-00001-of-00002.safetensors","b.weight":"model-00001-of-00002.safetensors",)"
      R"("c.weight":"model-00002-of-00002.safetensors")");
  auto ck = Checkpoint::open(dir_.string());
  ASSERT_TRUE(ck.is_ok()) << ck.message();
  ASSERT_EQ(ck->tensors().size(), 3u);
  EXPECT_EQ(ck->tensors()[0].name, "a.weight");
  EXPECT_EQ(ck->tensors()[1].name, "b.weight");
  EXPECT_EQ(ck->tensors()[2].name, "c.weight");
  EXPECT_EQ(ck->dir(), dir_.string());

  const Tensor* c = ck->find("c.weight");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(*c->file, path(kShard2));
  EXPECT_EQ(c->dtype, DType::kI8);
  EXPECT_EQ(c->shape, std::vector<int64_t>{5});
  EXPECT_EQ(std::vector<uint8_t>(c->data, c->data + c->nbytes), pattern(5, 3));
  const Tensor* b = ck->find("b.weight");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(*b->file, path(kShard1));
  EXPECT_EQ(std::vector<uint8_t>(b->data, b->data + b->nbytes), pattern(8, 1));
  EXPECT_EQ(ck->find("b"), nullptr);
  EXPECT_EQ(ck->find("d.weight"), nullptr);
}

TEST_F(SafetensorsCheckpointTest, IndexTakesPrecedenceOverSingleFile) {
  write_shards();
  ASSERT_TRUE(
      write_safetensors(path("model.safetensors"), {make_tensor("stale", DType::kU8, {1})}, {}).is_ok());
  write_index(
      R"("a.weight":"model-00001-of-00002.safetensors","b.weight":"model-00001-of-00002.safetensors",)"
      R"("c.weight":"model-00002-of-00002.safetensors")");
  auto ck = Checkpoint::open(dir_.string());
  ASSERT_TRUE(ck.is_ok()) << ck.message();
  EXPECT_EQ(ck->find("stale"), nullptr);
  EXPECT_EQ(ck->tensors().size(), 3u);
}

TEST_F(SafetensorsCheckpointTest, NoModelFiles) {
  expect_error(Checkpoint::open(dir_.string()),
               {dir_.string() + ": no model.safetensors or model.safetensors.index.json"});
}

TEST_F(SafetensorsCheckpointTest, IndexNamesMissingShard) {
  write_shards();
  write_index(
      R"("a.weight":"model-00001-of-00002.safetensors","b.weight":"model-00001-of-00002.safetensors",)"
      R"("c.weight":"model-00003-of-00002.safetensors")");
  expect_error(Checkpoint::open(dir_.string()), {index_path(), "tensor 'c.weight'",
                                                 "shard 'model-00003-of-00002.safetensors' does not exist"});
}

TEST_F(SafetensorsCheckpointTest, TensorInWrongShard) {
  write_shards();
  write_index(
      R"("a.weight":"model-00001-of-00002.safetensors","b.weight":"model-00002-of-00002.safetensors",)"
      R"("c.weight":"model-00002-of-00002.safetensors")");
  expect_error(Checkpoint::open(dir_.string()),
               {path(kShard1), "tensor 'b.weight'", "places it in 'model-00002-of-00002.safetensors'"});
}

TEST_F(SafetensorsCheckpointTest, IndexListsTensorMissingFromShard) {
  write_shards();
  write_index(
      R"("a.weight":"model-00001-of-00002.safetensors","b.weight":"model-00001-of-00002.safetensors",)"
      R"("c.weight":"model-00002-of-00002.safetensors","d.weight":"model-00002-of-00002.safetensors")");
  expect_error(Checkpoint::open(dir_.string()),
               {path(kShard2), "tensor 'd.weight'", "missing from this shard"});
}

TEST_F(SafetensorsCheckpointTest, ShardHasTensorNotInIndex) {
  write_shards();
  write_index(
      R"("a.weight":"model-00001-of-00002.safetensors","c.weight":"model-00002-of-00002.safetensors")");
  expect_error(Checkpoint::open(dir_.string()),
               {path(kShard1), "tensor 'b.weight'", "not listed in", index_path()});
}

TEST_F(SafetensorsCheckpointTest, SameTensorInTwoShards) {
  write_shards();
  ASSERT_TRUE(write_safetensors(
                  path(kShard2),
                  {make_tensor("c.weight", DType::kI8, {5}), make_tensor("a.weight", DType::kF32, {3})}, {})
                  .is_ok());
  write_index(
      R"("a.weight":"model-00001-of-00002.safetensors","b.weight":"model-00001-of-00002.safetensors",)"
      R"("c.weight":"model-00002-of-00002.safetensors")");
  expect_error(Checkpoint::open(dir_.string()),
               {path(kShard2), "tensor 'a.weight'", "also present in", path(kShard1)});
}

TEST_F(SafetensorsCheckpointTest, BadIndex) {
  write_shards();
  write_bytes(index_path(), R"({"weight_map": )");
  expect_error(Checkpoint::open(dir_.string()), {index_path(), "invalid JSON"});
  write_bytes(index_path(), R"({"metadata":{}})");
  expect_error(Checkpoint::open(dir_.string()), {index_path(), "weight_map"});
  write_index(R"("a.weight":"../model-00001-of-00002.safetensors")");
  expect_error(Checkpoint::open(dir_.string()), {index_path(), "tensor 'a.weight'", "not a file name"});
  write_index(R"("a.weight":3)");
  expect_error(Checkpoint::open(dir_.string()), {index_path(), "tensor 'a.weight'", "not a string"});
}

TEST_F(SafetensorsCheckpointTest, CorruptShardNamesShard) {
  write_shards();
  write_bytes(path(kShard2), raw_file(object({entry("c.weight", "F64", "[1]", 0, 8)}), std::string(8, '\0')));
  write_index(
      R"("a.weight":"model-00001-of-00002.safetensors","b.weight":"model-00001-of-00002.safetensors",)"
      R"("c.weight":"model-00002-of-00002.safetensors")");
  expect_error(Checkpoint::open(dir_.string()),
               {path(kShard2), "tensor 'c.weight'", "unsupported dtype F64"});
}

// ---- read_json_file

class IoJsonFile : public SafetensorsTest {};

TEST_F(IoJsonFile, ReadsValue) {
  write_bytes(path("config.json"), R"({"hidden_size": 1024, "layer_types": ["linear_attention"]})");
  auto j = read_json_file(path("config.json"));
  ASSERT_TRUE(j.is_ok()) << j.message();
  EXPECT_EQ((*j)["hidden_size"].get<int>(), 1024);
  EXPECT_EQ((*j)["layer_types"][0].get<std::string>(), "linear_attention");
}

TEST_F(IoJsonFile, Errors) {
  expect_error(read_json_file(path("missing.json")), {path("missing.json") + ": cannot open"});
  write_bytes(path("bad.json"), "{\"a\": [1, 2,]}");
  expect_error(read_json_file(path("bad.json")),
               {path("bad.json") + ": invalid JSON: ", "parse error", "line 1, column 13"});
  expect_error(read_json_file(dir_.string()), {dir_.string() + ": cannot read"});
}

}  // namespace
}  // namespace deltaflow::io
