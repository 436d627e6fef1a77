// Hostile topology inputs (issue 33): no file given to the topology readers may crash, abort,
// hang or take unbounded memory; each ends in a Status (library) or exit 2 (hsdp-topo) whose
// message names the path or value. Every fixture is made here, in a temporary directory, from
// the recorded machines in tests/topology/fixtures. hsdp-topo runs as a child process with a
// deadline; its exit status, stderr, wall time and peak memory (wait4) are checked.
#include <gtest/gtest.h>
#include <hwloc.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "topology/cluster_topology.h"
#include "topology/node_topology.h"
#include "topology/topology_xml.h"

namespace hsdp {
namespace {

const std::string kDir = HSDP_TOPO_FIXTURES;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string replaced(std::string s, const std::string& from, const std::string& to) {
  size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? s : s.replace(at, from.size(), to);
}

struct TempDir {
  std::string path;
  TempDir() {
    std::string t = ::testing::TempDir() + "hsdp_topo_hostile.XXXXXX";
    path = ::mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string write(const std::string& name, const std::string& content) const {
    std::string p = path + "/" + name;
    std::ofstream(p, std::ios::binary) << content;
    return p;
  }
};

struct TopoRun {
  int rc = -1;
  bool timed_out = false;
  std::string err;
  double seconds = 0;
  long max_rss_kb = 0;
};

// hsdp-topo with `args` (and `env` added), killed after `limit_s` seconds.
TopoRun topo(const TempDir& d, const std::vector<std::string>& args,
             const std::vector<std::string>& env = {}, double limit_s = 30) {
  const std::string err_path = d.path + "/stderr.txt";
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    FILE* e = std::freopen(err_path.c_str(), "w", stderr);
    FILE* o = std::freopen("/dev/null", "w", stdout);
    (void)e;
    (void)o;
    for (const std::string& kv : env) ::putenv(::strdup(kv.c_str()));
    std::vector<char*> argv{const_cast<char*>(HSDP_TOPO_BIN)};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(HSDP_TOPO_BIN, argv.data());
    ::_exit(127);
  }
  TopoRun r;
  int status = 0;
  struct rusage ru {};
  while (true) {
    pid_t w = ::wait4(pid, &status, WNOHANG, &ru);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (w == pid) break;
    if (r.seconds > limit_s) {
      ::kill(pid, SIGKILL);
      ::wait4(pid, &status, 0, &ru);
      r.timed_out = true;
      break;
    }
    ::usleep(10000);
  }
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.max_rss_kb = ru.ru_maxrss;
  r.err = slurp(err_path);
  return r;
}

// Exit 2 within the time limit, stderr naming `path` and containing `text`.
void expectBadInput(const TopoRun& r, const std::string& path, const std::string& text) {
  EXPECT_FALSE(r.timed_out) << path;
  EXPECT_EQ(r.rc, 2) << path << ": " << r.err;
  EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(text), std::string::npos) << "want '" << text << "' in: " << r.err;
  EXPECT_LT(r.max_rss_kb, 1L << 20) << path;  // under 1 GiB
}

std::string hwlocError(const std::string& xml, const std::string& name) {
  auto t = nodeTopologyFromHwlocXml(xml, name);
  EXPECT_FALSE(t.ok()) << name;
  if (t.ok()) return "";
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find(name), std::string::npos) << t.status().message();
  return t.status().message();
}

const char* kHwlocDoctype = "<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">";

// ---- DTDs and entities -------------------------------------------------------------------------

