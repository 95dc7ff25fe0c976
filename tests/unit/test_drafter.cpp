// The n-gram (prompt lookup) drafter: what it proposes and how it backs off.
#include <gtest/gtest.h>

#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/runtime/drafter.h"

namespace kestrel::runtime {
namespace {

using Ids = std::vector<TokenId>;

TEST(NgramDrafter, ProposesWhatFollowedTheMostRecentEarlierMatch) {
  NgramDrafter d(6);
  // "1 2 3" occurs twice before the end; the later occurrence is followed by 7 8.
  const Ids history = {1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 0, 1, 2, 3};
  EXPECT_EQ(d.draft(history, 6), (Ids{7, 8}));  // the draft length starts at 2
  d.verified(2, 2);                              // accepted whole: 4
  EXPECT_EQ(d.draft(history, 6), (Ids{7, 8, 0, 1}));
  EXPECT_EQ(d.draft(history, 3), (Ids{7, 8, 0}));  // the caller's limit
  EXPECT_EQ(d.draft(history, 0), Ids{});
}

TEST(NgramDrafter, FallsBackToShorterNgramsAndNeedsTwoTokens) {
  NgramDrafter d(6);
  EXPECT_EQ(d.draft(Ids{5, 6, 9, 9, 5, 6}, 6), (Ids{9, 9}));  // 2-gram "5 6"
  EXPECT_EQ(d.draft(Ids{5, 6, 7, 8, 6}, 6), Ids{});            // a 1-gram is not enough
  EXPECT_EQ(d.draft(Ids{1, 2, 3}, 6), Ids{});                  // no repeat
  EXPECT_EQ(d.draft(Ids{}, 6), Ids{});
  EXPECT_EQ(d.draft(Ids{4}, 6), Ids{});
}

TEST(NgramDrafter, PausesLongerAfterEachDraftThatMissedWhole) {
  NgramDrafter d(6);
  const Ids history = {1, 2, 3, 1, 2};
  auto drafts_in = [&](int steps) {
    int n = 0;
    for (int i = 0; i < steps; ++i) n += d.draft(history, 6).empty() ? 0 : 1;
    return n;
  };
  ASSERT_FALSE(d.draft(history, 6).empty());
  d.verified(2, 0);  // pause 1
  EXPECT_EQ(drafts_in(1), 0);
  ASSERT_FALSE(d.draft(history, 6).empty());
  d.verified(1, 0);  // pause 2
  EXPECT_EQ(drafts_in(2), 0);
  ASSERT_FALSE(d.draft(history, 6).empty());
  d.verified(1, 0);  // pause 4
  EXPECT_EQ(drafts_in(4), 0);
  ASSERT_FALSE(d.draft(history, 6).empty());
  d.verified(1, 1);  // a hit: no pause, and the next miss pauses 1 again
  ASSERT_FALSE(d.draft(history, 6).empty());
  d.verified(2, 0);
  EXPECT_EQ(drafts_in(1), 0);
  EXPECT_FALSE(d.draft(history, 6).empty());
  // Misses in a row never pause longer than kMaxPause.
  for (int i = 0; i < 20; ++i) {
    while (d.draft(history, 6).empty()) {
    }
    d.verified(1, 0);
  }
  EXPECT_EQ(drafts_in(static_cast<int>(NgramDrafter::kMaxPause)), 0);
  EXPECT_FALSE(d.draft(history, 6).empty());
}

TEST(NgramDrafter, PartialAcceptanceSetsTheLength) {
  NgramDrafter d(6);
  const Ids history = {1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2};
  d.verified(2, 2);
  d.verified(4, 4);  // 6 (capped)
  EXPECT_EQ(d.draft(history, 6).size(), 6u);
  d.verified(6, 2);  // 3
  EXPECT_EQ(d.draft(history, 6).size(), 3u);
}

TEST(NgramDrafter, PartlyAcceptedDraftsPauseWhileTheRateIsLow) {
  NgramDrafter d(6);
  const Ids history = {1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2};
  // A third of each draft accepted: the rate falls 1 -> 0.83 -> 0.71 -> 0.62 -> 0.55 -> 0.49.
  for (int i = 0; i < 4; ++i) {
    ASSERT_FALSE(d.draft(history, 6).empty()) << i;
    d.verified(3, 1);
  }
  ASSERT_FALSE(d.draft(history, 6).empty());
  d.verified(3, 1);                      // under kMinRate: pause 1
  EXPECT_TRUE(d.draft(history, 6).empty());
  EXPECT_FALSE(d.draft(history, 6).empty());
}

TEST(NgramDrafter, ModeNames) {
  EXPECT_EQ(parse_draft_mode("none"), DraftMode::kNone);
  EXPECT_EQ(parse_draft_mode("ngram"), DraftMode::kNgram);
  EXPECT_EQ(parse_draft_mode("auto"), DraftMode::kAuto);
  // Anything else names a draft model image (the caller loads it and reports a missing file).
  EXPECT_EQ(parse_draft_mode("small.kimg"), DraftMode::kModel);
  EXPECT_THROW(parse_draft_mode(""), Error);
  EXPECT_EQ(parse_draft_accept("exact"), DraftAccept::kExact);
  EXPECT_EQ(parse_draft_accept("distribution"), DraftAccept::kDistribution);
  EXPECT_THROW(parse_draft_accept("sample"), Error);
  EXPECT_STREQ(draft_accept_name(DraftAccept::kDistribution), "distribution");
}

// The drafters' shared length policy, through the Drafter interface.
TEST(NgramDrafter, DraftsThroughTheDrafterInterface) {
  NgramDrafter ngram(6);
  Drafter& d = ngram;
  const Ids history = {1, 2, 3, 4, 1, 2};
  DraftRequest r;
  r.history = history;
  r.limit = 6;
  r.sample = true;  // deterministic drafts all the same: no q
  const Draft draft = d.draft(r);
  EXPECT_EQ(draft.tokens, (Ids{3, 4}));
  EXPECT_TRUE(draft.q.empty());
  DraftLength length(6);
  EXPECT_EQ(length.next(6), 2u);
  length.verified(2, 2);
  EXPECT_EQ(length.next(6), 4u);
  EXPECT_EQ(length.next(3), 3u);
  length.verified(4, 0);  // a miss: paused one step, then half the length
  EXPECT_EQ(length.next(6), 0u);
  EXPECT_EQ(length.next(6), 2u);
}

}  // namespace
}  // namespace kestrel::runtime
