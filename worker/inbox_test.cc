#include "worker/inbox.h"

#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"

namespace duet::worker {
namespace {

TEST_CASE("an inbox hands over what was posted, in order, once", "[worker][inbox]") {
  Inbox<int> inbox;
  for (int i = 0; i < 5; ++i) REQUIRE(inbox.Post(i));
  std::vector<int> got = {42};
  REQUIRE(inbox.Take(absl::ZeroDuration(), &got));
  CHECK(got == std::vector<int>{0, 1, 2, 3, 4});
  REQUIRE(inbox.Take(absl::ZeroDuration(), &got));  // Nothing new: no wait, nothing taken.
  CHECK(got.empty());
}

TEST_CASE("an inbox wakes its taker on a post from another thread, and stops", "[worker][inbox]") {
  Inbox<int> inbox;
  absl::Notification taking;
  std::vector<int> got;
  bool taken = false;
  std::thread taker([&] {
    taking.Notify();
    taken = inbox.Take(absl::InfiniteDuration(), &got);
  });
  taking.WaitForNotification();
  REQUIRE(inbox.Post(7));
  taker.join();
  CHECK(taken);
  CHECK(got == std::vector<int>{7});

  // Stopped: a waiting taker returns false, posts are refused, and what was
  // posted before is drained for shutdown.
  REQUIRE(inbox.Post(8));
  CHECK(inbox.Stop());
  CHECK_FALSE(inbox.Stop());
  CHECK_FALSE(inbox.Post(9));
  CHECK_FALSE(inbox.Take(absl::InfiniteDuration(), &got));
  CHECK(inbox.Drain() == std::vector<int>{8});
}

}  // namespace
}  // namespace duet::worker
