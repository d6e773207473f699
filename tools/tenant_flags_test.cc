// The tokens file's lines, the secret files' mode check and the miss floor's bound (tenant_flags.h),
// on files this test writes with the modes it sets.
#include "tenant_flags.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace epd::cli {
namespace {

std::string WriteFile(const std::string& name, const std::string& text, mode_t mode) {
  std::string path = std::string(::testing::TempDir()) + "/" + name + "-" + std::to_string(::getpid());
  std::ofstream(path, std::ios::binary) << text;
  ::chmod(path.c_str(), mode);
  return path;
}

TEST(TenantFlagsTest, ATokensFileNamesEachTokensTenantAndOperators) {
  StatusOr<std::vector<TenantToken>> t = ParseTokensFile("# comment\n\ntok-1 alice\r\n  tok-2   bob   operator\n", "F");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].token, "tok-1");
  EXPECT_EQ((*t)[0].tenant, "alice");
  EXPECT_FALSE((*t)[0].is_operator);
  EXPECT_EQ((*t)[1].tenant, "bob");
  EXPECT_TRUE((*t)[1].is_operator);
}

TEST(TenantFlagsTest, MalformedLinesAreRefusedByLineNumber) {
  for (const std::string text : {"tok-1\n", "tok-1 alice admin\n", "a b operator extra\n", "# nothing\n"}) {
    StatusOr<std::vector<TenantToken>> t = ParseTokensFile(text, "F");
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << text;
  }
  EXPECT_NE(ParseTokensFile("ok alice\nbad\n", "F").status().message().find("F line 2"), std::string::npos);
}

TEST(TenantFlagsTest, FilesOthersMayReadAreRefusedAndTheSecretLosesItsNewline) {
  TenantFlags f;
  f.tokens_file = WriteFile("tokens", "tok-1 alice\ntok-2 bob\n", 0644);
  ServerOptions o;
  Status s = ApplyTenantFlags(f, o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("chmod 600"), std::string::npos) << s.message();
  ::chmod(f.tokens_file.c_str(), 0600);
  f.secret_file = WriteFile("secret", "0123456789abcdef-secret\n", 0600);
  f.isolation = "salted";
  f.public_readers = {"alice"};
  ASSERT_TRUE(ApplyTenantFlags(f, o).ok());
  EXPECT_EQ(o.tenant_tokens.size(), 2u);
  EXPECT_EQ(o.tenant_secret, "0123456789abcdef-secret");
  EXPECT_EQ(o.tenant_isolation, TenantIsolation::kSalted);
  EXPECT_EQ(o.public_readers, std::vector<std::string>{"alice"});
  std::remove(f.tokens_file.c_str());
  std::remove(f.secret_file.c_str());
}

TEST(TenantFlagsTest, TheMissReplyFloorIsWholeMillisecondsWithinItsBound) {
  auto parse = [](const std::string& value, TenantFlags& f) {
    CLI::App app;
    AddTenantFlags(app, f);
    std::vector<std::string> args = {"--miss-reply-floor-ms", value};
    std::reverse(args.begin(), args.end());  // CLI11 parses a vector from its back
    app.parse(args);
  };
  TenantFlags f;
  parse("400", f);
  ServerOptions o;
  ASSERT_TRUE(ApplyTenantFlags(f, o).ok());
  EXPECT_EQ(o.miss_reply_floor, std::chrono::milliseconds(400));
  for (const std::string bad : {"nan", "-1", "1.5", "600001", "inf"}) {
    TenantFlags g;
    EXPECT_THROW(parse(bad, g), CLI::ValidationError) << bad;
  }
}

}  // namespace
}  // namespace epd::cli