TEST(Hostile, DoctypeSubsetsAndEntitiesAreRefused) {
  const std::string base = slurp(kDir + "/this_machine.xml");
  ASSERT_TRUE(nodeTopologyFromHwlocXml(base, "plain.xml").ok());  // hwloc's own DOCTYPE is fine
  const std::vector<std::string> doctypes = {
      "<!DOCTYPE topology [ ]>",  // segfaulted inside hwloc's libxml2 importer
      "<!DOCTYPE topology SYSTEM \"hwloc2.dtd\" [ ]>",
      "<!DOCTYPE topology [<!ENTITY a \"0x00000003\">]>",
      "<!DOCTYPE topology [<!ENTITY x SYSTEM \"file:///etc/passwd\">]>",
      "<!DOCTYPE topology [<!ENTITY a \"aaaaaaaaaa\"><!ENTITY b \"&a;&a;&a;&a;&a;&a;&a;\">]>",
      "<!DOCTYPE topology [<!ATTLIST object cpuset CDATA \"0x1\">]>",
      "<!DOCTYPE topology PUBLIC \"-//x//y\" \"hwloc2.dtd\">",
      "<!DOCTYPE topology SYSTEM \"http://127.0.0.1:1/hwloc2.dtd\">",
      "<!DOCTYPE svg SYSTEM \"hwloc2.dtd\">",
  };
  TempDir d;
  for (size_t i = 0; i < doctypes.size(); ++i) {
    std::string xml = replaced(base, kHwlocDoctype, doctypes[i]);
    std::string e = hwlocError(xml, "dtd.xml");
    EXPECT_NE(e.find("DOCTYPE"), std::string::npos) << doctypes[i] << ": " << e;
    // NCCL's reader refuses them as well.
    std::string nccl =
        replaced(slurp(kDir + "/dgx_h100.nccl.xml"), "<system", doctypes[i] + "\n<system");
    auto l = gpuLinksFromNcclXml(NodeTopology(), nccl, "dtd.nccl.xml");
    ASSERT_FALSE(l.ok());
    EXPECT_NE(l.status().message().find("DOCTYPE"), std::string::npos) << l.status().message();
  }
  // The program: hwloc's minimal parser (hsdp-topo's default) and its libxml2 plugin.
  std::string path = d.write("subset.xml", replaced(base, kHwlocDoctype, doctypes[0]));
  expectBadInput(topo(d, {"--input", path}), path, "DOCTYPE");
  expectBadInput(topo(d, {"--input", path}, {"HWLOC_LIBXML=1"}), path, "DOCTYPE");
  expectBadInput(topo(d, {}, {"HSDP_TOPO_FILE=" + path}), path, "DOCTYPE");
}

// ---- encodings ---------------------------------------------------------------------------------

TEST(Hostile, BadEncodingAfterAnHwlocXmlIsAnError) {
  const std::vector<std::string> bad = {
      "<?xml version=\"1.0\" encoding=\"ISO-2022-JP\"?>\n<system "
      "version=\"1\">\x1b$B\xff\xff</system>",
      "<?xml version=\"1.0\" encoding=\"UTF-16\"?>\n<system version=\"1\"/>",
      "<?xml version=\"1.0\" encoding=\"x-no-such-encoding\"?>\n<system version=\"1\"/>",
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<system version=\"\xc3\x28\xff\"/>",
      "<?xml version=\"1.0\" encoding=\"EBCDIC-US\"?>\n<system version=\"1\"/>",
  };
  TempDir d;
  xmlGenericErrorFunc before = xmlGenericError;
  for (size_t i = 0; i < bad.size(); ++i) {
    std::string path = d.write("enc" + std::to_string(i) + ".nccl.xml", bad[i]);
    // In this process hwloc uses its libxml2 plugin (HWLOC_LIBXML_IMPORT unset), which it
    // unloads when the topology is destroyed, before the NCCL XML is read (the crash's order).
    TopologySources s;
    s.hwloc_xml = kDir + "/dgx_h100.xml";
    s.nccl_xml = path;
    auto t = discoverNodeTopology(s);
    ASSERT_FALSE(t.ok()) << bad[i];
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status().message();
    EXPECT_EQ(xmlGenericError, before) << "libxml2's generic error handler was left changed";
    for (const std::vector<std::string>& env :
         {std::vector<std::string>{}, std::vector<std::string>{"HWLOC_LIBXML=1"}})
      expectBadInput(topo(d, {"--input", s.hwloc_xml, "--nccl", path}, env), path, "XML");
  }
}

