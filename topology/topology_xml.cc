// Reading topology XML without trusting it: hsdp's own libxml2 parse (no DTD, no entities, error
// handlers of our own), and the check + re-serialization of an hwloc XML before hwloc sees it.
// Depends only on libxml2 and status.h so that the fuzz target can compile it alone.
#include "topology/topology_xml.h"

#include <libxml/xmlerror.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "hsdp/files.h"

namespace hsdp::topo_xml {
namespace {

#if LIBXML_VERSION >= 21200
using ErrorArg = const xmlError*;
#else
using ErrorArg = xmlErrorPtr;
#endif

// What one parse found; reached through a thread_local pointer (not the parser context's
// _private, which xmlCtxtReadMemory may reset) while parse() runs on this thread.
struct ParseState {
  std::string error;  // libxml2's first error
  int line = 0;
  std::string refused;  // why hsdp stopped the parse (a DOCTYPE, a declaration)
};
thread_local ParseState* t_state = nullptr;

void record(std::string* sink, int* line, ErrorArg e) {
  if (sink == nullptr || e == nullptr || e->level < XML_ERR_ERROR || !sink->empty()) return;
  std::string m = e->message ? e->message : "parse error";
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  *sink = m;
  if (line) *line = e->line;
}

// The handlers ErrorHandlerScope installs: errors raised without a parser context go to `ctx`
// (a std::string, or nowhere); the generic (printf-style) channel prints nothing.
void onGlobalError(void* ctx, ErrorArg e) { record(static_cast<std::string*>(ctx), nullptr, e); }
void quietGeneric(void*, const char*, ...) {}

// The parser context's own structured handler (libxml2 gives it the context's userData, which
// SAX2 needs to stay the context itself, so the state is found through t_state).
void onParserError(void*, ErrorArg e) {
  if (t_state) record(&t_state->error, &t_state->line, e);
}

void refuse(void* ctx, const std::string& why) {
  auto* c = static_cast<xmlParserCtxtPtr>(ctx);
  if (t_state && t_state->refused.empty())
    t_state->refused = strCat("line ", c->input ? c->input->line : 0, ": ", why);
  xmlStopParser(c);
}

const char* str(const xmlChar* s) { return s ? reinterpret_cast<const char*>(s) : ""; }

// <!DOCTYPE name ExternalID SystemID — called before the parser looks for an internal subset,
// so the next input character tells whether one follows.
void onDoctype(void* ctx, const xmlChar* name, const xmlChar* external_id,
               const xmlChar* system_id) {
  auto* c = static_cast<xmlParserCtxtPtr>(ctx);
  const bool subset =
      c->input && c->input->cur && c->input->cur < c->input->end && *c->input->cur == '[';
  const std::string sys = str(system_id);
  if (subset || external_id || std::strcmp(str(name), "topology") != 0 ||
      (sys != "hwloc.dtd" && sys != "hwloc2.dtd"))
    refuse(ctx, strCat("<!DOCTYPE ", shown(str(name)), external_id ? " PUBLIC" : "",
                       system_id ? " SYSTEM \"" + shown(sys) + "\"" : std::string(),
                       subset ? " [...]" : "",
                       "> is refused: topology XML is read without DTDs, internal subsets or "
                       "entity declarations (only hwloc's own <!DOCTYPE topology SYSTEM "
                       "\"hwloc2.dtd\"> is accepted, and ignored)"));
}
void onEntityDecl(void* ctx, const xmlChar* name, int, const xmlChar*, const xmlChar*, xmlChar*) {
  refuse(ctx, strCat("entity declaration '", shown(str(name)), "' is refused"));
}
void onUnparsedEntityDecl(void* ctx, const xmlChar* name, const xmlChar*, const xmlChar*,
                          const xmlChar*) {
  refuse(ctx, strCat("entity declaration '", shown(str(name)), "' is refused"));
}
void onElementDecl(void* ctx, const xmlChar* name, int, xmlElementContentPtr) {
  refuse(ctx, strCat("element declaration '", shown(str(name)), "' is refused"));
}
void onAttributeDecl(void* ctx, const xmlChar* elem, const xmlChar*, int, int, const xmlChar*,
                     xmlEnumerationPtr tree) {
  xmlFreeEnumeration(tree);  // the handler owns it
  refuse(ctx, strCat("attribute declaration of '", shown(str(elem)), "' is refused"));
}
void onNotationDecl(void* ctx, const xmlChar* name, const xmlChar*, const xmlChar*) {
  refuse(ctx, strCat("notation declaration '", shown(str(name)), "' is refused"));
}

// Start tags ('<' not followed by '/', '!' or '?'): an upper bound of the elements a document
// can have, counted before libxml2 builds a tree of them.
size_t startTags(std::string_view xml) {
  size_t n = 0;
  for (size_t i = xml.find('<'); i != std::string_view::npos; i = xml.find('<', i + 1))
    if (i + 1 < xml.size() && xml[i + 1] != '/' && xml[i + 1] != '!' && xml[i + 1] != '?') ++n;
  return n;
}

struct ParserCtxtDeleter {
  void operator()(xmlParserCtxt* c) const { xmlFreeParserCtxt(c); }
};

}  // namespace

std::string shown(std::string_view s, size_t cap) { return files::quote(s, cap); }

ErrorHandlerScope::ErrorHandlerScope(std::string* first_error)
    : generic_(xmlGenericError),
      generic_ctx_(xmlGenericErrorContext),
      structured_(xmlStructuredError),
      structured_ctx_(xmlStructuredErrorContext) {
  xmlSetGenericErrorFunc(nullptr, quietGeneric);
  xmlSetStructuredErrorFunc(first_error, onGlobalError);
}

ErrorHandlerScope::~ErrorHandlerScope() {
  xmlSetGenericErrorFunc(generic_ctx_, generic_);
  xmlSetStructuredErrorFunc(structured_ctx_, structured_);
}

StatusOr<XmlDocPtr> parse(std::string_view xml, const std::string& source, std::string_view what) {
  if (xml.size() > kMaxFileBytes)
    return invalidArgument(source, " is ", xml.size(), " bytes, over the limit of ", kMaxFileBytes,
                           " bytes for a ", what);
  if (size_t tags = startTags(xml); tags > kMaxElements)
    return invalidArgument(source, " has ", tags, " XML elements, over the limit of ", kMaxElements,
                           " for a ", what);
  xmlInitParser();
  std::unique_ptr<xmlParserCtxt, ParserCtxtDeleter> ctxt(xmlNewParserCtxt());
  if (!ctxt || !ctxt->sax) return internalError("libxml2: cannot create a parser context");
  xmlSAXHandler* sax = ctxt->sax;
  sax->serror = onParserError;
  sax->internalSubset = onDoctype;
  sax->entityDecl = onEntityDecl;
  sax->unparsedEntityDecl = onUnparsedEntityDecl;
  sax->elementDecl = onElementDecl;
  sax->attributeDecl = onAttributeDecl;
  sax->notationDecl = onNotationDecl;
  ParseState state;
  XmlDocPtr doc;
  {
    // Errors without a parser context (failed encoding conversions) land in the same place:
    // whichever error came first is the one reported.
    ErrorHandlerScope handlers(&state.error);
    t_state = &state;
    // No XML_PARSE_DTDLOAD / NOENT / DTDATTR / HUGE / XINCLUDE: nothing is fetched, expanded or
    // added; NONET in case anything would still try.
    doc.reset(xmlCtxtReadMemory(ctxt.get(), xml.data(), static_cast<int>(xml.size()),
                                source.c_str(), nullptr, XML_PARSE_NONET));
    t_state = nullptr;
  }
  if (!state.refused.empty()) return invalidArgument(source, ": ", state.refused);
  if (!doc) {
    const std::string why = state.error.empty() ? "parse error" : state.error;
    return invalidArgument(source, " is not well-formed XML (", what, "; ",
                           state.line > 0 ? strCat("line ", state.line, ": ") : "", shown(why, 200),
                           ")");
  }
  if (xmlDocGetRootElement(doc.get()) == nullptr)
    return invalidArgument(source, ": XML without a root element");
  return doc;
}

bool isBitmap(std::string_view v, bool* empty) {
  *empty = true;
  constexpr std::string_view kInfinite = "0xf...f";
  if (v == kInfinite) {
    *empty = false;
    return true;
  }
  const bool infinite = v.substr(0, kInfinite.size() + 1) == "0xf...f,";
  if (infinite) {
    *empty = false;
    v.remove_prefix(kInfinite.size() + 1);
  }
  // Words as hwloc_bitmap_snprintf writes them: "0x" + 1 to 8 hex digits, or nothing for a zero
  // word between two others ("0x00000003,,0x0"). The last word is never empty, nor is the first
  // one without the infinite prefix (hwloc_bitmap_sscanf does not count a comma at the very
  // start and asserts).
  size_t words = 0;
  for (bool first = true;; first = false) {
    if (++words > kMaxSetWords) return false;
    const size_t comma = v.find(',');
    const std::string_view w = v.substr(0, comma);
    if (w.empty()) {
      if ((first && !infinite) || comma == std::string_view::npos) return false;
    } else {
      if (w.size() < 3 || w.size() > 10 || w[0] != '0' || w[1] != 'x') return false;
      for (char c : w.substr(2)) {
        if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
        if (c != '0') *empty = false;
      }
    }
    if (comma == std::string_view::npos) return true;
    v.remove_prefix(comma + 1);
  }
}

namespace {

// The hwloc attributes read with hwloc_bitmap_sscanf.
constexpr const char* kSetAttrs[] = {"cpuset",         "complete_cpuset", "allowed_cpuset",
                                     "online_cpuset",  "nodeset",         "complete_nodeset",
                                     "allowed_nodeset"};
// Objects outside the CPU/memory tree: no cpusets.
constexpr const char* kIoTypes[] = {"Bridge", "PCIDev", "OSDev", "Misc", "HostBridge", "PCIBridge"};
// What hwloc is given: the object tree. Distances, memory attributes, CPU kinds, user data and
// support flags are dropped (hsdp reads none of them, and hwloc trusts their sizes).
constexpr const char* kKept[] = {"object", "info", "page_type"};

bool in(const char* const* b, const char* const* e, std::string_view s) {
  return std::find(b, e, s) != e;
}
template <size_t N>
bool in(const char* const (&a)[N], std::string_view s) {
  return in(a, a + N, s);
}

struct Walk {
  const std::string& source;
  size_t elements = 0, objects = 0, pci = 0, osdev = 0, gpus = 0;
  std::string out;
};

Status overLimit(const Walk& w, xmlNode* n, size_t limit, std::string_view what) {
  return invalidArgument(w.source, ": line ", n->line, ": more than ", limit, " ", what,
                         " (the limit for one host's topology)");
}

// hwloc's minimal parser reads attribute names of [a-z_] and tag names of [a-z0-9_]; every
// attribute hwloc writes is such a name, so another one is not hwloc's and is left out.
bool hwlocName(std::string_view s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; });
}

