// The metrics registry (runtime/metrics.h; docs/runtime.md, "Metrics registry").
#include "runtime/metrics.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace cozy::runtime {
namespace {

using namespace std::chrono_literals;

std::string ThrownBy(const std::function<void()>& act) {
  try {
    act();
  } catch (const std::logic_error& error) {
    return error.what();
  }
  return "";
}

TEST(MetricsRegistry, RefusesASecondFamilyOfTheSameName) {
  MetricsRegistry registry;
  registry.Counter("daemon_passes_total", "Passes.");
  EXPECT_NE(ThrownBy([&] {
              registry.Gauge("daemon_passes_total", "Again.");
            }).find("daemon_passes_total"),
            std::string::npos);
  EXPECT_NE(ThrownBy([&] { registry.HistogramFamily("daemon_passes_total", "Again.", {1}); }), "");
}

TEST(MetricsRegistry, RefusesASampleWhoseLabelCountDiffers) {
  MetricsRegistry registry;
  MetricFamily& answers =
      registry.Counter("daemon_answers_total", "Answers.", {"webhook", "result"});
  EXPECT_NE(ThrownBy([&] { answers.Add({"vmi"}, 1); }).find("daemon_answers_total"),
            std::string::npos);
  EXPECT_NE(ThrownBy([&] { answers.Set(3); }), "");
  MetricFamily& leader = registry.Gauge("daemon_leader", "Leading.");
  EXPECT_NE(ThrownBy([&] { leader.Set({"extra"}, 1); }).find("daemon_leader"), std::string::npos);
  // A collector's sample is checked the same way, and the scrape that saw it fails loudly; so
  // is a family named that was never declared.
  EXPECT_NE(ThrownBy([&] {
              MetricsScrape scrape(&registry);
              scrape.Set("daemon_undeclared", 1);
            }).find("daemon_undeclared"),
            std::string::npos);
  registry.AddCollector([&](MetricsScrape& scrape) { scrape.Set(answers, {"vmi"}, 1); });
  EXPECT_NE(ThrownBy([&] { registry.Render(); }).find("daemon_answers_total"), std::string::npos);
}

// The same families written with the writer, as every daemon wrote them before the registry.
TEST(MetricsRegistry, RendersWhatTheWriterWritesForTheSameFamilies) {
  Histogram latency({0.01, 0.1, 1});
  latency.Observe(0.05);
  latency.Observe(2.5);
  MetricsWriter writer;
  writer.Family("daemon_info", "gauge", "Build.");
  writer.Sample("daemon_info", Label("version", "v1 \"q\"\\\n"), 1);
  writer.Family("daemon_answers_total", "counter", "Answers.");
  writer.Sample("daemon_answers_total", Label("webhook", "vmi") + "," + Label("result", "allowed"),
                1796567890);
  writer.Sample("daemon_answers_total", Label("webhook", "pod") + "," + Label("result", "error"),
                0.25);
  writer.Family("daemon_latency_seconds", "histogram", "Latency.");
  latency.Write(writer, "daemon_latency_seconds");
  writer.Family("daemon_empty", "gauge", "Nothing yet.");
  writer.Family("daemon_collected", "gauge", "Read at the scrape.");
  writer.Sample("daemon_collected", Label("cache", "pods"), 7);

  MetricsRegistry registry;
  registry.Gauge("daemon_info", "Build.", {"version"}).Set({"v1 \"q\"\\\n"}, 1);
  MetricFamily& answers =
      registry.Counter("daemon_answers_total", "Answers.", {"webhook", "result"});
  answers.Add({"vmi", "allowed"}, 1796567889);
  answers.Add({"pod", "error"}, 0.25);
  answers.Add({"vmi", "allowed"}, 1);
  MetricFamily& histogram =
      registry.HistogramFamily("daemon_latency_seconds", "Latency.", {0.01, 0.1, 1});
  histogram.Observe(0.05);
  histogram.Observe(2.5);
  MetricFamily& empty = registry.Gauge("daemon_empty", "Nothing yet.", {"reason"});
  MetricFamily& collected = registry.Gauge("daemon_collected", "Read at the scrape.", {"cache"});
  registry.Gauge("daemon_never_set", "Not written until set.");
  registry.AddCollector([&](MetricsScrape& scrape) {
    scrape.Show(empty);
    scrape.Set(collected, {"pods"}, 7);
  });
  EXPECT_EQ(registry.Render(), writer.Take());
}

TEST(MetricsRegistry, ACollectorsFamiliesAreThoseOfItsLastScrape) {
  MetricsRegistry registry;
  MetricFamily& objects = registry.Gauge("daemon_cache_objects", "Objects.", {"cache"});
  std::vector<std::string> caches = {"pods", "nodes"};
  registry.AddCollector([&](MetricsScrape& scrape) {
    for (const std::string& cache : caches) scrape.Set(objects, {cache}, 1);
  });
  EXPECT_NE(registry.Render().find("daemon_cache_objects{cache=\"nodes\"} 1\n"), std::string::npos);
  caches = {"pods"};
  EXPECT_EQ(registry.Render().find("nodes"), std::string::npos);
  caches.clear();
  EXPECT_EQ(registry.Render(), "");
}

TEST(MetricsRegistry, ConcurrentUpdatesUnderAScrapeAreAllCounted) {
  MetricsRegistry registry;
  MetricFamily& events = registry.Counter("daemon_events_total", "Events.", {"kind"});
  MetricFamily& latency = registry.HistogramFamily("daemon_latency_seconds", "Latency.", {1});
  constexpr int kThreads = 4;
  constexpr int kEach = 20000;
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done) {
      const std::string page = registry.Render();
      ASSERT_EQ(page.find("\n\n"), std::string::npos);
    }
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        events.Add({t % 2 == 0 ? "even" : "odd"}, 1);
        latency.Observe(0.5);
      }
    });
  }
  for (std::thread& writer : writers) writer.join();
  done = true;
  scraper.join();
  const std::string page = registry.Render();
  EXPECT_NE(page.find("daemon_events_total{kind=\"even\"} 40000\n"), std::string::npos) << page;
  EXPECT_NE(page.find("daemon_events_total{kind=\"odd\"} 40000\n"), std::string::npos) << page;
  EXPECT_NE(page.find("daemon_latency_seconds_count 80000\n"), std::string::npos) << page;
}