TEST(Hostile, HwlocXmlInOtherEncodingsReadsTheSame) {
  const std::string base = slurp(kDir + "/this_machine.xml");
  auto want = nodeTopologyFromHwlocXml(base, "utf8.xml");
  ASSERT_TRUE(want.ok()) << want.status().toString();
  // UTF-16LE with a byte order mark: the same machine.
  std::string utf8 = replaced(base, "encoding=\"UTF-8\"", "encoding=\"UTF-16\"");
  std::string utf16 = "\xff\xfe";
  for (char c : utf8) utf16 += std::string{c, '\0'};
  auto t = nodeTopologyFromHwlocXml(utf16, "utf16.xml");
  ASSERT_TRUE(t.ok()) << t.status().toString();
  EXPECT_EQ(t->pus, want->pus);
  EXPECT_EQ(t->cores, want->cores);
  EXPECT_EQ(t->host, want->host);
  // Latin-1: the host name arrives as UTF-8.
  std::string latin1 = replaced(replaced(base, "encoding=\"UTF-8\"", "encoding=\"ISO-8859-1\""),
                                "value=\"vm\"", "value=\"caf\xe9\"");
  t = nodeTopologyFromHwlocXml(latin1, "latin1.xml");
  ASSERT_TRUE(t.ok()) << t.status().toString();
  EXPECT_EQ(t->host, "caf\xc3\xa9");
}

// ---- set attributes ----------------------------------------------------------------------------

TEST(Hostile, BitmapGrammarAgreesWithHwloc) {
  // Accepted strings read through hwloc_bitmap_sscanf (the independent reader) to the same
  // emptiness; refused ones are never given to it (some trip its assertions).
  for (const char* good :
       {"0x0", "0x00000001", "0xffffffff,0x00000000", "0xf...f", "0xf...f,0x1", "0xABCDEF01",
        "0x1,0x0,0x0", "0x00000003,,0x0", "0x0,,,0x00000001", "0xf...f,,0x00000001"}) {
    bool empty = false;
    ASSERT_TRUE(topo_xml::isBitmap(good, &empty)) << good;
    hwloc_bitmap_t b = hwloc_bitmap_alloc();
    EXPECT_EQ(hwloc_bitmap_sscanf(b, good), 0) << good;
    EXPECT_EQ(empty, hwloc_bitmap_iszero(b) != 0) << good;
    hwloc_bitmap_free(b);
  }
  std::string many;
  for (size_t i = 0; i <= topo_xml::kMaxSetWords; ++i) many += i ? ",0x1" : "0x1";
  for (const std::string& bad :
       {std::string(""), std::string(",0x00000001"), std::string("0x"), std::string("0x123456789"),
        std::string(",,0x1"), std::string("0x1,"), std::string("0x1,,"), std::string("1"),
        std::string(" 0x1"), std::string("0xf...f,,"), std::string("0x1 ,0x2"), std::string("0xg"),
        std::string("0X1"), std::string("0xf...f,"), std::string("zz"), many}) {
    bool empty = false;
    EXPECT_FALSE(topo_xml::isBitmap(bad, &empty)) << bad;
  }
}