void appendEscaped(std::string* out, const std::string& v) {
  for (char c : v) {
    switch (c) {
      case '\n':
        *out += "&#10;";
        break;
      case '\r':
        *out += "&#13;";
        break;
      case '\t':
        *out += "&#9;";
        break;
      case '"':
        *out += "&quot;";
        break;
      case '<':
        *out += "&lt;";
        break;
      case '>':
        *out += "&gt;";
        break;
      case '&':
        *out += "&amp;";
        break;
      default:
        *out += c;
    }
  }
}

Status walk(Walk& w, xmlNode* n, int depth) {
  if (depth > kMaxDepth)
    return invalidArgument(w.source, ": line ", n->line, ": elements nested deeper than ",
                           kMaxDepth, " levels");
  if (++w.elements > kMaxElements) return overLimit(w, n, kMaxElements, "XML elements");
  const std::string name = str(n->name);
  std::vector<std::pair<std::string, std::string>> attrs;
  for (xmlAttr* a = n->properties; a; a = a->next) {
    if (a->type != XML_ATTRIBUTE_NODE) continue;
    xmlChar* v = xmlNodeGetContent(reinterpret_cast<xmlNode*>(a));
    attrs.emplace_back(a->ns ? "" : str(a->name), str(v));
    if (v) xmlFree(v);
  }
  auto get = [&](std::string_view key) -> const std::string* {
    for (const auto& [k, v] : attrs)
      if (k == key) return &v;
    return nullptr;
  };
  const std::string* type = get("type");
  const std::string what =
      name == "object" && type ? strCat("<object type=\"", shown(*type), "\">") : "<" + name + ">";
  for (const auto& [k, v] : attrs) {
    bool empty = true;
    if (in(kSetAttrs, k) && !isBitmap(v, &empty))
      return invalidArgument(w.source, ": line ", n->line, ": ", what, " attribute ", k, "=\"",
                             shown(v),
                             "\" is not an hwloc bitmap (comma-separated words 0x + 1 to "
                             "8 hex digits, empty between two others, at most ",
                             kMaxSetWords, ", optionally after 0xf...f,; e.g. 0x000000ff,,0x0)");
  }
  if (name == "object") {
    if (type == nullptr || type->empty())
      return invalidArgument(w.source, ": line ", n->line, ": <object> without a type");
    if (++w.objects > kMaxObjects) return overLimit(w, n, kMaxObjects, "objects");
    if (*type == "PCIDev") {
      if (++w.pci > kMaxPciDevices) return overLimit(w, n, kMaxPciDevices, "PCI devices");
      unsigned cls = 0, vendor = 0, device = 0;
      const std::string* pt = get("pci_type");
      if (pt && std::sscanf(pt->c_str(), "%x [%x:%x]", &cls, &vendor, &device) == 3 &&
          vendor == 0x10de && (cls >> 8) == 0x03 && ++w.gpus > kMaxGpus)
        return overLimit(w, n, kMaxGpus, "NVIDIA GPUs");
    } else if (*type == "OSDev") {
      if (++w.osdev > kMaxOsDevices) return overLimit(w, n, kMaxOsDevices, "OS devices");
    }
    // hwloc 2.9 trusts its XML: a CPU-side object without its cpuset attributes crashes
    // hwloc_topology_load (found by tests/topology/topology_fuzz; `lstopo --input` crashes the
    // same way), and a PU or Core whose cpuset is empty is silently dropped.
    if (!in(kIoTypes, *type)) {
      for (const char* a : {"cpuset", "complete_cpuset", "nodeset", "complete_nodeset"})
        if (get(a) == nullptr)
          return invalidArgument(w.source, ": line ", n->line, ": ", *type, " object without ", a,
                                 " (malformed hwloc v2 topology)");
      // hwloc sets bit os_index of a PU's cpuset and a NUMA node's nodeset: a missing os_index
      // (hwloc's unknown index, 2^32 - 1) or a huge one makes it allocate a bitmap of up to
      // 512 MiB from a few bytes of XML (found by topology_fuzz under -rss_limit_mb=512).
      if (*type == "PU" || *type == "NUMANode") {
        const std::string* os = get("os_index");
        constexpr unsigned long kMaxIndex = kMaxSetWords * 32 - 1;
        char* end = nullptr;
        const unsigned long v =
            os && !os->empty() && std::isdigit(static_cast<unsigned char>((*os)[0]))
                ? std::strtoul(os->c_str(), &end, 10)
                : 0;
        if (os == nullptr || end == nullptr || *end != '\0' || v > kMaxIndex)
          return invalidArgument(w.source, ": line ", n->line, ": ", what, " os_index \"",
                                 os ? shown(*os) : "(missing)", "\" is not an index in [0, ",
                                 kMaxIndex, "] (the limit of a cpuset or nodeset)");
      }
      bool empty = true;
      if ((*type == "PU" || *type == "Core") && isBitmap(*get("cpuset"), &empty) && empty)
        return invalidArgument(w.source, ": line ", n->line, ": ", what, " (os_index ",
                               get("os_index") ? shown(*get("os_index")) : "?",
                               ") has an empty cpuset \"", shown(*get("cpuset")), "\"");
    }
  }
  if (!in(kKept, name)) return okStatus();
  w.out += "<" + name;
  for (const auto& [k, v] : attrs) {
    if (!hwlocName(k)) continue;
    w.out += " " + k + "=\"";
    appendEscaped(&w.out, v);
    w.out += "\"";
  }
  w.out += ">\n";
  // Only objects have children in hwloc's format (info and page_type are leaves).
  for (xmlNode* c = name == "object" ? n->children : nullptr; c; c = c->next)
    if (c->type == XML_ELEMENT_NODE) HSDP_RETURN_IF_ERROR(walk(w, c, depth + 1));
  w.out += "</" + name + ">\n";
  return okStatus();
}

}  // namespace

