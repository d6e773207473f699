// TaskPool: order of due and delayed tasks, concurrency, and shutdown.
#include "task_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <vector>

namespace epd::internal {
namespace {

using Clock = TaskPool::Clock;

TEST(TaskPoolTest, OneThreadRunsDueTasksInPostOrder) {
  TaskPool pool(1);
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::mutex mu;
  std::vector<int> order;
  // The first task holds the only thread until every other one is queued.
  pool.Post([open] { open.wait(); });
  for (int i = 0; i < 20; ++i) {
    pool.Post([&, i] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    });
  }
  std::promise<void> last;
  pool.Post([&] { last.set_value(); });
  gate.set_value();
  last.get_future().wait();
  std::vector<int> expected;
  expected.reserve(20);
  for (int i = 0; i < 20; ++i) expected.push_back(i);
  EXPECT_EQ(order, expected);
}

TEST(TaskPoolTest, CancelDropsADelayedTaskOnlyBeforeItRuns) {
  TaskPool pool(2);
  std::atomic<int> ran{0};
  const TaskPool::TaskId late = pool.PostAt(Clock::now() + std::chrono::hours(1), [&] { ++ran; });
  std::promise<void> done;
  const TaskPool::TaskId soon = pool.PostAt(Clock::now(), [&] {
    ++ran;
    done.set_value();
  });
  done.get_future().wait();
  EXPECT_TRUE(pool.Cancel(late));
  EXPECT_FALSE(pool.Cancel(late));                // once
  EXPECT_FALSE(pool.Cancel(soon));                // it ran
  EXPECT_FALSE(pool.Cancel(TaskPool::TaskId{}));  // names none
  pool.Shutdown();
  EXPECT_EQ(ran.load(), 1);
}

TEST(TaskPoolTest, AnEarlierDueTimeRunsFirstWhateverThePostOrder) {
  TaskPool pool(1);
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::mutex mu;
  std::vector<int> order;
  pool.Post([open] { open.wait(); });
  const Clock::time_point base = Clock::now();
  // Posted latest-first; all are due by the time the gate opens.
  for (int i = 4; i >= 0; --i) {
    pool.PostAt(base + std::chrono::microseconds(i), [&, i] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    });
  }
  std::promise<void> last;
  pool.PostAt(base + std::chrono::microseconds(10), [&] { last.set_value(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(1));  // every due time has passed
  gate.set_value();
  last.get_future().wait();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(TaskPoolTest, ADelayedTaskWaitsForItsTimeAndDoesNotBlockDueOnes) {
  TaskPool pool(1);
  std::atomic<bool> delayed_ran{false};
  const Clock::time_point when = Clock::now() + std::chrono::milliseconds(50);
  std::promise<Clock::time_point> ran_at;
  pool.PostAt(when, [&] {
    delayed_ran = true;
    ran_at.set_value(Clock::now());
  });
  std::promise<bool> due;
  pool.Post([&] { due.set_value(delayed_ran.load()); });
  EXPECT_FALSE(due.get_future().get());  // the due task passed the delayed one
  EXPECT_GE(ran_at.get_future().get(), when);
}

TEST(TaskPoolTest, TasksRunOnSeveralThreadsAtOnce) {
  TaskPool pool(3);
  std::atomic<int> waiting{0};
  std::promise<void> all_in;
  std::shared_future<void> together = all_in.get_future().share();
  std::vector<std::future<void>> finished;
  std::vector<std::promise<void>> done(3);
  for (int i = 0; i < 3; ++i) {
    finished.push_back(done[i].get_future());
    pool.Post([&, i, together] {
      if (++waiting == 3) all_in.set_value();
      together.wait();  // returns only once all three run at the same time
      done[i].set_value();
    });
  }
  for (std::future<void>& f : finished) f.wait();
  EXPECT_EQ(waiting.load(), 3);
}

TEST(TaskPoolTest, ShutdownRunsDueTasksDropsDelayedOnesAndLaterPosts) {
  std::atomic<int> due_ran{0};
  std::atomic<bool> delayed_ran{false}, late_ran{false};
  {
    TaskPool pool(1);
    std::promise<void> gate;
    std::shared_future<void> open = gate.get_future().share();
    pool.Post([open] { open.wait(); });
    for (int i = 0; i < 5; ++i) pool.Post([&] { ++due_ran; });
    pool.PostAt(Clock::now() + std::chrono::hours(1), [&] { delayed_ran = true; });
    std::thread opener([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      gate.set_value();
    });
    pool.Shutdown();  // waits for the gate, then the due tasks
    opener.join();
    pool.Post([&] { late_ran = true; });
    pool.Shutdown();  // idempotent
  }
  EXPECT_EQ(due_ran.load(), 5);
  EXPECT_FALSE(delayed_ran.load());
  EXPECT_FALSE(late_ran.load());
}

}  // namespace
}  // namespace epd::internal
