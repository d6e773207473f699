// See epd/openai/openai_front.h. The request's path through here:
// ChatResponse (count, time) -> Answer (checks) -> Resolve (media bytes) ->
// ServerFrontDoor::Encode (the worker) -> Group (ids) -> Publish (files)
// -> ChatCompletion (the reply).
#include "epd/openai/openai_front.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <limits>
#include <map>
#include <variant>

#include "chat_reply.h"
#include "chat_request.h"
#include "epd/server/request_shape.h"
#include "front_error.h"
#include "front_metrics.h"
#include "kwargs_check.h"
#include "media_source.h"
#include "probe_reply.h"

namespace epd {
namespace {

using internal::FrontError;
using internal::MediaKind;

using Clock = std::chrono::steady_clock;

std::int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The media-source failure of one item as the front answers it.
FrontError MediaError(const Status& s, const internal::ChatItem& item) {
  static const std::map<StatusCode, std::pair<int, const char*>> kMap = {
      {StatusCode::kPermissionDenied, {400, "media_url_refused"}},
      {StatusCode::kNotFound, {400, "media_not_found"}},
      {StatusCode::kInvalidArgument, {400, "invalid_media_url"}},
      {StatusCode::kResourceExhausted, {413, "media_too_large"}},
      {StatusCode::kUnavailable, {502, "media_fetch_failed"}},
      {StatusCode::kDeadlineExceeded, {504, "media_fetch_timeout"}},
      {StatusCode::kCancelled, {499, "client_closed_request"}}};
  const auto it = kMap.find(s.code());
  const auto [status, code] = it != kMap.end() ? it->second : std::pair<int, const char*>{500, "media_error"};
  const std::string field = item.kind == MediaKind::kImage ? ".image_url.url" : ".video_url.url";
  return FrontError{status, "item " + std::to_string(item.index) + " (" + item.where + "): " + s.message(), code,
                    item.where + field};
}

std::string FetchOutcome(StatusCode c) {
  switch (c) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kPermissionDenied:
      return "refused";
    case StatusCode::kResourceExhausted:
      return "too_large";
    case StatusCode::kUnavailable:
      return "failed";
    case StatusCode::kDeadlineExceeded:
      return "timeout";
    case StatusCode::kCancelled:
      return "cancelled";
    default:
      return "bad_url";
  }
}

bool IsJson(const std::optional<std::string>& content_type) {
  if (!content_type.has_value()) return false;
  std::string t = content_type->substr(0, content_type->find(';'));
  t.erase(std::remove_if(t.begin(), t.end(), [](unsigned char c) { return std::isspace(c); }), t.end());
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  return t == "application/json";
}

}  // namespace

struct OpenAiFront::Impl {
  OpenAiFrontOptions o;
  ServerFrontDoor door;
  std::string model;
  std::int64_t started_s = UnixSeconds();
  std::unique_ptr<internal::MediaSource> media;
  std::shared_ptr<EcPublisher> ec;  // null = nothing published
  std::shared_ptr<internal::FrontMetrics> metrics = std::make_shared<internal::FrontMetrics>();
  std::shared_ptr<HttpEndpoint> http;
  std::atomic<std::uint64_t> seq{0};

  explicit Impl(ServerFrontDoor d) : door(d) {}

  // A chat request, in two stages: Chat (parse and check, on an endpoint
  // thread; the media then resolve on MediaSource's fetch threads, in
  // parallel, charged to the request budget as their bytes arrive) and
  // Encode (back on an endpoint thread: the worker, the files, the reply).
  // No endpoint thread waits for a fetch.
  struct Call {
    Call(const HttpRequest& r, const HttpResponder& h) : http(r), respond(h) {}
    HttpRequest http;
    HttpResponder respond;
    Clock::time_point start = Clock::now();
    std::optional<internal::ChatRequest> req{};
    std::atomic<bool> budget_refused{false};
    bool probe = false;  // POST /v1/probe: the same path, answered by ProbeReply
  };

