// Private to topology/: how hsdp reads topology XML (hwloc's and NCCL's) without trusting it.
//
// - Every document is parsed by hsdp's own libxml2 parser context (no network, no DTD loading,
//   no entity substitution, no default attributes), with error handlers of our own; a DOCTYPE is
//   refused unless it is hwloc's plain `<!DOCTYPE topology SYSTEM "hwloc2.dtd">` (no internal
//   subset, not even `[ ]`), and so is every declaration (entities, elements, attributes).
// - An hwloc XML is checked (limits, set-attribute grammar, the attributes hwloc 2.9 needs) and
//   handed to hwloc re-serialized: only the object tree (topology, object, info, page_type) in
//   the plain form hwloc itself writes. See docs/topology.md, "Limits on topology input".
#pragma once

#include <libxml/parser.h>
#include <libxml/tree.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "hsdp/status.h"

namespace hsdp::topo_xml {

// Limits (stated in docs/topology.md). A real host is far below every one of them: a 2-socket
// DGX H100 is 73 KB, 401 objects, 8 GPUs, nesting depth 12.
constexpr uint64_t kMaxFileBytes = 8ull << 20;  // each topology input file (XML or JSON)
constexpr size_t kMaxElements = 200000;         // XML start tags in one document
constexpr int kMaxDepth = 64;                   // XML element nesting
constexpr size_t kMaxObjects = 65536;           // hwloc <object> elements
constexpr size_t kMaxPciDevices = 4096;         // hwloc PCIDev objects
constexpr size_t kMaxOsDevices = 4096;          // hwloc OSDev objects
constexpr size_t kMaxGpus = 256;                // NVIDIA GPUs of one host (every reader)
constexpr size_t kMaxSetWords = 2048;           // 32-bit words of one cpuset/nodeset (65536 bits)

struct XmlDocDeleter {
  void operator()(xmlDoc* d) const { xmlFreeDoc(d); }
};
using XmlDocPtr = std::unique_ptr<xmlDoc, XmlDocDeleter>;

// While alive, libxml2's process/thread-wide error handlers (generic and structured) are ours,
// a function of this library that is never unloaded; on destruction the previous ones are
// restored. Used around our own parses (libxml2 2.9 reports some errors, e.g. failed encoding
// conversions, with no parser context, straight to the global handler, which hwloc's XML
// plugin may have pointed into itself and then been unloaded) and around hwloc's XML loads
// (hwloc's plugin replaces the generic handler once, and hwloc unloads the plugin when its last
// topology is destroyed: a handler left behind would dangle).
class ErrorHandlerScope {
 public:
  explicit ErrorHandlerScope(std::string* first_error = nullptr);
  ~ErrorHandlerScope();
  ErrorHandlerScope(const ErrorHandlerScope&) = delete;
  ErrorHandlerScope& operator=(const ErrorHandlerScope&) = delete;

 private:
  xmlGenericErrorFunc generic_;
  void* generic_ctx_;
  xmlStructuredErrorFunc structured_;
  void* structured_ctx_;
};

// Parses `xml` as described above. `what` names the kind of document in errors ("hwloc
// topology XML"); errors name `source` and, where libxml2 knows it, the line.
StatusOr<XmlDocPtr> parse(std::string_view xml, const std::string& source, std::string_view what);

// Whether `value` is an hwloc bitmap string as hwloc_bitmap_snprintf writes it (and
// hwloc_bitmap_sscanf reads it without tripping its assertions): "0xf...f" (infinite), or an
// optional "0xf...f," prefix followed by comma-separated words, each "0x" + 1 to 8 hex digits or
// empty (a zero word) between two others, at most kMaxSetWords of them; the last word, and the
// first one without the prefix, not empty. `*empty` tells whether no bit is set.
bool isBitmap(std::string_view value, bool* empty);

// Checks an hwloc XML document and returns the object tree re-serialized for hwloc (see above).
// Errors name `source`, the line, the object and the attribute.
StatusOr<std::string> canonicalHwlocXml(std::string_view xml, const std::string& source);

// `s` for a message: files::quote (at most `cap` bytes, control bytes and bytes that are not
// UTF-8 escaped).
std::string shown(std::string_view s, size_t cap = 80);

}  // namespace hsdp::topo_xml
