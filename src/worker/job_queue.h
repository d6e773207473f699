// src/worker/job_queue.h (internal to epd::worker): the jobs that are not yet
// in a tower batch, and the gate that keeps batches independent of video
// decode timing.
//
// A job goes through here from its creation to its batch: queued on the
// JobScheduler (by job id, with its by-key rank, cost, share cost and tenant)
// and handed to the PrefetchDecoder at its scheduler rank, or HELD behind a
// barrier. A barrier (GateBarrier) stands for a video whose container is
// still being decoded. The gate has two forms, by the scheduler's order.
//
// kFifo and kByKey: one arrival line. The jobs a decode will make belong in
// the scheduler where the video was submitted, before every job submitted
// after it, whatever its tenant (these orders know no tenants). So:
//   - while a barrier is pending, Add holds each new job in arrival order
//     (it is a job already: joinable and counted by the queue bound, but not
//     on the scheduler and not prefetched);
//   - Flush, once the head barrier is resolved (its decode completed or its
//     item was abandoned), calls its Expand, which queues the video's jobs
//     with AddNow, then queues the held jobs behind it, in order, up to the
//     next unresolved barrier;
//   - while any barrier is pending, NextBatch starts nothing (Gated()),
//     unless the scheduler's next batch is closed (kFifo: it ends before its
//     last pending job or is full, so no later job could join it).
// Hence every batch holds exactly what it would hold had each video been
// decoded inside its Submit, and a pending video holds back exactly the
// batches its chunks could join: in arrival order every later job's.
//
// kFair: one lane per tenant, and a SLOT in the fair order (issue 40, B67).
// A pending video holds back only its own tenant's later work and the
// batches that reach its place in the fair order; another tenant's work
// ahead of that place is batched at once.
//   - A tenant's barrier and the jobs its tenant submits after it wait in
//     the tenant's lane, in arrival order (a tenant's own items keep their
//     order); other tenants' jobs are queued at once.
//   - The barrier at the head of a lane has a slot: a placeholder job of its
//     tenant on the scheduler, tagged where the calls put it, of no tokens
//     and of share SlotShare(): the image cost model's decode term for one
//     frame of the largest size the video limits admit (max_source_pixels /
//     (patch_size * merge_size)^2: 85,598 at the defaults, about an
//     8000x8000 image's), and at least the batch share bound
//     (FairShareBound), so that no non-empty batch fits it: no batch reaches
//     past a slot, and a slot is only ever alone at the head of the order.
//   - NextBatch first settles the head: while the scheduler's next job is a
//     slot, its decode must be resolved (else Gated(), and nothing starts),
//     then the slot leaves the scheduler, Expand queues the video's jobs
//     (tagged from its tenant's history: the slot's share, then each chunk's
//     tokens) and the lane's jobs follow, up to its next barrier, which gets
//     its slot. Then the batch is formed as usual.
//   - Flush passes only abandoned barriers at the head of a lane (a cancel):
//     their slot leaves the scheduler and their lane goes on. A completed
//     decode is expanded only when its slot comes to the head of the order.
// Why this stays deterministic (tensor-parallel ranks that see the same
// calls form the same batches): the scheduler changes only in Submit, Cancel
// and a batch start (NextBatch), never on a decode completion. A slot's tags
// come from the calls, a video is expanded at the first batch start that
// finds its slot at the head, whichever rank decoded it first, and a batch
// start that finds the head slot's decode pending changes nothing and forms
// no batch (Step waits there for the decode; WorkerLoop retries once it
// completes, and the batch it then forms is the one any rank forms). So decode
// timing decides only WHEN a batch starts, as in the arrival line. What the
// lanes change is which batches those are: a video's chunks join the batches
// formed from its place in the fair order on, never one formed before it.
// (A chunk's hit or miss is still decided against the cache at expansion.)
//
// Benefits: another tenant's misses never wait on a pending decode until
// that tenant has been served about a slot's share (85,598 units: some 130
// misses of 512x512) past the video's place; the video's tenant keeps its
// own order. Costs: past that share, a decode still pending holds every
// batch (the price of batches that do not depend on decode timing); a video
// is charged its slot's share on top of its chunks' tokens; and a tenant's
// misses behind its own pending video wait for it, as before.
//
// Invariants between calls: the scheduler holds exactly the queued jobs and
// the slots, and queued_ the queued jobs' prefetch handles. Arrival line:
// held_ holds the held jobs and pending barriers in arrival order, and starts
// with an unresolved barrier or is empty once Flush has run. Lanes: each
// lane in lanes_ is non-empty and starts with a barrier that has a slot in
// slots_; no lane's head is abandoned once Flush has run; no slot is the
// scheduler's head with a resolved barrier once NextBatch has run.
//
// Complexity: Add, AddNow O(log n); Remove O(log n) for a queued job, O(held)
// for a held one; Flush O(jobs it queues * log n + lanes); NextBatch O(k log n)
// plus O(jobs it queues * log n) for the videos it expands; Gated O(k log n).
// Thread safety: thread-compatible (the worker's owning thread).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "epd/core/job_scheduler.h"
#include "epd/media/preprocess.h"
#include "epd/worker/encode_request.h"
#include "epd/worker/worker_options.h"
#include "job_table.h"
#include "prefetch_decoder.h"
#include "tower_runner.h"

