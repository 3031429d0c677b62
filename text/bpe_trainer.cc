#include "text/bpe_trainer.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <queue>
#include <system_error>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace duet::text {
namespace {

using Json = nlohmann::ordered_json;

// ---------------------------------------------------------------------------
// Pre-tokenization.

bool IsSpace(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' ||
         c == '\r';
}
bool IsDigit(unsigned char c) { return c >= '0' && c <= '9'; }
bool IsLetter(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}
bool IsOther(unsigned char c) {
  return !IsSpace(c) && !IsDigit(c) && !IsLetter(c);
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) at text[i], or 0.
size_t ContractionLength(std::string_view text, size_t i) {
  if (text[i] != '\'') return 0;
  for (std::string_view c : {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"}) {
    if (text.substr(i, c.size()) == c) return c.size();
  }
  return 0;
}

// ---------------------------------------------------------------------------
// Training.

uint64_t PairKey(int left, int right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
}
int PairLeft(uint64_t key) { return static_cast<int>(key >> 32); }
int PairRight(uint64_t key) { return static_cast<int>(key & 0xFFFFFFFFu); }

struct HeapEntry {
  int64_t count;
  uint64_t pair;
};

absl::Status ValidateSpecials(const std::vector<std::string>& specials) {
  absl::flat_hash_set<std::string> seen;
  for (const std::string& s : specials) {
    if (s.empty()) return absl::InvalidArgumentError("empty special token");
    if (!seen.insert(s).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("special token repeated: ", s));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Writing.

struct FormatInfo {
  const char* chat_template;
  const char* bos;  // nullptr: none.
  const char* eos;
  const char* pad;  // nullptr: none.
  bool add_bos;
  int model_max_length;
};

FormatInfo InfoFor(ChatFormat format) {
  switch (format) {
    case ChatFormat::kLlama3:
      return {kLlama3ChatTemplate, "<|begin_of_text|>", "<|eot_id|>", nullptr,
              true, 8192};
    case ChatFormat::kChatML:
      return {kChatMLChatTemplate, nullptr, "<|im_end|>", "<|endoftext|>",
              false, 32768};
  }
  return {};
}

Json AddedToken(int id, const std::string& content, bool with_id) {
  Json t = Json::object();
  if (with_id) t["id"] = id;
  t["content"] = content;
  t["single_word"] = false;
  t["lstrip"] = false;
  t["rstrip"] = false;
  t["normalized"] = false;
  t["special"] = true;
  return t;
}

Json TokenOrNull(const char* token) {
  return token == nullptr ? Json(nullptr) : Json(token);
}

Json TokenizerJson(const BpeVocab& vocab) {
  const int num_bpe = static_cast<int>(vocab.tokens.size());
  Json added = Json::array();
  for (size_t i = 0; i < vocab.special_tokens.size(); ++i) {
    added.push_back(AddedToken(num_bpe + static_cast<int>(i),
                               vocab.special_tokens[i], /*with_id=*/true));
  }

  Json split = Json::object();
  split["type"] = "Split";
  split["pattern"] = Json::object({{"Regex", kGpt2SplitRegex}});
  split["behavior"] = "Isolated";
  split["invert"] = false;
  Json byte_level = Json::object();
  byte_level["type"] = "ByteLevel";
  byte_level["add_prefix_space"] = false;
  byte_level["trim_offsets"] = true;
  byte_level["use_regex"] = false;
  Json pre = Json::object();
  pre["type"] = "Sequence";
  pre["pretokenizers"] = Json::array({split, byte_level});

  Json decoder = Json::object();
  decoder["type"] = "ByteLevel";
  decoder["add_prefix_space"] = true;
  decoder["trim_offsets"] = true;
  decoder["use_regex"] = true;

  // ordered_map::operator[] searches linearly for the key; tokens are unique
  // (checked by the caller), so append to the underlying vector instead of
  // paying O(n^2) for a large vocab.
  Json vocab_map = Json::object();
  auto& entries = vocab_map.get_ref<Json::object_t&>();
  entries.reserve(vocab.tokens.size());
  for (int id = 0; id < num_bpe; ++id) {
    entries.push_back({vocab.tokens[id], Json(id)});
  }
  Json merges = Json::array();
  for (const auto& [left, right] : vocab.merges) {
    merges.push_back(Json::array({left, right}));
  }
  Json model = Json::object();
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = nullptr;
  model["continuing_subword_prefix"] = nullptr;
  model["end_of_word_suffix"] = nullptr;
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  model["ignore_merges"] = false;
  model["vocab"] = std::move(vocab_map);
  model["merges"] = std::move(merges);

  Json doc = Json::object();
  doc["version"] = "1.0";
  doc["truncation"] = nullptr;
  doc["padding"] = nullptr;
  doc["added_tokens"] = std::move(added);
  doc["normalizer"] = nullptr;
  doc["pre_tokenizer"] = std::move(pre);
  doc["post_processor"] = nullptr;
  doc["decoder"] = std::move(decoder);
  doc["model"] = std::move(model);
  return doc;
}

Json TokenizerConfigJson(const BpeVocab& vocab, const FormatInfo& info) {
  const int num_bpe = static_cast<int>(vocab.tokens.size());
  Json decoder = Json::object();
  for (size_t i = 0; i < vocab.special_tokens.size(); ++i) {
    const int id = num_bpe + static_cast<int>(i);
    decoder[std::to_string(id)] =
        AddedToken(id, vocab.special_tokens[i], /*with_id=*/false);
  }
  Json config = Json::object();
  config["add_bos_token"] = info.add_bos;
  config["add_eos_token"] = false;
  config["add_prefix_space"] = false;
  config["added_tokens_decoder"] = std::move(decoder);
  config["bos_token"] = TokenOrNull(info.bos);
  config["chat_template"] = info.chat_template;
  config["clean_up_tokenization_spaces"] = false;
  config["eos_token"] = info.eos;
  config["model_input_names"] = Json::array({"input_ids", "attention_mask"});
  config["model_max_length"] = info.model_max_length;
  config["pad_token"] = TokenOrNull(info.pad);
  config["tokenizer_class"] = "PreTrainedTokenizerFast";
  config["unk_token"] = nullptr;
  return config;
}

Json SpecialTokensMapJson(const FormatInfo& info) {
  Json map = Json::object();
  if (info.bos != nullptr) map["bos_token"] = info.bos;
  map["eos_token"] = info.eos;
  if (info.pad != nullptr) map["pad_token"] = info.pad;
  return map;
}

absl::Status WriteJson(const std::filesystem::path& path, const Json& json) {
  std::string text;
  try {
    text = json.dump(2);
  } catch (const nlohmann::json::exception& e) {
    // Only invalid UTF-8 in a special token can get here.
    return absl::InvalidArgumentError(
        absl::StrCat("cannot serialize ", path.string(), ": ", e.what()));
  }
  text.push_back('\n');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return absl::InternalError(
        absl::StrCat("cannot open ", path.string(), " for writing"));
  }
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) {
    return absl::InternalError(absl::StrCat("error writing ", path.string()));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string_view> SplitGpt2Words(std::string_view text) {
  std::vector<std::string_view> words;
  const size_t n = text.size();
  auto at = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  size_t i = 0;
  while (i < n) {
    size_t end;
    if (size_t len = ContractionLength(text, i); len > 0) {
      end = i + len;
    } else {
      // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": the class of the first
      // byte after an optional space decides which one matches.
      const size_t k = (at(i) == ' ' && i + 1 < n) ? i + 1 : i;
      bool (*cls)(unsigned char) = nullptr;
      if (IsLetter(at(k))) {
        cls = IsLetter;
      } else if (IsDigit(at(k))) {
        cls = IsDigit;
      } else if (IsOther(at(k))) {
        cls = IsOther;
      }
      if (cls != nullptr) {
        end = k;
        while (end < n && cls(at(end))) ++end;
      } else {
        // "\s+(?!\S)|\s+": a whitespace run leaves its last byte to the next
        // word, unless the run ends the text or is a single byte.
        size_t j = i;
        while (j < n && IsSpace(at(j))) ++j;
        end = (j == n || j - i == 1) ? j : j - 1;
      }
    }
    words.push_back(text.substr(i, end - i));
    i = end;
  }
  return words;
}

absl::StatusOr<BpeVocab> TrainByteLevelBpe(std::string_view corpus,
                                           const BpeTrainerOptions& options) {
  RETURN_IF_ERROR(ValidateSpecials(options.special_tokens));
  const size_t num_special = options.special_tokens.size();
  if (options.vocab_size < 0 ||
      static_cast<size_t>(options.vocab_size) < 256 + num_special) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab_size ", options.vocab_size, " is below 256 byte tokens + ",
        num_special, " special tokens"));
  }
  const size_t max_tokens = options.vocab_size - num_special;

  // Distinct words in sorted order, so the run does not depend on hashing.
  std::map<std::string_view, int64_t> word_counts;
  for (std::string_view w : SplitGpt2Words(corpus)) ++word_counts[w];
  std::vector<std::vector<int>> words;
  std::vector<int64_t> freqs;
  words.reserve(word_counts.size());
  for (const auto& [w, f] : word_counts) {
    words.emplace_back(w.begin(), w.end());
    for (int& b : words.back()) b = static_cast<unsigned char>(b);
    freqs.push_back(f);
  }

  // Raw bytes of every token; ids 0..255 are the bytes themselves.
  std::vector<std::string> raw;
  absl::flat_hash_map<std::string, int> id_of;
  for (int b = 0; b < 256; ++b) {
    raw.emplace_back(1, static_cast<char>(b));
    id_of[raw.back()] = b;
  }

  absl::flat_hash_map<uint64_t, int64_t> pair_count;
  // Words that may contain the pair; entries go stale after a merge and are
  // skipped when the word is rescanned.
  absl::flat_hash_map<uint64_t, std::vector<int>> pair_words;
  for (size_t w = 0; w < words.size(); ++w) {
    const auto& s = words[w];
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t key = PairKey(s[i], s[i + 1]);
      pair_count[key] += freqs[w];
      auto& list = pair_words[key];
      if (list.empty() || list.back() != static_cast<int>(w)) {
        list.push_back(static_cast<int>(w));
      }
    }
  }

