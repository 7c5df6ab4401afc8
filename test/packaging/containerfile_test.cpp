// packaging/Containerfile (gpu-agent's image) and packaging/Containerfile.controller
// (gpu-controller's) cannot be built here (no container engine); these checks keep them
// consistent with the .debs and the build: the same Debian release in both stages, the
// project's dependency script, cpack, apt installing the package CPack names.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace cozy {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string Containerfile() { return Read(COZY_SOURCE_DIR "/packaging/Containerfile"); }
std::string ControllerContainerfile() {
  return Read(COZY_SOURCE_DIR "/packaging/Containerfile.controller");
}

// The base images and stage names, in order.
std::vector<std::pair<std::string, std::string>> Stages(const std::string& text) {
  static const std::regex from(R"((^|\n)FROM ([^\s]+)( AS (\w+))?)");
  std::vector<std::pair<std::string, std::string>> stages;
  for (std::sregex_iterator it(text.begin(), text.end(), from), end; it != end; ++it) {
    stages.emplace_back((*it)[2].str(), (*it)[4].str());
  }
  return stages;
}

// A `set(NAME "value")` of the generated CPack configuration.
std::string CpackSetting(const std::string& name) {
  const std::string cpack = Read(COZY_BINARY_DIR "/CPackConfig.cmake");
  std::smatch match;
  EXPECT_TRUE(std::regex_search(cpack, match, std::regex(name + R"re( "([^"]+)")re"))) << name;
  return match.empty() ? "" : match[1].str();
}

TEST(Containerfile, BuildsOnBookwormAndRunsOnBookwormSlim) {
  const std::string text = Containerfile();
  static const std::regex from(R"((^|\n)FROM ([^\s]+)( AS (\w+))?)");
  std::vector<std::string> images;
  std::vector<std::string> stages;
  for (std::sregex_iterator it(text.begin(), text.end(), from), end; it != end; ++it) {
    images.push_back((*it)[2].str());
    stages.push_back((*it)[4].str());
  }
  ASSERT_EQ(images.size(), 2u) << "a build stage and a runtime stage";
  EXPECT_EQ(images[0], "debian:bookworm");
  EXPECT_EQ(stages[0], "build");
  EXPECT_EQ(images[1], "debian:bookworm-slim");
  // The release the dependency script installs from.
  EXPECT_NE(Read(COZY_SOURCE_DIR "/scripts/install-deps.sh").find("bookworm"), std::string::npos);
}

TEST(Containerfile, InstallsTheDebCpackBuildsWithApt) {
  const std::string text = Containerfile();
  const std::string cpack = Read(COZY_BINARY_DIR "/CPackConfig.cmake");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(cpack, match, std::regex(R"re(CPACK_PACKAGE_NAME "([^"]+)")re")));
  const std::string name = match[1].str();
  const std::size_t build = text.find("RUN scripts/install-deps.sh");
  const std::size_t pack = text.find("cpack -G DEB");
  const std::size_t install =
      text.find("apt-get install -y --no-install-recommends /tmp/deb/" + name + "_*.deb");
  ASSERT_NE(build, std::string::npos);
  ASSERT_NE(pack, std::string::npos);
  ASSERT_NE(install, std::string::npos);
  EXPECT_LT(build, pack);
  EXPECT_LT(pack, text.find("FROM debian:bookworm-slim"));
  EXPECT_LT(text.find("FROM debian:bookworm-slim"), install);
  EXPECT_NE(text.find("-DBUILD_TESTING=OFF"), std::string::npos);
  // cpack makes both packages: everything they hold is built first.
  EXPECT_LT(text.find("--target cozy_debs"), pack);
  // The binary where the .deb puts it; the chart passes `run` and its flags as args.
  EXPECT_NE(text.find("ENTRYPOINT [\"/usr/bin/gpu-agent\"]"), std::string::npos);
  EXPECT_NE(text.find("CMD [\"run\"]"), std::string::npos);
}

TEST(ControllerContainerfile, BuildsOnBookwormAndRunsOnBookwormSlim) {
  const auto stages = Stages(ControllerContainerfile());
  ASSERT_EQ(stages.size(), 2u) << "a build stage and a runtime stage";
  EXPECT_EQ(stages[0], (std::pair<std::string, std::string>{"debian:bookworm", "build"}));
  EXPECT_EQ(stages[1].first, "debian:bookworm-slim");
  // The same build stage as the agent's image, so both images come from one package build.
  const auto agent = Stages(Containerfile());
  ASSERT_FALSE(agent.empty());
  EXPECT_EQ(agent[0], stages[0]);
}

TEST(ControllerContainerfile, InstallsTheControllerDebAndRunsItAsNonRoot) {
  const std::string text = ControllerContainerfile();
  const std::string name = CpackSetting("CPACK_DEBIAN_CONTROLLER_PACKAGE_NAME");
  EXPECT_EQ(name, "gpu-controller");
  const std::size_t build = text.find("RUN scripts/install-deps.sh");
  const std::size_t targets = text.find("--target cozy_debs");
  const std::size_t pack = text.find("cpack -G DEB");
  const std::size_t copy = text.find("cp /build/" + name + "_*.deb /out/");
  const std::size_t runtime = text.find("FROM debian:bookworm-slim");
  const std::size_t install =
      text.find("apt-get install -y --no-install-recommends /tmp/deb/" + name + "_*.deb");
  const std::size_t user = text.find("\nUSER 65532:65532\n");
  const std::size_t entrypoint = text.find("\nENTRYPOINT [\"/usr/bin/gpu-controller\"]\n");
  for (const std::size_t position :
       {build, targets, pack, copy, runtime, install, user, entrypoint}) {
    ASSERT_NE(position, std::string::npos) << text;
  }
  EXPECT_LT(build, targets);
  EXPECT_LT(targets, pack);
  EXPECT_LT(pack, copy);
  EXPECT_LT(copy, runtime);
  EXPECT_LT(runtime, install);
  EXPECT_LT(install, user);  // apt runs as root; the image's process does not
  EXPECT_LT(user, entrypoint);
  EXPECT_NE(text.find("-DBUILD_TESTING=OFF"), std::string::npos);
  EXPECT_NE(text.find("gpu-controller --version"), std::string::npos);
  EXPECT_NE(text.find("CMD [\"run\"]"), std::string::npos);
}

TEST(ControllerContainerfile, TheChartRunsTheImageItDocumentsAsTheSameUser) {
  const std::string text = ControllerContainerfile();
  const std::string values = Read(COZY_SOURCE_DIR "/charts/gpu/values.yaml");
  const std::string image = "ghcr.io/cozystack/cozy-gpu/gpu-controller";
  EXPECT_NE(values.find("repository: " + image + "\n"), std::string::npos);
  EXPECT_NE(text.find("-t " + image + ":" COZY_VERSION), std::string::npos);
  const std::string deployment =
      Read(COZY_SOURCE_DIR "/charts/gpu/templates/controller-deployment.yaml");
  EXPECT_NE(deployment.find("runAsUser: 65532"), std::string::npos);
  EXPECT_NE(deployment.find("runAsGroup: 65532"), std::string::npos);
}

}  // namespace
}  // namespace cozy
