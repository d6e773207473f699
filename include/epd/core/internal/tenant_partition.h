// epd/core/internal/tenant_partition.h (internal): per-tenant reservations
// over any policy P: one P per tenant plus the ledger
// (epd/core/tenant_quota.h states the model; epd/core/internal/cache_policy.h
// the calls).
//
// Each entry is charged to the tenant of the put that placed it
// (EntryCost::tenant) and sits in that tenant's P. The victim is the first,
// in the global order (VictimKey: the oldest touch under recency, the lowest
// GDSF priority then the oldest), of the victims of the tenants holding more
// than their reservation. A put of n bytes by tenant t is refused (counted)
// when n > R_t + the shared pool. A re-put by another tenant moves the entry
// to that tenant's P and charge. The tenants' Ps are siblings: they share
// P's clock, history and duel, so their priorities compare.
//
// EmbeddingCache switches to TenantPartition<P> at its first reservation
// (SetTenantReservation); the entries it already holds are charged to
// kSharedTenant. Without one the cache's policy is P alone.
// Complexity: P's, plus O(T) per victim over the tenants seen.
// Memory: P's per tenant, 2 bytes per slab slot, the ledger's rows.
// Thread safety: thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "epd/core/cache_options.h"
#include "epd/core/internal/cache_policy.h"
#include "epd/core/tenant_quota.h"

namespace epd::internal {

template <typename P>
class TenantPartition {
 public:
  // Takes over `policy` as kSharedTenant's order, with the `entries` (slab
  // slots) and `bytes` a cache of `capacity_bytes` holds now.
  TenantPartition(P policy, std::int64_t capacity_bytes, std::size_t slots, std::int64_t bytes)
      : ledger_(capacity_bytes), tenant_(slots, kSharedTenant) {
    parts_.push_back(std::move(policy));
    ledger_.Charge(kSharedTenant, bytes);
  }

  // See TenantLedger::SetReservation (throws as it does).
  void SetReservation(TenantId t, std::int64_t bytes) {
    ledger_.SetReservation(t, bytes);
    Grow(t);
  }
  const TenantLedger& ledger() const { return ledger_; }

  bool Admits(const EntryCost& c, std::int64_t nbytes) {
    if (ledger_.Admits(c.tenant, nbytes)) return true;
    ledger_.CountRefusal(c.tenant);
    return false;
  }
  template <typename SeqOf>
  void Insert(const EntryRef& r, EntryMeta& m, const EntryCost& c, const SeqOf& seq_of) {
    Assign(r.id, c.tenant);
    ledger_.Charge(c.tenant, r.nbytes);
    parts_[c.tenant].Insert(r, m, c, seq_of);
  }
  template <typename SeqOf>
  void Replace(const EntryRef& r, std::int64_t old_nbytes, EntryMeta& m, const EntryCost& c, const SeqOf& seq_of) {
    const TenantId old = tenant_[r.id];
    ledger_.Discharge(old, old_nbytes);
    if (old != c.tenant) {
      parts_[old].Remove(r);
      Assign(r.id, c.tenant);
      parts_[c.tenant].Join();
    }
    ledger_.Charge(c.tenant, r.nbytes);
    parts_[c.tenant].Replace(r, old_nbytes, m, c, seq_of);
  }
  template <typename SeqOf>
  void Hit(const EntryRef& r, EntryMeta& m, const SeqOf& seq_of) {
    parts_[tenant_[r.id]].Hit(r, m, seq_of);
  }
  void Miss(std::uint64_t h) { parts_[kSharedTenant].Miss(h); }  // shared state: any sibling
  void Requested(const EntryRef& r, const EntryMeta& m) { parts_[tenant_[r.id]].Requested(r, m); }
  void Remove(const EntryRef& r) {
    parts_[tenant_[r.id]].Remove(r);
    ledger_.Discharge(tenant_[r.id], r.nbytes);
  }

  // The first, by VictimKey, of the victims of tenants over their reservation.
  template <typename SeqOf>
  std::uint32_t Victim(std::uint32_t keep, const SeqOf& seq_of) {
    std::uint32_t best = kNoEntry;
    VictimKey best_key{};
    for (std::size_t t = 0; t < parts_.size(); ++t) {
      if (!ledger_.Over(static_cast<TenantId>(t))) continue;
      const std::uint32_t c = parts_[t].Victim(keep, seq_of);
      if (c == kNoEntry) continue;
      const VictimKey key = parts_[t].KeyOf(c, seq_of);
      if (best == kNoEntry || key < best_key) {
        best = c;
        best_key = key;
      }
    }
    return best;
  }
  void Prepare(std::size_t entries) { parts_[kSharedTenant].Prepare(entries); }
  bool Evict(const EntryRef& r) {
    const TenantId t = tenant_[r.id];
    ledger_.CountEviction(t);
    ledger_.Discharge(t, r.nbytes);
    return parts_[t].Evict(r);
  }
  template <typename SeqOf>
  void Trim(const SeqOf& seq_of) {
    for (P& p : parts_) p.Trim(seq_of);
  }
  std::uint64_t rank_epoch() const { return parts_[kSharedTenant].rank_epoch(); }
  void Rerank(const EntryRef& r, const EntryMeta& m) { parts_[tenant_[r.id]].Rerank(r, m); }
  void FillCost(std::uint32_t e, EntryCost& c) const { c.tenant = tenant_[e]; }

  // Every tenant's order merged: O(n log n).
  template <typename SeqOf, typename F>
  void ForEach(const SeqOf& seq_of, F&& f) const {
    std::vector<std::pair<VictimKey, std::uint32_t>> all;
    for (const P& p : parts_) p.ForEach(seq_of, [&](std::uint32_t e) { all.emplace_back(p.KeyOf(e, seq_of), e); });
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [key, e] : all) f(e);
  }

  double clock() const { return parts_[kSharedTenant].clock(); }
  const AdmissionFilter* history() const { return parts_[kSharedTenant].history(); }
  const PolicyDuel* duel() const { return parts_[kSharedTenant].duel(); }
  std::size_t memory_bytes() const {
    std::size_t n = parts_.capacity() * sizeof(P) + tenant_.capacity() * sizeof(TenantId);
    for (const P& p : parts_) n += p.OrderBytes();
    return n + parts_[kSharedTenant].SharedBytes();
  }

 private:
  // Makes room for tenant t's order (a sibling of the first).
  void Grow(TenantId t) {
    while (parts_.size() <= t) parts_.push_back(parts_.front().Sibling());
  }
  void Assign(std::uint32_t e, TenantId t) {
    if (tenant_.size() <= e) tenant_.resize(static_cast<std::size_t>(e) + 1, kSharedTenant);
    tenant_[e] = t;
    Grow(t);
  }

  TenantLedger ledger_;
  std::vector<TenantId> tenant_;  // by slab slot
  std::vector<P> parts_;          // by tenant; [0] always exists
};

}  // namespace epd::internal
