// The training text: English from the Debian package `fortunes` (fortune-mod's data files,
// /usr/share/games/fortunes, ~2.6 MB of quotations, jokes and literature in 30+ files, entries
// separated by lines holding "%"), tokenised byte-level (vocabulary 256: every byte is a token,
// nothing to train or store, no unknown tokens; the cost is sequences ~4x longer than with a
// GPT-2 BPE, so a context of 128 covers ~128 characters).
//
// Split: entry k of the corpus (files in name order, entries in file order) goes to validation
// when k % val_every == val_every - 1, else to training; each split is its entries back to back,
// each followed by "%\n" as in the files. Deterministic: the same on every rank and every run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hsdp/status.h"

namespace gpt {

struct Corpus {
  std::vector<uint8_t> train, val;
  size_t train_entries = 0, val_entries = 0;
  int files = 0;
  std::string source;  // the path read
};

constexpr const char* kDefaultCorpus = "/usr/share/games/fortunes";

// The most bytes a corpus may hold (its files together): every rank reads all of it.
constexpr uint64_t kMaxCorpusBytes = uint64_t{1} << 30;

// PATH (through hsdp/files.h): one fortune file (a symbolic link typed as PATH is followed), or a
// directory whose regular files are read in name order; in a directory, *.dat indexes, symbolic
// links (such as the *.u8 aliases; never followed) and subdirectories are skipped, and any other
// entry (a FIFO, a device, a socket) is an error naming it. PATH itself must be a regular file
// or a directory: a FIFO or a device (--data /dev/zero) is refused unread, never a hang. Errors
// name the path: missing (NotFound, saying which package provides it), not a regular file,
// unreadable, over kMaxCorpusBytes in all (checked before each file is read), or too small to
// hold one training and one validation sequence of `context` + 1 bytes.
hsdp::StatusOr<Corpus> loadCorpus(const std::string& path, int context, int val_every = 20);
// The same split of text already in memory (tests).
Corpus splitCorpus(const std::string& text, int val_every = 20);

// Sebastiano Vigna's splitmix64 finaliser: the hash behind the batch offsets, the initial values
// and the sampler (portable: the same numbers on every rank and machine).
uint64_t splitmix64(uint64_t x);

// Sequence `s` of the global batch of training step `step`: T input tokens and their T targets
// (the next bytes), from an offset hashed from (seed, step, s). Every rank computes its own
// slice of sequences from the same function, so no data moves between ranks.
void trainSequence(const Corpus& c, uint64_t seed, int64_t step, int64_t s, int T, int32_t* tokens,
                   int32_t* targets);
// Validation sequence `s` of `count`, at evenly spaced offsets of the validation text.
void valSequence(const Corpus& c, int64_t s, int64_t count, int T, int32_t* tokens,
                 int32_t* targets);

}  // namespace gpt