  void Finish(Call& c, HttpResponse out) const {
    door.ObserveRequest(std::chrono::duration<double>(Clock::now() - c.start).count());
    if (const auto id = c.http.Header("x-request-id")) out.headers.emplace_back("X-Request-Id", *id);
    c.respond(std::move(out));
  }

  void Chat(const HttpRequest& r, const HttpResponder& respond, bool probe = false) {
    auto c = std::make_shared<Call>(r, respond);
    c->probe = probe;
    if (auto e = Admit(*c)) return Finish(*c, ErrorResponse(*e));
    std::vector<std::string> urls;
    for (const internal::ChatItem& item : c->req->items) urls.push_back(item.url);
    if (std::none_of(urls.begin(), urls.end(), internal::IsHttpUrl)) {
      // data: and file:// only: quick and bounded, so here, never queued
      // behind other requests' slow fetches on the fetch threads.
      internal::ResolvedMedia m = ResolveHere(*c, urls);
      HttpResponse out = Encode(*c, m);
      door.ReleaseBudget(m.charged_bytes);
      return Finish(*c, std::move(out));
    }
    internal::ResolveOptions ro;
    ro.deadline = Clock::now() + o.media.timeout;
    ro.parallelism = o.fetch_parallelism;
    ro.cancel = respond.client_gone_flag();
    ro.charge = [this, c](std::int64_t bytes) {
      Status s = door.TakeBudget(bytes);
      if (!s.ok()) c->budget_refused = true;
      return s;
    };
    media->ResolveAll(std::move(urls), std::move(ro), [this, c](internal::ResolvedMedia m) {
      auto media_done = std::make_shared<internal::ResolvedMedia>(std::move(m));
      c->respond.Post([this, c, media_done] {
        HttpResponse out = Encode(*c, *media_done);
        door.ReleaseBudget(media_done->charged_bytes);
        Finish(*c, std::move(out));
      });
    });
  }

  // data: and file:// media resolved on this thread, charged as
  // ResolveAll charges them.
  internal::ResolvedMedia ResolveHere(Call& c, const std::vector<std::string>& urls) const {
    internal::ResolvedMedia m;
    for (const std::string& url : urls) {
      StatusOr<std::string> got =
          m.failed ? StatusOr<std::string>(Cancelled("not resolved: an item failed first")) : media->Resolve(url);
      if (got.ok()) {
        const auto bytes = static_cast<std::int64_t>(got->size());
        if (Status s = door.TakeBudget(bytes); !s.ok()) {
          c.budget_refused = true;
          got = s;
        } else {
          m.charged_bytes += bytes;
        }
      }
      if (!got.ok() && !m.failed) m.failed = m.items.size();
      m.items.push_back(std::move(got));
    }
    return m;
  }

  // The checks before any media is resolved; fills c.req.
  std::optional<FrontError> Admit(Call& c) const {
    if (!door.serving()) return FrontError{503, "the server is draining (shutting down)", "draining"};
    if (!IsJson(c.http.Header("Content-Type"))) {
      return FrontError{415,
                        "the request body must be application/json, got '" +
                            Utf8Safe(c.http.Header("Content-Type").value_or("none")) + "'",
                        "unsupported_media_type"};
    }
    auto parsed = internal::ParseChatRequest(c.http.body);
    if (auto* e = std::get_if<FrontError>(&parsed)) return *e;
    c.req = std::move(std::get<internal::ChatRequest>(parsed));
    return Check(c.http, *c.req);
  }

  std::optional<FrontError> Check(const HttpRequest& r, const internal::ChatRequest& req) const {
    if (req.model.has_value() && *req.model != model) {
      return FrontError{404, "The model `" + *req.model + "` does not exist; this encoder serves `" + model + "`",
                        "model_not_found", "model"};
    }
    if (auto e = internal::CheckProcessingKwargs(req.mm_processor_kwargs, req.media_io_kwargs, door.worker_options())) {
      return e;
    }
    if (auto e = CheckShape(req)) return e;
    if (StatusOr<CallerIdentity> t = Caller(r); !t.ok()) {
      if (t.status().code() == StatusCode::kUnauthenticated)
        return FrontError{401, t.status().message(), "invalid_token"};
      return FrontError{400, t.status().message(), "invalid_tenant", door.tenant_header()};
    }
    return std::nullopt;
  }

