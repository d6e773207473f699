// src/worker/loop_command.h (internal to epd::worker): what WorkerLoop's
// thread does with each command from its inbox (epd/worker/worker_loop.h).
//
// A submit goes to the shared tier's parking first when the loop has one
// (SharedTierParking: its image keys found nowhere locally are looked up on
// the lookup threads, and the command comes back through the inbox,
// `resolved`, with the values found), then to EncodeWorker::Submit, with its
// on_done wrapped so that the loop's stats are published before the caller
// sees the request finish and the promise is fulfilled exactly once. A
// cancel reaches the request whose submission holds the id: with a ticket,
// only that submission's (an id refused as ALREADY_EXISTS must not let its
// own cancel reach the request holding it).
//
// Thread safety: thread-compatible: Process runs on the loop's thread only,
// which is also where the worker calls on_done (and so where holder_ changes).
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "adopted_value.h"
#include "epd/core/encode_types.h"
#include "epd/worker/encode_worker.h"
#include "shared_tier_lookup.h"

namespace epd::internal {

// One submit or cancel on its way from WorkerLoop's callers to its thread.
struct LoopCommand {
  bool cancel = false;
  // A submission's ticket; for a cancel, the submission it targets (0: the
  // request holding the id, whichever it is).
  std::uint64_t ticket = 0;
  // Back from the shared tier's lookup: submit as it is. `cancelled`: a
  // Cancel arrived while it was parked.
  bool resolved = false;
  bool cancelled = false;
  EncodeRequest request;  // request.id is the id to cancel when `cancel`
  RequestCallbacks callbacks;
  std::vector<StatusOr<ContentKey>> keys;
  // What the shared tier held for the items (set when `resolved`): empty,
  // or one entry per item.
  std::vector<AdoptedValue> adopted;
  std::shared_ptr<std::promise<RequestResult>> promise;
};

// Runs the user's on_done (which may throw), then fulfils the promise either
// way; rethrows what on_done threw.
void Finish(const std::function<void(const RequestResult&)>& on_done, std::promise<RequestResult>& promise,
            const RequestResult& result);
// Completes a submission that the worker never accepted with `status` and no
// items; a throwing on_done is swallowed (the future carries the result).
void Refuse(const std::function<void(const RequestResult&)>& on_done, std::promise<RequestResult>& promise,
            const std::string& id, Status status);

class CommandRunner {
 public:
  // `worker` and `parking` (null: no shared tier) must outlive the runner.
  // `requeue` puts a command back into the loop's inbox (a parked request
  // coming back; called on a lookup thread); `publish` refreshes the loop's
  // stats snapshot.
  CommandRunner(EncodeWorker& worker, SharedTierParking* parking, std::function<void(LoopCommand)> requeue,
                std::function<void()> publish)
      : worker_(worker), parking_(parking), requeue_(std::move(requeue)), publish_(std::move(publish)) {}

  void Process(LoopCommand& c);

 private:
  // Parks `c` when some of its keys are not local; true when it was parked
  // or refused as a duplicate of a parked request.
  bool Park(LoopCommand& c);
  void Submit(LoopCommand& c);

  EncodeWorker& worker_;
  SharedTierParking* const parking_;
  const std::function<void(LoopCommand)> requeue_;
  const std::function<void()> publish_;
  // Which submission holds each id the worker has accepted and not finished
  // (set in Submit, erased by on_done).
  std::unordered_map<std::string, std::uint64_t> holder_;
};

}  // namespace epd::internal