  // Max-heap on count, then on the smallest (left, right) raw bytes. Counts
  // in the heap may be stale: a popped entry is checked against pair_count.
  auto lower_priority = [&raw](const HeapEntry& a, const HeapEntry& b) {
    if (a.count != b.count) return a.count < b.count;
    const std::string& al = raw[PairLeft(a.pair)];
    const std::string& bl = raw[PairLeft(b.pair)];
    if (al != bl) return al > bl;
    return raw[PairRight(a.pair)] > raw[PairRight(b.pair)];
  };
  std::priority_queue<HeapEntry, std::vector<HeapEntry>,
                      decltype(lower_priority)>
      heap(lower_priority);
  for (const auto& [key, count] : pair_count) heap.push({count, key});

  BpeVocab vocab;
  std::vector<std::pair<int, int>> merges;
  while (raw.size() < max_tokens && !heap.empty()) {
    const HeapEntry top = heap.top();
    heap.pop();
    auto count_it = pair_count.find(top.pair);
    const int64_t actual = count_it == pair_count.end() ? 0 : count_it->second;
    if (actual != top.count) {
      if (actual > 0) heap.push({actual, top.pair});
      continue;
    }
    if (actual < 2) break;

    const int left = PairLeft(top.pair);
    const int right = PairRight(top.pair);
    std::string merged = raw[left] + raw[right];
    int new_id;
    if (auto it = id_of.find(merged); it != id_of.end()) {
      new_id = it->second;
    } else {
      new_id = static_cast<int>(raw.size());
      id_of.emplace(merged, new_id);
      raw.push_back(std::move(merged));
    }
    merges.emplace_back(left, right);

    std::vector<int> affected = std::move(pair_words[top.pair]);
    pair_words.erase(top.pair);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()),
                   affected.end());
    std::vector<uint64_t> grown;  // Pairs with new_id: counts went up.
    for (int w : affected) {
      std::vector<int>& s = words[w];
      const int64_t f = freqs[w];
      bool found = false;
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        if (s[i] == left && s[i + 1] == right) found = true;
      }
      if (!found) continue;
      // Words are short: retract all of the word's pairs, merge, add back.
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        auto it = pair_count.find(PairKey(s[i], s[i + 1]));
        if ((it->second -= f) == 0) pair_count.erase(it);
      }
      std::vector<int> out;
      out.reserve(s.size());
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
          out.push_back(new_id);
          i += 2;
        } else {
          out.push_back(s[i]);
          i += 1;
        }
      }
      s = std::move(out);
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        const uint64_t key = PairKey(s[i], s[i + 1]);
        pair_count[key] += f;
        if (s[i] == new_id || s[i + 1] == new_id) {
          pair_words[key].push_back(w);
          grown.push_back(key);
        }
      }
    }
    std::sort(grown.begin(), grown.end());
    grown.erase(std::unique(grown.begin(), grown.end()), grown.end());
    for (uint64_t key : grown) {
      auto it = pair_count.find(key);
      if (it != pair_count.end()) heap.push({it->second, key});
    }
  }

  vocab.tokens.reserve(raw.size());
  for (const std::string& t : raw) vocab.tokens.push_back(ByteLevelEncode(t));
  vocab.merges.reserve(merges.size());
  for (const auto& [l, r] : merges) {
    vocab.merges.emplace_back(vocab.tokens[l], vocab.tokens[r]);
  }
  absl::flat_hash_set<std::string_view> token_set(vocab.tokens.begin(),
                                                  vocab.tokens.end());
  for (const std::string& s : options.special_tokens) {
    if (token_set.contains(s)) {
      return absl::InvalidArgumentError(
          absl::StrCat("special token ", s, " is also a learned BPE token"));
    }
  }
  vocab.special_tokens = options.special_tokens;
  return vocab;
}