  // The request-shape rules the gRPC door applies too (request_shape.h),
  // on the media parts; the body's size is the endpoint's limit. A chat
  // without media parts has nothing to encode and is answered with none.
  std::optional<FrontError> CheckShape(const internal::ChatRequest& req) const {
    if (req.items.empty()) return std::nullopt;
    RequestShape shape;
    for (const internal::ChatItem& item : req.items) {
      shape.items.push_back(
          ItemShape{.image = item.kind != MediaKind::kVideo, .video = item.kind == MediaKind::kVideo});
    }
    const Status s = CheckRequestShape(shape, {door.max_items_per_request(), std::numeric_limits<std::int64_t>::max()});
    if (s.ok()) return std::nullopt;
    return FrontError{400, s.message(), "too_many_items", "messages"};
  }

  StatusOr<CallerIdentity> Caller(const HttpRequest& r) const {
    return door.Caller(r.Header("Authorization"), r.Header(door.tenant_header()), r.remote_ip);
  }

  // The worker's request for `req`'s items from their resolved bytes, or
  // the failure that ended the resolve.
  std::variant<EncodeRequest, FrontError> Build(Call& c, internal::ResolvedMedia& m) const {
    const internal::ChatRequest& req = *c.req;
    for (std::size_t i = 0; i < req.items.size(); ++i) {
      const internal::ChatItem& item = req.items[i];
      if (!internal::IsHttpUrl(item.url)) continue;
      const StatusCode code = m.items[i].status().code();
      if (m.failed && i != *m.failed && code == StatusCode::kCancelled) continue;  // stopped, not fetched
      metrics->CountFetch(FetchOutcome(code));
    }
    if (m.failed) {
      const internal::ChatItem& item = req.items[*m.failed];
      const Status& s = m.items[*m.failed].status();
      if (c.budget_refused && s.code() == StatusCode::kResourceExhausted)
        return FrontError{429, "item " + std::to_string(item.index) + ": " + s.message(), "over_capacity"};
      if (s.code() == StatusCode::kCancelled && !c.respond.client_gone() && !door.serving())
        return FrontError{503, "the server is shutting down; the media fetches were stopped", "draining"};
      return MediaError(s, item);
    }
    EncodeRequest out;
    for (std::size_t i = 0; i < req.items.size(); ++i) {
      const internal::ChatItem& item = req.items[i];
      EncodeItemInput in;
      if (item.kind == MediaKind::kVideo) {
        in.video = VideoInput{MediaBytes(std::move(*m.items[i])), {}, std::nullopt};
      } else {
        in.media = MediaBytes(std::move(*m.items[i]));
      }
      in.is_public = item.is_public;  // honoured only for a public reader (the worker's ItemNamespace)
      out.items.push_back(std::move(in));
    }
    return out;
  }

  // The request-level or lowest-index item failure, as answered.
  static std::optional<FrontError> Failure(const RequestResult& res) {
    if (!res.status.ok()) {
      return FrontError{internal::HttpStatusOf(res.status.code(), false), res.status.message(),
                        res.status.code() == StatusCode::kResourceExhausted ? "over_capacity" : "encode_refused"};
    }
    for (const ItemResult& it : res.items) {
      if (it.status.ok()) continue;
      const int status = internal::HttpStatusOf(it.status.code(), true);
      return FrontError{status, "item " + std::to_string(it.index) + ": " + it.status.message(),
                        status == 422 ? "undecodable_media" : "encode_failed"};
    }
    return std::nullopt;
  }