TEST(Hostile, MalformedSetAttributesNameObjectAndAttribute) {
  const std::string base = slurp(kDir + "/this_machine.xml");
  const std::string pu =
      "<object type=\"PU\" os_index=\"0\" cpuset=\"0x00000001\" complete_cpuset=\"0x00000001\" "
      "nodeset=\"0x00000001\" complete_nodeset=\"0x00000001\"";
  ASSERT_NE(base.find(pu), std::string::npos);
  for (const char* attr : {"cpuset", "complete_cpuset", "allowed_cpuset", "online_cpuset",
                           "nodeset", "complete_nodeset", "allowed_nodeset"}) {
    for (const char* value : {",0x00000001", "0x1,0x2,", "0x123456789", ""}) {
      // Replaces the attribute where the PU has it, adds it where it does not.
      std::string a = std::string(" ") + attr + "=\"";
      std::string xml = base;
      size_t at = xml.find(pu);
      size_t pos = xml.find(a, at);
      if (pos != std::string::npos && pos < xml.find('>', at)) {
        size_t end = xml.find('"', pos + a.size());
        xml.replace(pos, end + 1 - pos, a + value + "\"");
      } else {
        xml.insert(at + 17, a + value + "\"");
      }
      std::string e = hwlocError(xml, "sets.xml");
      EXPECT_NE(e.find(std::string("<object type=\"PU\"> attribute ") + attr + "=\"" + value +
                       "\" is not an hwloc bitmap"),
                std::string::npos)
          << e;
    }
  }
  TempDir d;  // the aborting case of the report, through the program
  std::string path = d.write("nodeset.xml", replaced(base, pu,
                                                     replaced(pu, "complete_nodeset=\"0x00000001\"",
                                                              "complete_nodeset=\",0x00000001\"")));
  expectBadInput(topo(d, {"--input", path}), path, "complete_nodeset=\",0x00000001\"");
  expectBadInput(topo(d, {"--input", path}, {"HWLOC_LIBXML=1"}), path, "is not an hwloc bitmap");
}

TEST(Hostile, GarbageOrEmptyCpusetIsNotDroppedSilently) {
  const std::string base = slurp(kDir + "/this_machine.xml");
  const std::string core = "<object type=\"Core\" os_index=\"1\" cpuset=\"0x00000002\"";
  ASSERT_EQ(nodeTopologyFromHwlocXml(base, "ok.xml")->cores, 2);
  std::string e = hwlocError(replaced(base, core, replaced(core, "0x00000002", "zz")), "g.xml");
  EXPECT_NE(e.find("<object type=\"Core\"> attribute cpuset=\"zz\""), std::string::npos) << e;
  e = hwlocError(replaced(base, core, replaced(core, "0x00000002", "")), "e.xml");
  EXPECT_NE(e.find("<object type=\"Core\"> attribute cpuset=\"\""), std::string::npos) << e;
  e = hwlocError(replaced(base, core, replaced(core, "0x00000002", "0x0")), "z.xml");
  EXPECT_NE(e.find("<object type=\"Core\"> (os_index 1) has an empty cpuset"), std::string::npos)
      << e;
  TempDir d;
  std::string path = d.write("core.xml", replaced(base, core, replaced(core, "0x00000002", "zz")));
  expectBadInput(topo(d, {"--input", path}), path, "cpuset=\"zz\"");
}

// ---- object counts -----------------------------------------------------------------------------

// this_machine.xml plus a host bridge with `gpus` NVIDIA GPUs, beside its own.
std::string withGpus(size_t gpus) {
  std::string add =
      "  <object type=\"Bridge\" gp_index=\"900\" bridge_type=\"0-1\" depth=\"0\" "
      "bridge_pci=\"0001:[00-ff]\">\n";
  for (size_t i = 0; i < gpus; ++i) {
    char line[256];
    std::snprintf(line, sizeof(line),
                  "    <object type=\"PCIDev\" gp_index=\"%zu\" pci_busid=\"%04zx:%02zx:%02zx.0\" "
                  "pci_type=\"0302 [10de:2330] [10de:16c1] a1\" pci_link_speed=\"0.0\"/>\n",
                  1000 + i, 1 + (i >> 13), (i >> 5) & 0xff, i & 0x1f);
    add += line;
  }
  const std::string anchor = "<object type=\"Bridge\" gp_index=\"18\"";  // this_machine's
  add += "  </object>\n    " + anchor;
  return replaced(slurp(kDir + "/this_machine.xml"), anchor, add);
}

