// packaging/Containerfile cannot be built here (no container engine); these checks keep it
// consistent with the .deb and the build: the same Debian release in both stages, the
// project's dependency script, cpack, apt installing the package CPack names.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
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
  // The binary where the .deb puts it; the chart passes `run` and its flags as args.
  EXPECT_NE(text.find("ENTRYPOINT [\"/usr/bin/gpu-agent\"]"), std::string::npos);
  EXPECT_NE(text.find("CMD [\"run\"]"), std::string::npos);
}

}  // namespace
}  // namespace cozy