  // One entry per id, in order of first appearance; `reps` gets the
  // result each entry publishes.
  std::variant<std::vector<internal::PublishedItem>, FrontError> Group(const internal::ChatRequest& req,
                                                                       const RequestResult& res,
                                                                       std::vector<const ItemResult*>& reps) const {
    std::vector<internal::PublishedItem> out;
    std::map<std::string, std::size_t> at;
    const FrontTowerInfo tower = door.tower();
    for (const internal::ChatItem& item : req.items) {
      const ItemResult& r = res.items[static_cast<std::size_t>(item.index)];
      const std::string id = item.uuid.value_or(r.key.Hex());
      if (auto it = at.find(id); it != at.end()) {
        if (reps[it->second]->key != r.key) {
          return FrontError{400,
                            "the uuid '" + id + "' names two different media in this request (items " +
                                std::to_string(out[it->second].indices[0]) + " and " + std::to_string(item.index) + ")",
                            "uuid_conflict", item.where + ".uuid"};
        }
        out[it->second].indices.push_back(item.index);
        continue;
      }
      internal::PublishedItem p{id, item.kind, r.embedding->grid, {}, {item.index}};
      if (item.kind == MediaKind::kVideo && tower.deepstack_layers > 0 && r.video != nullptr) {
        p.timestamps = internal::PatchTimestamps(r.video->timestamps_s, p.grid.t,
                                                 door.worker_options().preprocess.temporal_patch_size);
      }
      at[id] = out.size();
      out.push_back(std::move(p));
      reps.push_back(&r);
    }
    return out;
  }

  // Under tenant isolation each tenant's files go to its own directory.
  std::optional<FrontError> Publish(const std::vector<internal::PublishedItem>& items,
                                    const std::vector<const ItemResult*>& reps, const CallerIdentity& caller) {
    if (ec == nullptr) return std::nullopt;
    const std::string tenant = caller.key_namespace.has_value() ? caller.tenant : std::string();
    for (std::size_t i = 0; i < items.size(); ++i) {
      StatusOr<EmbeddingPtr> host = ToHost(reps[i]->embedding);
      StatusOr<EcOutcome> done = host.ok() ? ec->Publish({items[i].id, reps[i]->key.Hex(), tenant}, **host)
                                           : StatusOr<EcOutcome>(host.status());
      if (!done.ok()) {
        const std::string m = done.status().message();
        return FrontError{500, "item " + std::to_string(items[i].indices[0]) + ": " + m,
                          m.rfind("ec_dir_write_failed", 0) == 0 ? "ec_dir_write_failed" : "ec_publish_failed"};
      }
    }
    return std::nullopt;
  }

  HttpResponse Encode(Call& c, internal::ResolvedMedia& m) {
    auto built = Build(c, m);
    if (auto* e = std::get_if<FrontError>(&built)) return ErrorResponse(*e);
    const StatusOr<CallerIdentity> who = Caller(c.http);
    if (!who.ok()) return ErrorResponse(FrontError{401, who.status().message(), "invalid_token"});
    const CallerIdentity& caller = *who;
    if (c.probe) {
      return internal::ProbeReply(door.Probe(std::move(std::get<EncodeRequest>(built)), caller), model,
                                  door.server_id());
    }
    // The media's bytes are charged already (ResolveAll's charge); the body's here.
    const auto body_bytes = static_cast<std::int64_t>(c.http.body.size());
    const RequestResult res = door.Encode(std::move(std::get<EncodeRequest>(built)), body_bytes, caller);
    if (auto e = Failure(res)) return ErrorResponse(*e);
    std::vector<const ItemResult*> reps;
    auto grouped = Group(*c.req, res, reps);
    if (auto* e = std::get_if<FrontError>(&grouped)) return ErrorResponse(*e);
    const auto& items = std::get<std::vector<internal::PublishedItem>>(grouped);
    if (auto e = Publish(items, reps, caller)) return ErrorResponse(*e);
    std::int64_t tokens = 0;
    for (const ItemResult& it : res.items) tokens += it.embedding->tokens;
    char id[32];
    std::snprintf(id, sizeof(id), "chatcmpl-%016llx", static_cast<unsigned long long>(++seq));
    return internal::ChatCompletion(id, model, UnixSeconds(), items, tokens);
  }