TEST(Hostile, GpuAndObjectCountsAreBounded) {
  auto at = nodeTopologyFromHwlocXml(withGpus(topo_xml::kMaxGpus), "256.xml");
  ASSERT_TRUE(at.ok()) << at.status().toString();
  EXPECT_EQ(at->gpus.size(), topo_xml::kMaxGpus);
  std::string e = hwlocError(withGpus(topo_xml::kMaxGpus + 1), "257.xml");
  EXPECT_NE(e.find("more than 256 NVIDIA GPUs"), std::string::npos) << e;
  // The report's case: 20,000 GPUs (2.7 MB) grew hsdp-topo to 5.7 GB and aborted after a minute.
  TempDir d;
  std::string big = withGpus(20000);
  EXPECT_GT(big.size(), 2u << 20);
  std::string path = d.write("20000gpus.xml", big);
  TopoRun r = topo(d, {"--input", path}, {}, 20);
  expectBadInput(r, path, "more than 256 NVIDIA GPUs");
  EXPECT_LT(r.seconds, 20);
  // Other objects, and elements of any kind, are bounded before hwloc or a DOM sees them.
  std::string many = "<?xml version=\"1.0\"?>\n<topology version=\"2.0\">";
  for (size_t i = 0; i <= topo_xml::kMaxElements; ++i) many += "<x/>";
  many += "</topology>";
  path = d.write("elements.xml", many);
  expectBadInput(topo(d, {"--input", path}), path, "XML elements, over the limit of 200000");
}

// ---- files that are not files ------------------------------------------------------------------

TEST(Hostile, FifoDeviceDirectoryAndHugeFilesAreRefused) {
  TempDir d;
  const std::string fifo = d.path + "/topo.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string xml = kDir + "/dgx_h100.xml";
  const std::string huge = d.path + "/huge.xml";
  {
    std::ofstream(huge) << "";
    ASSERT_EQ(::truncate(huge.c_str(), 1ll << 30), 0);  // 1 GiB, sparse
  }
  for (const std::string& bad : {fifo, std::string("/dev/zero"), d.path, huge}) {
    const std::string what = bad == huge ? "over the limit" : "";
    expectBadInput(topo(d, {"--input", bad}), bad, what);
    expectBadInput(topo(d, {"--input", xml, "--nvml", bad}), bad, what);
    expectBadInput(topo(d, {"--input", xml, "--nccl", bad}), bad, what);
    expectBadInput(topo(d, {}, {"HSDP_TOPO_FILE=" + bad}), bad, what);
    TopologySources s;
    s.hwloc_xml = bad;
    auto t = discoverNodeTopology(s);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status().toString();
  }
  std::string e = readTopologyFile(huge, "hwloc topology XML").status().message();
  EXPECT_NE(e.find("over the limit of 8388608 bytes"), std::string::npos) << e;
}

TEST(Hostile, DumpNvmlWritesThroughTheFileLayer) {
  TempDir d;
  // hsdp-topo dlopens libnvidia-ml.so.1: the stand-in library under that name.
  std::filesystem::create_symlink(HSDP_FAKE_NVML, d.path + "/libnvidia-ml.so.1");
  const std::string env = "LD_LIBRARY_PATH=" + d.path;
  const std::string out = d.path + "/host.nvml.json";
  TopoRun r = topo(d, {"--dump-nvml", out}, {env});
  ASSERT_EQ(r.rc, 0) << r.err;
  auto ws = nodeTopologyFromHwlocXml(slurp(kDir + "/workstation_4gpu.xml"), "ws.xml");
  ASSERT_TRUE(ws.ok());
  auto links = gpuLinksFromNvmlSnapshot(*ws, slurp(out), out);
  ASSERT_TRUE(links.ok()) << links.status().toString();
  const std::string fifo = d.path + "/out.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expectBadInput(topo(d, {"--dump-nvml", fifo}, {env}), fifo, "");
  const std::string link = d.path + "/link.json";
  std::filesystem::create_symlink(out, link);
  expectBadInput(topo(d, {"--dump-nvml", link}, {env}), link, "");
  expectBadInput(topo(d, {"--dump-nvml", d.path}, {env}), d.path, "");
}

}  // namespace
}  // namespace hsdp