namespace epd::internal {

// A pending video's place in the queue (video_serving.h implements it).
class GateBarrier {
 public:
  virtual ~GateBarrier() = default;
  // True once the queue may pass it: the decode completed or the item left.
  virtual bool Resolved() const = 0;
  // True once the item left (cancelled or failed): passed at once, as soon
  // as it heads its line (kFair: its lane), with Expand doing nothing.
  virtual bool Abandoned() const = 0;
  // Called once, by Flush, when the barrier is at the head and resolved. It
  // may queue jobs with JobQueue::AddNow (never Add or Flush) and post
  // results to the JobTable.
  virtual void Expand() = 0;
};

// One job's scheduling: what the scheduler needs and what makes its rows.
struct JobWork {
  JobId id = 0;
  std::int64_t cost = 0;        // post-merge tokens
  std::int64_t share_cost = 0;  // kFair (0 = cost)
  std::string tenant;
  ByKeyRank rank;
  // The rows: an image's bytes (decoded and preprocessed by the
  // PrefetchDecoder), or, when set, a computation that makes them (a video's
  // chunk, over frames already decoded).
  MediaBytes media;
  std::function<StatusOr<PreprocessedImage>()> make;
};

class JobQueue {
 public:
  // `options` and `decoder` must outlive the queue.
  JobQueue(const WorkerOptions& options, PrefetchDecoder& decoder);

  // Queues `w`, or holds it while a barrier is pending.
  void Add(JobWork w);
  // Queues `w` now, ahead of every held job. Only from GateBarrier::Expand.
  void AddNow(JobWork w);
  // Appends a barrier of `tenant` whose jobs rank as `rank` (kByKey): jobs
  // added after it (kFair: of its tenant) are held until it is passed.
  void AddBarrier(std::shared_ptr<GateBarrier> barrier, const std::string& tenant, const ByKeyRank& rank);
  // Passes the resolved barriers at the head of the arrival line, or (kFair)
  // the abandoned ones at the head of a lane (see the header comment).
  void Flush();
  // Takes job `id` out, held or queued (dropping its prefetch decode);
  // false when it is neither (it is running).
  bool Remove(JobId id);

  // True when NextBatch must wait for a pending barrier.
  bool Gated() const;
  // True when NextBatch may have something to do: a job or a slot is queued.
  bool Schedulable() const { return scheduler_.pending_size() > 0; }
  // The next batch's entries (each with its prefetch handle), taken off the
  // scheduler; empty when nothing is queued, Gated(), or (kFair with decode
  // helpers) an item of the batch is not decoded yet: then every such item
  // is marked as needed, so the batch makes progress and the tower thread
  // never decodes, or waits on, an expensive image while other tenants'
  // work could run.
  std::vector<BatchEntry> NextBatch();

  std::int64_t queued() const { return static_cast<std::int64_t>(scheduler_.pending_size() - slots_.size()); }
  std::int64_t held() const { return held_jobs_; }
  std::int64_t barriers() const { return barriers_; }
  // Tokens of the queued and held jobs.
  std::int64_t pending_tokens() const { return scheduler_.pending_tokens() + held_tokens_; }
  // What the queue bound counts as pending: queued and held jobs, and each
  // pending barrier as one job (a video not decoded yet, as Submit counts it).
  std::int64_t load() const { return queued() + held_jobs_ + barriers_; }

 private:
  struct Held {
    JobWork work;                          // unless `barrier`; for one, work.rank is its rank
    std::shared_ptr<GateBarrier> barrier;  // set for a barrier
  };
  using Lane = std::deque<Held>;
  // A slot's scheduler ids have this bit; job ids (JobTable) never do.
  static constexpr JobId kSlotBit = JobId{1} << 63;

  void Queue(JobWork w);
  bool NextBatchDecoded();
  // kFair: the lanes.
  bool Fair() const { return options_.order == ScheduleOrder::kFair; }
  std::int64_t SlotShare() const;
  void OpenSlot(const std::string& tenant, const ByKeyRank& rank);
  void CloseSlot(const std::string& tenant);
  // Queues the lane's jobs up to its next live barrier, which gets a slot;
  // erases the lane when it empties.
  void ReleaseLane(std::map<std::string, Lane>::iterator lane);
  void DropAbandonedHeads();
  // The slot at the head of the scheduler's order, if any.
  std::optional<JobId> HeadSlot() const;
  // Expands resolved slots at the head of the order; false when the head is
  // a slot whose decode is still pending.
  bool SettleHead();
  bool RemoveHeld(JobId id);

  const WorkerOptions& options_;
  PrefetchDecoder& decoder_;
  JobScheduler scheduler_;
  std::unordered_map<JobId, std::shared_ptr<PrefetchDecoder::Task>> queued_;
  std::deque<Held> held_;               // the arrival line (kFifo, kByKey)
  std::map<std::string, Lane> lanes_;   // kFair: by tenant (an ordered map: settled in tenant order)
  std::map<JobId, std::string> slots_;  // kFair: each slot's tenant
  JobId next_slot_ = 0;
  std::int64_t held_jobs_ = 0;
  std::int64_t held_tokens_ = 0;
  std::int64_t barriers_ = 0;
};

}  // namespace epd::internal