  HttpResponse Health(const HttpRequest&) const {
    if (!door.serving()) return ErrorResponse(FrontError{503, "the server is draining (shutting down)", "draining"});
    return HttpResponse{200, "application/json", ""};
  }

  HttpResponse Models(const HttpRequest&) const {
    const nlohmann::json card = {{"id", model},
                                 {"object", "model"},
                                 {"created", started_s},
                                 {"owned_by", "epd-encode"},
                                 {"root", door.worker_options().model_id},
                                 {"parent", nullptr}};
    return HttpResponse{200, "application/json",
                        nlohmann::json{{"object", "list"}, {"data", {card}}}.dump(
                            -1, ' ', false, nlohmann::json::error_handler_t::replace)};
  }
};

OpenAiFront::OpenAiFront(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OpenAiFront::~OpenAiFront() { Stop(); }

StatusOr<std::unique_ptr<OpenAiFront>> OpenAiFront::Start(OpenAiFrontOptions options, ServerFrontDoor door) {
  auto impl = std::make_unique<Impl>(door);
  Impl* self = impl.get();
  self->o = std::move(options);
  self->model = self->o.served_model_name.empty() ? door.worker_options().model_id : self->o.served_model_name;
  StatusOr<std::unique_ptr<internal::MediaSource>> media =
      internal::MediaSource::Create(self->o.media, self->o.allowed_local_media_path, self->o.fetch_threads);
  if (!media.ok()) return media.status();
  self->media = std::move(*media);
  if (!self->o.ec_dir.empty()) {
    StatusOr<std::unique_ptr<EcPublisher>> ec = EcPublisher::Open(
        {self->o.ec_dir, self->o.ec_dir_max_bytes, self->o.ec_dir_grace, nullptr, self->o.ec_dir_group});
    if (!ec.ok()) return ec.status();
    self->ec = std::move(*ec);
  }
  HttpEndpointOptions http = self->o.http;
  if (door.auth_enabled()) {
    http.authorize = [door](const std::optional<std::string>& h) { return door.Authorize(h); };
  }
  http.error_page = internal::EndpointErrorPage;
  StatusOr<std::unique_ptr<HttpEndpoint>> ep = HttpEndpoint::Start(
      http, {{"POST", "/v1/chat/completions", true, nullptr,
              [self](const HttpRequest& r, const HttpResponder& respond) { self->Chat(r, respond); }},
             {"POST", "/v1/probe", true, nullptr,
              [self](const HttpRequest& r, const HttpResponder& respond) { self->Chat(r, respond, true); }},
             {"GET", "/v1/models", true, [self](const HttpRequest& r) { return self->Models(r); }},
             {"GET", "/health", false, [self](const HttpRequest& r) { return self->Health(r); }}});
  if (!ep.ok()) return ep.status();
  self->http = std::move(*ep);
  door.AddMetricsSource([metrics = self->metrics, ec = self->ec, http = self->http] {
    const EcPublisherStats stats = ec != nullptr ? ec->Stats() : EcPublisherStats{};
    return metrics->Render(ec != nullptr ? &stats : nullptr, http->Stats());
  });
  return std::unique_ptr<OpenAiFront>(new OpenAiFront(std::move(impl)));
}

int OpenAiFront::port() const { return impl_->http->port(); }
const std::string& OpenAiFront::served_model_name() const { return impl_->model; }

OpenAiFrontStats OpenAiFront::Stats() const {
  OpenAiFrontStats s;
  if (impl_->ec != nullptr) s.ec = impl_->ec->Stats();
  s.http = impl_->http->Stats();
  s.responses = s.http.responses;
  return s;
}

void OpenAiFront::Stop() {
  // The fetches in flight stop first, so that their requests are answered
  // (503, Build) while the endpoint still writes answers; else Stop waited
  // for them and then closed their connections with no answer at all.
  if (impl_->media != nullptr) impl_->media->StopAll();
  impl_->http->Stop();
  impl_->media.reset();  // stops the fetches in flight (their answers are dropped)
}

}  // namespace epd
