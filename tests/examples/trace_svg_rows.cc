// Parses an SVG with libxml2 (the project's XML dependency) and prints one line per timeline row
// (<g class="row" data-rank=R data-lane=L>): "row R L <boxes>". Exit 1 when the file is not
// well-formed XML or has no <svg> root. Used by trace_test.py.
#include <libxml/parser.h>
#include <libxml/tree.h>

#include <cstdio>
#include <cstring>

static int countRects(xmlNode* g) {
  int n = 0;
  for (xmlNode* c = g->children; c; c = c->next)
    if (c->type == XML_ELEMENT_NODE && !xmlStrcmp(c->name, BAD_CAST "rect")) ++n;
  return n;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: svg_rows FILE.svg\n");
    return 2;
  }
  xmlDoc* doc = xmlReadFile(argv[1], nullptr, XML_PARSE_NONET);
  if (doc == nullptr) {
    std::fprintf(stderr, "svg_rows: %s is not well-formed XML\n", argv[1]);
    return 1;
  }
  xmlNode* root = xmlDocGetRootElement(doc);
  if (root == nullptr || xmlStrcmp(root->name, BAD_CAST "svg")) {
    std::fprintf(stderr, "svg_rows: %s has no <svg> root\n", argv[1]);
    xmlFreeDoc(doc);
    return 1;
  }
  for (xmlNode* c = root->children; c; c = c->next) {
    if (c->type != XML_ELEMENT_NODE || xmlStrcmp(c->name, BAD_CAST "g")) continue;
    xmlChar* cls = xmlGetProp(c, BAD_CAST "class");
    if (cls && !xmlStrcmp(cls, BAD_CAST "row")) {
      xmlChar* r = xmlGetProp(c, BAD_CAST "data-rank");
      xmlChar* l = xmlGetProp(c, BAD_CAST "data-lane");
      std::printf("row %s %s %d\n", r ? (const char*)r : "?", l ? (const char*)l : "?",
                  countRects(c));
      xmlFree(r);
      xmlFree(l);
    }
    xmlFree(cls);
  }
  xmlFreeDoc(doc);
  return 0;
}
