// CommandRunner (loop_command.h).
#include "loop_command.h"

#include <utility>

#include "item_rules.h"

namespace epd::internal {

void Finish(const std::function<void(const RequestResult&)>& on_done, std::promise<RequestResult>& promise,
            const RequestResult& result) {
  try {
    if (on_done) on_done(result);
  } catch (...) {
    promise.set_value(result);
    throw;
  }
  promise.set_value(result);
}

void Refuse(const std::function<void(const RequestResult&)>& on_done, std::promise<RequestResult>& promise,
            const std::string& id, Status status) {
  try {
    Finish(on_done, promise, RequestResult{id, std::move(status), {}});
  } catch (...) {
    // A throwing callback must not take the worker thread down.
  }
}

void CommandRunner::Process(LoopCommand& c) {
  if (c.cancel) {
    if (c.ticket != 0) {
      auto h = holder_.find(c.request.id);
      if (h == holder_.end() || h->second != c.ticket) return;
    }
    worker_.Cancel(c.request.id);
    return;
  }
  if (parking_ != nullptr && !c.resolved) {
    c.callbacks = parking_->WithWriteBack(std::move(c.callbacks));
    if (Park(c)) return;
  }
  Submit(c);
}

void CommandRunner::Submit(LoopCommand& c) {
  std::shared_ptr<std::promise<RequestResult>> promise = std::move(c.promise);
  std::function<void(const RequestResult&)> user_done = std::move(c.callbacks.on_done);
  std::string id = c.request.id;
  const std::uint64_t ticket = c.ticket;
  // Recorded before the worker sees the request, since a request of hits
  // completes inside Submit. An id already held stays with its holder: the
  // worker refuses this submission.
  const bool holds = holder_.try_emplace(id, ticket).second;
  RequestCallbacks callbacks{std::move(c.callbacks.on_item),
                             [this, user_done, promise, id, ticket](const RequestResult& r) {
                               if (auto h = holder_.find(id); h != holder_.end() && h->second == ticket)
                                 holder_.erase(h);
                               publish_();  // before completing: Stats() counts a request its caller saw finish
                               Finish(user_done, *promise, r);
                             }};
  const bool cancelled = c.cancelled;
  Status s =
      LoopSubmit::Submit(worker_, std::move(c.request), std::move(callbacks), std::move(c.keys), std::move(c.adopted));
  // Values the worker refused are deleted from the tier before the items'
  // re-encodes are written back (both go through the tier's write queue).
  if (parking_ != nullptr) {
    for (EncodeWorker::RefusedValue& r : worker_.TakeRefused()) parking_->Reject(r.key, r.why);
  }
  if (s.ok() && cancelled) worker_.Cancel(id);
  if (s.ok()) return;
  if (holds) holder_.erase(id);
  Refuse(user_done, *promise, id, std::move(s));
}

bool CommandRunner::Park(LoopCommand& c) {
  auto parked = std::make_shared<LoopCommand>(std::move(c));
  const SharedTierParking::Outcome outcome = parking_->Park(
      parked->request, parked->keys, parked->ticket, [this](const ContentKey& k) { return worker_.HasLocal(k); },
      [this, parked](std::vector<EmbeddingPtr> ready, std::vector<double> seconds, bool cancelled) {
        parked->adopted.resize(ready.size());
        for (std::size_t i = 0; i < ready.size(); ++i) {
          parked->adopted[i] = AdoptedValue{std::move(ready[i]), seconds[i]};
        }
        parked->resolved = true;
        parked->cancelled = cancelled;
        requeue_(std::move(*parked));
      });
  switch (outcome) {
    case SharedTierParking::Outcome::kLocal:
      c = std::move(*parked);
      return false;
    case SharedTierParking::Outcome::kDuplicate:
      Refuse(parked->callbacks.on_done, *parked->promise, parked->request.id, AlreadyInFlight(parked->request.id));
      return true;
    case SharedTierParking::Outcome::kParked:
      break;
  }
  return true;
}

}  // namespace epd::internal
