// src/http/http_session.h (internal): one connection of an HttpEndpoint,
// driven on the endpoint's I/O thread by asynchronous Boost.Beast reads and
// writes (epd/http/http_endpoint.h for the rules it enforces).
//
// Phases: handshake (TLS) -> head -> [body] -> serving (a pool thread runs
// the handler) -> writing -> idle (keep-alive) -> head ... A single timer
// holds the phase's deadline; when it fires the socket's operations are
// cancelled and the read's completion answers 408 (or closes). While parked
// (handshake, head, idle) the session is in the endpoint's park, ordered by
// its deadline.
//
// Thread safety: every member function runs on the I/O thread.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <memory>
#include <optional>
#include <string>

#include "endpoint_impl.h"

namespace epd::internal {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(HttpEndpoint::Impl* ep, boost::asio::ip::tcp::socket socket);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void Start();
  // The handler's answer (posted by the responder).
  void Deliver(HttpResponse response);
  // Closes at once (Stop, eviction). `count_evicted`: counted as evicted.
  void Close(bool count_evicted = false);
  // Stop: closes a session that is not serving or writing.
  void CloseIfWaiting();
  // The body budget has room for this session's body now.
  // Returns false while its body still does not fit (the caller stops
  // granting), true once it took its bytes or no longer waits.
  bool BodyBudgetGranted();

 private:
  enum class Phase { kHandshake, kHead, kIdle, kBudget, kBody, kServing, kWriting, kLinger, kClosed };
  using Parser = boost::beast::http::request_parser<boost::beast::http::string_body>;

  template <class F>
  void WithStream(F&& f);
  bool Park(HttpClock::time_point deadline);  // false: this very session was evicted
  void Unpark();
  void ArmTimer(HttpClock::time_point when);
  void OnTimer();
  void ReadHead(bool first);
  void OnHead(boost::system::error_code ec);
  void OnHeadError(boost::system::error_code ec);
  bool AcceptHead();  // the target, framing, route and token; false: refused
  void Refuse(int status, const std::string& message, std::vector<std::pair<std::string, std::string>> headers = {});
  void StartBody();
  void ReadBody();
  void ReadMore();
  bool ChargeArrived();  // false: the body budget has no room for what arrived
  void OnBody(boost::system::error_code ec);
  void Dispatch();
  void WatchClient();
  void Write(HttpResponse response);
  void AfterWrite(boost::system::error_code ec);
  void Linger();
  void ReleaseBody();

  HttpEndpoint::Impl* ep_;
  boost::asio::ip::tcp::socket socket_;
  std::unique_ptr<boost::asio::ssl::stream<boost::asio::ip::tcp::socket&>> tls_;
  boost::asio::steady_timer timer_;
  std::uint64_t timer_gen_ = 0;
  boost::beast::flat_buffer buffer_;
  std::optional<Parser> parser_;
  std::optional<boost::beast::http::response<boost::beast::http::string_body>> response_;
  Phase phase_ = Phase::kHandshake;
  std::optional<std::multimap<HttpClock::time_point, Session*>::iterator> parked_;
  const HttpRoute* route_ = nullptr;  // of the request being read or served
  bool timed_out_ = false;
  std::string timeout_message_;  // why a body read was cut short
  bool keep_alive_ = true;
  bool linger_ = false;  // the body was not read: drain before closing
  bool watching_ = false;
  int served_ = 0;
  std::int64_t body_want_ = 0;      // what this body reserves before its first byte (64 KiB)
  std::int64_t body_reserved_ = 0;  // taken from the endpoint's body budget
  HttpClock::time_point body_start_{}, body_deadline_{};
  std::string remote_ip_;
  int remote_port_ = 0;
  std::shared_ptr<std::atomic<bool>> gone_;
  // While serving, nothing else may hold the session (no read is pending
  // when the next request's bytes are buffered): this keeps it for the
  // handler's answer. Cleared by Deliver and Close.
  std::shared_ptr<Session> serving_hold_;
  std::unique_ptr<char[]> scratch_;  // lingering reads
  std::size_t lingered_ = 0;         // bytes discarded while lingering
};

}  // namespace epd::internal
