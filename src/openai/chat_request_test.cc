// The OpenAI front's request rules without a server: what the parser takes
// from a proxy's request and what it refuses (each with its field), the
// processing-kwargs rule, per-patch timestamps, the media sources (data:
// and file://, symlinks included) and the error page's shape.
#include "chat_request.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "chat_reply.h"
#include "kwargs_check.h"
#include "media_source.h"

namespace epd::internal {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

ChatRequest Parsed(const std::string& body) {
  auto r = ParseChatRequest(body);
  if (auto* e = std::get_if<FrontError>(&r)) {
    ADD_FAILURE() << e->message;
    return {};
  }
  return std::get<ChatRequest>(r);
}

FrontError Refused(const std::string& body) {
  auto r = ParseChatRequest(body);
  if (auto* e = std::get_if<FrontError>(&r)) return *e;
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

TEST(ChatRequestTest, MediaPartsAreItemsInOrderAcrossMessagesWithTheirUuids) {
  const ChatRequest r = Parsed(R"({"model": "m", "stream": false, "max_tokens": 9, "temperature": 0.1,
      "messages": [{"role": "system", "content": "plain text"},
                   {"role": "user", "content": [
                      {"type": "text", "text": "hi"},
                      {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}, "uuid": "u1"},
                      {"type": "video_url", "video_url": {"url": "http://x/v.mp4"}}]},
                   {"role": "user", "content": [{"type": "image_url", "image_url": "file:///a.png", "uuid": null,
                                                 "epd_public": true}]}]})");
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.items.size(), 3u);
  EXPECT_EQ(r.items[0].url, "data:image/png;base64,AAAA");
  EXPECT_EQ(r.items[0].uuid, "u1");
  EXPECT_EQ(r.items[0].where, "messages[1].content[1]");
  EXPECT_EQ(r.items[1].kind, MediaKind::kVideo);
  EXPECT_EQ(r.items[1].index, 1);
  EXPECT_FALSE(r.items[1].uuid.has_value());
  EXPECT_EQ(r.items[2].url, "file:///a.png");
  EXPECT_EQ(r.items[2].where, "messages[2].content[0]");
  EXPECT_TRUE(r.items[2].is_public);  // our extension key; absent = the caller's own namespace
  EXPECT_FALSE(r.items[0].is_public);
  EXPECT_TRUE(r.mm_processor_kwargs.is_null());
}

TEST(ChatRequestTest, EachMalformedShapeIsRefusedNamingItsField) {
  struct Case {
    const char* body;
    const char* code;
    const char* param;
  };
  const Case cases[] = {
      {"{not json", "invalid_json", ""},
      {"[1, 2]", "invalid_json", ""},
      {R"({"model": 3, "messages": []})", "invalid_request", "model"},
      {R"({"model": "m"})", "invalid_request", "messages"},
      {R"({"messages": [{"content": 5}]})", "invalid_request", "messages[0].content"},
      {R"({"messages": [{"content": [{"text": "no type"}]}]})", "invalid_request", "messages[0].content[0].type"},
      {R"({"messages": [{"content": [{"type": "image_url", "image_url": {}}]}]})", "invalid_request",
       "messages[0].content[0].image_url.url"},
      {R"({"messages": [{"content": [{"type": "image_url", "image_url": "data:,", "uuid": 7}]}]})", "invalid_request",
       "messages[0].content[0].uuid"},
      {R"({"messages": [{"content": [{"type": "image_url", "image_url": "data:,", "epd_public": "yes"}]}]})",
       "invalid_request", "messages[0].content[0].epd_public"},
      {R"({"messages": [{"content": [{"type": "input_audio", "input_audio": {}}]}]})", "unsupported_content",
       "messages[0].content[0].type"},
      {R"({"messages": [], "stream": true})", "stream_unsupported", "stream"},
      {R"({"messages": [], "mm_processor_kwargs": [1]})", "invalid_request", "mm_processor_kwargs"},
      {R"({"messages": [], "ec_transfer_params": {"consumer_zmq": "tcp://d:1"}})", "unsupported_connector",
       "ec_transfer_params.consumer_zmq"}};
  for (const Case& c : cases) {
    const FrontError e = Refused(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.code, c.code) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
  }
}