absl::Status WriteTokenizerFiles(const std::string& dir, const BpeVocab& vocab,
                                 ChatFormat format) {
  absl::flat_hash_set<std::string_view> seen;
  for (const std::string& t : vocab.tokens) {
    if (!seen.insert(t).second) {
      return absl::InvalidArgumentError(absl::StrCat("token repeated: ", t));
    }
  }
  for (const std::string& t : vocab.special_tokens) {
    if (t.empty() || !seen.insert(t).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("special token empty or repeated: '", t, "'"));
    }
  }
  for (const std::string& needed : SpecialTokensFor(format)) {
    if (std::find(vocab.special_tokens.begin(), vocab.special_tokens.end(),
                  needed) == vocab.special_tokens.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "vocab lacks special token ", needed, " that its chat format needs"));
    }
  }

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create directory ", dir, ": ", ec.message()));
  }
  const std::filesystem::path base(dir);
  const FormatInfo info = InfoFor(format);
  RETURN_IF_ERROR(WriteJson(base / "tokenizer.json", TokenizerJson(vocab)));
  RETURN_IF_ERROR(WriteJson(base / "tokenizer_config.json",
                            TokenizerConfigJson(vocab, info)));
  return WriteJson(base / "special_tokens_map.json", SpecialTokensMapJson(info));
}

}  // namespace duet::text