// A collector posted to a loop that does not answer delays the scrape by the bound at most, and
// the page keeps what that collector gave last.
TEST(MetricsRegistry, APostedCollectorIsWaitedForAtMostTheBound) {
  MetricsRegistry registry;
  registry.SetCollectBound(200ms);
  MetricFamily& passes = registry.Counter("daemon_passes_total", "Passes.");
  std::atomic<bool> answering{true};
  std::vector<std::function<void()>> late;
  std::mutex lateMutex;
  double count = 0;
  registry.AddCollector([&](MetricsScrape& scrape) { scrape.Set(passes, ++count); },
                        [&](std::function<void()> work) {
                          if (answering) {
                            std::thread(std::move(work)).join();
                          } else {
                            std::lock_guard<std::mutex> lock(lateMutex);
                            late.push_back(std::move(work));
                          }
                        });
  EXPECT_EQ(registry.Render(),
            "# HELP daemon_passes_total Passes.\n# TYPE daemon_passes_total "
            "counter\ndaemon_passes_total 1\n");
  answering = false;
  const auto start = std::chrono::steady_clock::now();
  const std::string stalled = registry.Render();
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 200ms);
  EXPECT_LT(took, 2s);
  EXPECT_NE(stalled.find("daemon_passes_total 1\n"), std::string::npos) << stalled;
  // The work that ran late fills a scrape nobody reads.
  for (auto& work : late) work();
  EXPECT_NE(registry.Render().find("daemon_passes_total 1\n"), std::string::npos);
}

}  // namespace
}  // namespace cozy::runtime