StatusOr<std::string> canonicalHwlocXml(std::string_view xml, const std::string& source) {
  HSDP_ASSIGN_OR_RETURN(XmlDocPtr doc,
                        parse(xml, source, "malformed or truncated hwloc v2 topology"));
  xmlNode* root = xmlDocGetRootElement(doc.get());
  if (std::strcmp(str(root->name), "system") == 0)
    return invalidArgument(source,
                           " is an NCCL topology XML (root element <system>), not an "
                           "hwloc topology; pass it as HSDP_TOPO_NCCL_FILE / --nccl");
  if (std::strcmp(str(root->name), "topology") != 0)
    return invalidArgument(source, " is not an hwloc topology XML (root element <",
                           shown(str(root->name)), ">, expected <topology>)");
  Walk w{source, 0, 0, 0, 0, 0, {}};
  w.out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<topology";
  xmlChar* version = xmlGetProp(root, reinterpret_cast<const xmlChar*>("version"));
  if (version) {
    std::string v = str(version);
    xmlFree(version);
    // digits "." digits, as hwloc writes it (its minimal parser reads "%u.%u").
    const size_t dot = v.find('.');
    auto digits = [](std::string_view d) {
      return !d.empty() && d.size() <= 4 &&
             std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (dot == std::string::npos || !digits(std::string_view(v).substr(0, dot)) ||
        !digits(std::string_view(v).substr(dot + 1)))
      return invalidArgument(source, ": <topology version=\"", shown(v),
                             "\"> is not a version (expected e.g. 2.0)");
    w.out += " version=\"" + v + "\"";
  }
  w.out += ">\n";
  ++w.elements;
  for (xmlNode* c = root->children; c; c = c->next)
    if (c->type == XML_ELEMENT_NODE) HSDP_RETURN_IF_ERROR(walk(w, c, 1));
  w.out += "</topology>\n";
  return std::move(w.out);
}

}  // namespace hsdp::topo_xml