TEST(KwargsCheckTest, MediaIoEqualToTheServerPassesAndEveryOtherSettingIsRefusedByName) {
  WorkerOptions w;
  w.video_sampling.fps = 2.0;
  w.preprocess.max_pixels = 1003520;
  EXPECT_FALSE(CheckProcessingKwargs(nullptr, nullptr, w).has_value());
  EXPECT_FALSE(CheckProcessingKwargs(json::object(), json{{"video", {{"fps", 2}}}}, w).has_value());
  const auto fps = CheckProcessingKwargs(nullptr, json{{"video", {{"fps", 4}}}}, w);
  ASSERT_TRUE(fps.has_value());
  EXPECT_EQ(fps->param, "media_io_kwargs.video.fps");
  EXPECT_NE(fps->message.find("media_io_kwargs.video.fps = 4 (this server: 2) would change the embedding"),
            std::string::npos)
      << fps->message;
  const auto frames = CheckProcessingKwargs(nullptr, json{{"video", {{"num_frames", 16}}}}, w);
  ASSERT_TRUE(frames.has_value());
  EXPECT_NE(frames->message.find("media_io_kwargs.video.num_frames cannot be matched"), std::string::npos);
  const auto pixels = CheckProcessingKwargs(json{{"max_pixels", 12845056}}, nullptr, w);
  ASSERT_TRUE(pixels.has_value());
  EXPECT_EQ(pixels->code, "processing_kwargs_refused");
  EXPECT_NE(pixels->message.find("mm_processor_kwargs.max_pixels = 12845056 (this server: 1003520)"),
            std::string::npos);
  // Equal, but vLLM would key the item by hash(uuid, kwargs): refused too.
  const auto equal = CheckProcessingKwargs(json{{"max_pixels", 1003520}}, nullptr, w);
  ASSERT_TRUE(equal.has_value());
  EXPECT_NE(equal->message.find("vLLM keys an item by hash(uuid, mm_processor_kwargs)"), std::string::npos);
}

TEST(ChatReplyTest, PatchTimestampsAreTheMeanOfEachPatchsFrames) {
  EXPECT_EQ(PatchTimestamps({0.0, 0.5, 1.0, 1.5}, 2, 2), (std::vector<double>{0.25, 1.25}));
  EXPECT_EQ(PatchTimestamps({0.0, 0.5, 1.0}, 2, 2), (std::vector<double>{0.25, 1.0}));  // last frame repeated
  const HttpResponse r = ErrorResponse(FrontError{422, "item 0: bad", "undecodable_media", "messages[0]"});
  EXPECT_EQ(r.status, 422);
  EXPECT_EQ(json::parse(r.body), json::parse(R"({"error": {"message": "item 0: bad", "type": "UnprocessableEntityError",
                                      "code": "undecodable_media", "param": "messages[0]"}})"));
}

TEST(MediaSourceTest, DataUrlsDecodeAndFileUrlsStayUnderTheAllowedPath) {
  char tmpl[] = "/tmp/media_source_test.XXXXXX";
  const fs::path root = mkdtemp(tmpl);
  fs::create_directory(root / "allowed");
  std::ofstream(root / "allowed" / "in.png") << "inside";
  std::ofstream(root / "secret.png") << "outside";
  fs::create_symlink(root / "secret.png", root / "allowed" / "link.png");
  MediaFetchOptions fo;
  fo.max_bytes = 100;
  auto src = MediaSource::Create(fo, (root / "allowed").string());
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_EQ(*(*src)->Resolve("data:image/png;base64,aGVs\nbG8="), "hello");  // with a line break
  EXPECT_EQ(*(*src)->Resolve("data:;base64,aGVsbG8="), "hello");             // one block, one '='
  EXPECT_EQ(*(*src)->Resolve("data:image/png;base64,aGk="), "hi");
  EXPECT_EQ(*(*src)->Resolve("data:image/png;base64,aGkh"), "hi!");
  EXPECT_EQ((*src)->Resolve("data:image/png;base64,@@@@").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*src)->Resolve("data:image/png,hello").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*src)->Resolve("data:;base64," + std::string(200, 'A')).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(*(*src)->Resolve("file://" + (root / "allowed" / "in.png").string()), "inside");
  EXPECT_EQ(*(*src)->Resolve("file://" + (root / "allowed" / "i%6E.png").string()), "inside");  // percent-decoded
  const auto via_link = (*src)->Resolve("file://" + (root / "allowed" / "link.png").string());
  EXPECT_EQ(via_link.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(via_link.status().message().find("is outside --allowed-local-media-path"), std::string::npos);
  EXPECT_EQ((*src)->Resolve("file://" + (root / "allowed" / ".." / "secret.png").string()).status().code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ((*src)->Resolve("file://" + (root / "allowed" / "none.png").string()).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ((*src)->Resolve("gopher://x/").status().code(), StatusCode::kInvalidArgument);
  auto off = MediaSource::Create(fo, "");
  EXPECT_EQ((*off)->Resolve("file://" + (root / "allowed" / "in.png").string()).status().code(),
            StatusCode::kPermissionDenied);
  fs::remove_all(root);
}

}  // namespace
}  // namespace epd::internal
