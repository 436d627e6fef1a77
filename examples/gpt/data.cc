#include "gpt/data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <system_error>

namespace gpt {
namespace {

void copyWindow(const std::vector<uint8_t>& text, size_t off, int T, int32_t* tokens,
                int32_t* targets) {
  for (int i = 0; i < T; ++i) {
    tokens[i] = text[off + i];
    targets[i] = text[off + i + 1];
  }
}

// Appends the entries of one fortune file (separated by lines "%") to the two splits.
void splitInto(const std::string& text, int val_every, size_t* entry, Corpus* c) {
  size_t begin = 0;  // the current entry starts here
  auto flush = [&](size_t end) {
    const std::string_view body(text.data() + begin, end - begin);
    if (body.find_first_not_of(" \t\n") == std::string_view::npos) return;
    const bool val = *entry % val_every == size_t(val_every - 1);
    std::vector<uint8_t>& dst = val ? c->val : c->train;
    ++(val ? c->val_entries : c->train_entries);
    dst.insert(dst.end(), body.begin(), body.end());
    if (body.back() != '\n') dst.push_back('\n');
    dst.push_back('%');
    dst.push_back('\n');
    ++*entry;
  };
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    if (eol - pos == 1 && text[pos] == '%') {  // a separator line
      flush(pos);
      begin = eol + 1;
    }
    pos = eol + 1;
  }
  if (begin < text.size()) flush(text.size());
}

}  // namespace

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

Corpus splitCorpus(const std::string& text, int val_every) {
  Corpus c;
  size_t entry = 0;
  splitInto(text, val_every, &entry, &c);
  c.files = 1;
  return c;
}

hsdp::StatusOr<Corpus> loadCorpus(const std::string& path, int context, int val_every) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    return hsdp::notFound("--data ", path, ": no such file or directory (the default corpus is ",
                          "Debian's package 'fortunes': apt-get install fortunes, or run "
                          "scripts/setup)");
  std::vector<fs::path> files;
  if (fs::is_directory(st)) {
    for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
      if (e.is_symlink() || !e.is_regular_file() || e.path().extension() == ".dat") continue;
      files.push_back(e.path());
    }
    if (ec) return hsdp::invalidArgument("--data ", path, ": cannot list: ", ec.message());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  Corpus c;
  c.source = path;
  size_t entry = 0;
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) return hsdp::invalidArgument("--data ", path, ": cannot read ", f.string());
    std::ostringstream ss;
    ss << in.rdbuf();
    splitInto(ss.str(), val_every, &entry, &c);
    ++c.files;
  }
  const size_t need = static_cast<size_t>(context) + 2;
  if (c.train.size() < need || c.val.size() < need)
    return hsdp::invalidArgument(
        "--data ", path, ": ", c.train.size(), " training and ", c.val.size(),
        " validation bytes in ", c.files,
        " files; each split needs more than --context + 1 = ", context + 1);
  return c;
}

void trainSequence(const Corpus& c, uint64_t seed, int64_t step, int64_t s, int T, int32_t* tokens,
                   int32_t* targets) {
  const size_t span = c.train.size() - static_cast<size_t>(T);  // offsets [0, span)
  const size_t off =
      splitmix64(seed ^ splitmix64(static_cast<uint64_t>(step) ^ splitmix64(s))) % span;
  copyWindow(c.train, off, T, tokens, targets);
}

void valSequence(const Corpus& c, int64_t s, int64_t count, int T, int32_t* tokens,
                 int32_t* targets) {
  const size_t span = c.val.size() - static_cast<size_t>(T);
  const size_t off = static_cast<size_t>((static_cast<double>(s) / count) * span);
  copyWindow(c.val, std::min(off, span - 1), T, tokens, targets);
}

}  // namespace gpt
