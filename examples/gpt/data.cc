#include "gpt/data.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <string_view>

#include "hsdp/files.h"

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

namespace {

bool endsWith(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// One regular file of a corpus directory, opened without following a link; its bytes count
// against what is left of kMaxCorpusBytes.
hsdp::StatusOr<std::string> readEntry(const hsdp::files::Dir& dir, const std::string& name,
                                      const std::string& path, uint64_t* total) {
  HSDP_ASSIGN_OR_RETURN(hsdp::files::File f, hsdp::files::File::openReadAt(dir, name));
  HSDP_ASSIGN_OR_RETURN(uint64_t n, f.size());
  if (n > kMaxCorpusBytes - *total)
    return hsdp::invalidArgument("--data ", hsdp::files::quote(path), ": the corpus is over the ",
                                 "limit of ", kMaxCorpusBytes, " bytes (1 GiB) with '",
                                 hsdp::files::quote(f.path()), "' (", n, " bytes, after ", *total,
                                 " bytes of the files before it)");
  *total += n;
  std::string text(n, '\0');
  HSDP_RETURN_IF_ERROR(f.preadAll(text.data(), n, 0));
  return text;
}

}  // namespace

hsdp::StatusOr<Corpus> loadCorpus(const std::string& path, int context, int val_every) {
  namespace files = hsdp::files;
  // What the path names, a final symbolic link followed (the user typed it, as a shell would).
  struct stat st;
  if (path.empty() || ::stat(path.c_str(), &st) != 0) {
    const int err = path.empty() ? ENOENT : errno;
    if (err == ENOENT)
      return hsdp::notFound("--data ", files::quote(path), ": no such file or directory (the ",
                            "default corpus is Debian's package 'fortunes': apt-get install ",
                            "fortunes, or run scripts/setup)");
    return files::errnoStatus("--data", path, err);
  }
  Corpus c;
  c.source = path;
  size_t entry = 0;
  if (!S_ISDIR(st.st_mode)) {  // one file: a regular one (a FIFO or device is refused, unread)
    HSDP_ASSIGN_OR_RETURN(std::string text, files::readBounded(path, kMaxCorpusBytes, "--data"));
    splitInto(text, val_every, &entry, &c);
    c.files = 1;
  } else {
    HSDP_ASSIGN_OR_RETURN(files::Dir dir, files::Dir::open(path));
    HSDP_ASSIGN_OR_RETURN(std::vector<files::Dir::Entry> entries, dir.list());  // name order
    uint64_t total = 0;
    for (const files::Dir::Entry& e : entries) {
      // Skipped: the *.dat indexes, symbolic links (fortunes' *.u8 aliases; never followed out
      // of the directory), subdirectories (not descended).
      if (endsWith(e.name, ".dat") || e.kind == files::Kind::kSymlink ||
          e.kind == files::Kind::kDirectory)
        continue;
      if (e.kind != files::Kind::kRegular)
        return hsdp::invalidArgument("--data ", files::quote(path), ": '",
                                     files::quote(dir.join(e.name)), "' is ",
                                     files::kindName(e.kind),
                                     ", not a regular file (a corpus directory holds fortune "
                                     "files, *.dat indexes and symbolic links only)");
      HSDP_ASSIGN_OR_RETURN(std::string text, readEntry(dir, e.name, path, &total));
      splitInto(text, val_every, &entry, &c);
      ++c.files;
    }
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
