// The OpenAI Batch format for `deltaflow batch`: input lines, duplicates, result lines, and the recovery of
// an output cut by a kill (whole lines kept, a torn last line cut off the file).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "server/batch_file.hpp"

namespace deltaflow::server {
namespace {

std::string temp_file(const std::string& name, const std::string& text) {
  const auto p = std::filesystem::temp_directory_path() / ("df_batch_" + std::to_string(::getpid()) + name);
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ServerBatchFile, InputLines) {
  auto l = parse_batch_line(
      R"({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"x": 1}})", 3);
  EXPECT_TRUE(l.error.empty());
  EXPECT_EQ(l.key(), "a");
  EXPECT_EQ(l.output_id(), "batch_req_3");
  EXPECT_EQ(l.body["x"], 1);
  EXPECT_NE(parse_batch_line("{", 4).error.find("line 4: not valid JSON"), std::string::npos);
  EXPECT_EQ(parse_batch_line("{", 4).key(), "#line:4");
  EXPECT_NE(parse_batch_line(R"({"custom_id": "a", "url": "/v1/embeddings", "body": {}})", 1)
                .error.find("embeddings"),
            std::string::npos);
  EXPECT_FALSE(
      parse_batch_line(R"({"custom_id": "a", "method": "GET", "url": "/v1/completions", "body": {}})", 1)
          .error.empty());
  EXPECT_FALSE(
      parse_batch_line(R"({"custom_id": 5, "url": "/v1/completions", "body": {}})", 1).error.empty());
  EXPECT_FALSE(
      parse_batch_line(R"({"custom_id": "a", "url": "/v1/completions", "body": []})", 1).error.empty());
}

TEST(ServerBatchFile, DuplicateCustomIdsAreAnErrorNamingBothLines) {
  const std::string in = temp_file("dup", R"({"custom_id": "a", "url": "/v1/completions", "body": {}}

{"custom_id": "b", "url": "/v1/completions", "body": {}}
{"custom_id": "a", "url": "/v1/completions", "body": {}}
)");
  auto r = read_batch_input(in);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("custom_id 'a' is used on line 1 and line 4"), std::string::npos);
  std::filesystem::remove(in);
}

TEST(ServerBatchFile, ResultLinesReadBackAsTheirKeys) {
  auto good = parse_batch_line(R"({"custom_id": "q", "url": "/v1/completions", "body": {}})", 1);
  auto bad = parse_batch_line("nope", 2);
  EXPECT_EQ(batch_output_key(batch_response_line(good, 200, R"({"ok": true})", "cmpl-1")), "q");
  EXPECT_EQ(batch_output_key(batch_error_line(bad, "invalid_request", bad.error)), "#line:2");
  EXPECT_EQ(batch_output_key("{\"id\": \"x\""), "");
}

TEST(ServerBatchFile, RecoveryCutsATornLastLineOnly) {
  auto a = parse_batch_line(R"({"custom_id": "a", "url": "/v1/completions", "body": {}})", 1);
  auto b = parse_batch_line("bad", 2);
  const std::string whole =
      batch_response_line(a, 200, "{}", "r") + "\n" + batch_error_line(b, "c", "m") + "\n";
  const std::string path = temp_file("out", whole + R"({"id": "batch_req_3", "custom_id": "tor)");
  bool repaired = false;
  auto done = recover_batch_output(path, &repaired);
  ASSERT_TRUE(done.is_ok()) << done.message();
  EXPECT_TRUE(repaired);
  EXPECT_EQ(*done, (std::set<std::string>{"a", "#line:2"}));
  EXPECT_EQ(read(path), whole);
  // Whole already: nothing changes.
  done = recover_batch_output(path, &repaired);
  EXPECT_FALSE(repaired);
  EXPECT_EQ(read(path), whole);
  // A bad line before the end is not ours: an error, and the file is left alone.
  const std::string foreign = temp_file("foreign", "hello\n" + whole);
  EXPECT_FALSE(recover_batch_output(foreign, &repaired).is_ok());
  EXPECT_EQ(read(foreign), "hello\n" + whole);
  // No file yet: nothing done.
  EXPECT_TRUE(recover_batch_output(path + ".none", &repaired)->empty());
  std::filesystem::remove(path);
  std::filesystem::remove(foreign);
}

}  // namespace
}  // namespace deltaflow::server
