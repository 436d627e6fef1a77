// A small XML well-formedness check for the SVG charts: one root element, every tag closed in
// order, attributes quoted, no stray '<' or '&' in text. Returns "" or what is wrong and where.
#pragma once

#include <string>
#include <string_view>

namespace hsdp::test {

std::string checkWellFormedXml(std::string_view doc);
// The number of elements named `name` (after a successful check).
int countElements(std::string_view doc, std::string_view name);

}  // namespace hsdp::test
