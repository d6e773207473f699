// src/testing/redis_test_cluster.h (test-only): a real Redis Cluster of the
// test's own: `masters` redis-server processes in cluster mode
// (src/testing/redis_server.h: free loopback ports, stopped by PID), joined
// with CLUSTER MEET, slots split evenly with CLUSTER ADDSLOTSRANGE, no
// replicas. Slots move the way redis-cli's reshard moves them (CLUSTER
// SETSLOT IMPORTING / MIGRATING, MIGRATE, SETSLOT NODE), one step at a time
// so that a test can stop between them.
//
// Usage:
//   epd::test_util::RedisCluster cluster(EPD_REDIS_SERVER, 3);  // formed, state ok
//   std::string url = cluster.url();        // redis-cluster://127.0.0.1:<p0>,...
//   int owner = cluster.MasterOf(slot);     // index of the node serving it
//   cluster.BeginMove(slot, owner, other);  // ASK from here on for keys not yet moved
//   cluster.Migrate(owner, other, {key});   // the keys, as MIGRATE moves them
//   cluster.FinishMove(slot, other);        // MOVED from the old owner
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "redis_server.h"

namespace epd::test_util {

class RedisCluster {
 public:
  RedisCluster(const std::string& binary, int masters) {
    for (int i = 0; i < masters; ++i) {
      // The bus port is given: its default, port + 10000, overflows for a
      // high ephemeral port.
      bus_ports_.push_back(FreeBusPort());
      nodes_.push_back(std::make_unique<RedisServer>(
          binary, std::vector<std::string>{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                           "--cluster-node-timeout", "1000", "--protected-mode", "no", "--cluster-port",
                                           std::to_string(bus_ports_.back())}));
    }
    for (int i = 0; i < masters; ++i) {
      owner_first_.push_back(i * 16384 / masters);
      const std::string last = std::to_string((i + 1) * 16384 / masters - 1);
      Expect(node(i).Cli({"CLUSTER", "ADDSLOTSRANGE", std::to_string(owner_first_.back()), last}), "+OK");
      if (i > 0) {
        Expect(node(i).Cli(
                   {"CLUSTER", "MEET", "127.0.0.1", std::to_string(node(0).port()), std::to_string(bus_ports_[0])}),
               "+OK");
      }
      ids_.push_back(Bulk(node(i).Cli({"CLUSTER", "MYID"})));
    }
    owner_first_.push_back(16384);
    WaitOk();
  }

  RedisServer& node(int i) { return *nodes_[static_cast<std::size_t>(i)]; }
  int size() const { return static_cast<int>(nodes_.size()); }
  std::string url() const {
    std::string out = "redis-cluster://";
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      out += (i > 0 ? "," : "") + std::string("127.0.0.1:") + std::to_string(nodes_[i]->port());
    }
    return out;
  }

  // The node serving `slot`, by the initial split and the moves made since.
  int MasterOf(int slot) const {
    for (const auto& [s, to] : moved_) {
      if (s == slot) return to;
    }
    for (std::size_t i = 0; i + 1 < owner_first_.size(); ++i) {
      if (slot < owner_first_[i + 1]) return static_cast<int>(i);
    }
    throw std::logic_error("slot out of range");
  }

  void BeginMove(int slot, int from, int to) {
    Expect(node(to).Cli({"CLUSTER", "SETSLOT", std::to_string(slot), "IMPORTING", ids_[from]}), "+OK");
    Expect(node(from).Cli({"CLUSTER", "SETSLOT", std::to_string(slot), "MIGRATING", ids_[to]}), "+OK");
  }
  void Migrate(int from, int to, const std::vector<std::string>& keys) {
    for (const std::string& k : keys) {
      const std::string r = node(from).Cli({"MIGRATE", "127.0.0.1", std::to_string(node(to).port()), k, "0", "5000"});
      if (r.rfind("+OK", 0) != 0 && r.rfind("+NOKEY", 0) != 0) throw std::runtime_error("MIGRATE failed: " + r);
    }
  }
  void FinishMove(int slot, int to) {
    for (int i = 0; i < size(); ++i) {
      Expect(node(i).Cli({"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", ids_[to]}), "+OK");
    }
    moved_.emplace_back(slot, to);
  }

 private:
  // A free loopback port for a cluster bus (bound, then closed).
  static int FreeBusPort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) throw std::runtime_error("bind failed");
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
  }
  static void Expect(const std::string& reply, const std::string& prefix) {
    if (reply.rfind(prefix, 0) != 0) throw std::runtime_error("redis cluster setup: got " + reply);
  }
  static std::string Bulk(const std::string& reply) {
    const std::size_t body = reply.find("\r\n") + 2;
    return reply.substr(body, reply.size() - body - 2);
  }
  // Every node sees every other and all slots served (bounded: 20 s).
  void WaitOk() {
    const std::string known = "cluster_known_nodes:" + std::to_string(size()) + "\r\n";
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      bool ok = true;
      for (int i = 0; i < size() && ok; ++i) {
        const std::string info = node(i).Cli({"CLUSTER", "INFO"});
        ok = info.find("cluster_state:ok") != std::string::npos && info.find(known) != std::string::npos;
      }
      if (ok) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    throw std::runtime_error("the Redis Cluster did not reach state ok within 20 s");
  }

  std::vector<std::unique_ptr<RedisServer>> nodes_;
  std::vector<int> bus_ports_;
  std::vector<std::string> ids_;
  std::vector<int> owner_first_;  // first slot of each node, then 16384
  std::vector<std::pair<int, int>> moved_;
};

}  // namespace epd::test_util
