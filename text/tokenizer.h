// BPE tokenizers as Hugging Face and GPT-2 define them: text in, token ids
// out, and back.
//
//   ASSIGN_OR_RETURN(auto tok, Tokenizer::Load(model_dir));
//   ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode("Hello, world"));
//
// Sources: a Hugging Face `tokenizer.json` with a BPE model, or GPT-2's own
// file pair (`vocab.json` + `merges.txt`, or the older `encoder.json` +
// `vocab.bpe`). From tokenizer.json: the normalizers NFC, NFKC, NFD, NFKD,
// Prepend and Replace (a literal pattern), alone or in a Sequence; the
// pre-tokenizers ByteLevel, Split (any regex or literal; every behavior) and
// Metaspace (each prepend_scheme, or the older add_prefix_space), alone or
// in a Sequence; the decoders ByteLevel, ByteFallback, Replace, Metaspace,
// Fuse and Strip. A ByteLevel pre-tokenizer makes the model byte-level
// (GPT-2, Llama-3, Qwen); without one it is character-level with byte
// fallback and unk as Hugging Face's BPE applies them (SentencePiece-style:
// Llama-2, Gemma, Mistral). Added tokens that appear literally in the text
// are recognised before pre-tokenization, as Hugging Face does by default
// (longest match first; single_word, lstrip, rstrip and normalized
// honoured). Encode adds nothing (no BOS, no template tokens). Anything else
// a file asks for (other models, normalizers, pre-tokenizers and decoders,
// a decoder step after Fuse other than Strip, BPE dropout) fails to load
// with InvalidArgument rather than tokenizing differently. A Tokenizer is
// immutable after loading and safe to use from many threads.
#ifndef DUET_ENGINE_TOKENIZER_H_
#define DUET_ENGINE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace duet::text {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // PATH is a model directory (its tokenizer.json, else a GPT-2 file pair in
  // it), a tokenizer.json file, or a directory with a GPT-2 file pair.
  // Errors name the file and the field at fault.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromTokenizerJson(std::string_view json_text,
                                                                      const std::string& source);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGpt2Files(const std::string& vocab_path,
                                                                  const std::string& merges_path);

  // InvalidArgument when `text` is not valid UTF-8.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const = 0;
  // The bytes the ids stand for. May end inside a UTF-8 character when the
  // ids do; InvalidArgument for an id outside the vocabulary.
  virtual absl::StatusOr<std::string> DecodeBytes(absl::Span<const int32_t> ids,
                                                  bool skip_special = false) const = 0;
  // The bytes one id stands for inside a text (empty for a special token
  // when skip_special): DecodeBytes is these concatenated, less what the
  // decoder strips from the text's ends (SentencePiece-style decoders drop
  // the space their normalizer put before the text, so a streamed
  // continuation keeps its leading space where the whole text would not).
  virtual absl::StatusOr<std::string_view> TokenBytes(int32_t id, bool skip_special = false) const = 0;
  // DecodeBytes with invalid UTF-8 sequences replaced by U+FFFD, as Hugging
  // Face's decode does.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids, bool skip_special = false) const;

  // Id of a token (in its vocabulary form, or an added token's content), or -1.
  virtual int32_t TokenToId(std::string_view token) const = 0;
  virtual int64_t vocab_size() const = 0;  // Highest id + 1.
  virtual const std::vector<AddedToken>& added_tokens() const = 0;
};

// Streams text for a growing list of ids without ever emitting half a UTF-8
// character: the concatenation of everything Push and Finish return is the
// ids' TokenBytes, sanitized as Decode does: Decode(all ids), but for what a
// decoder strips from the text's ends (see TokenBytes).
//
//   IncrementalDetokenizer d(tok.get());
//   for (int32_t id : ids) out += d.Push(id).value();
//   out += d.Finish();
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer* tokenizer, bool skip_special = false);
  // Text completed by this id (possibly empty).
  absl::StatusOr<std::string> Push(int32_t id);
  // Whatever is still held back (an incomplete character becomes U+FFFD).
  std::string Finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;  // Bytes of an incomplete UTF-8 character.
};

// Replaces each invalid UTF-8 sequence with U+FFFD (the WHATWG / Python
// "replace" rule: one U+FFFD per maximal invalid subpart).
std::string SanitizeUtf8(std::string_view bytes);
// Length of the longest prefix of `bytes` that ends on a character boundary
// and holds only complete characters, treating an invalid sequence as complete.
size_t CompleteUtf8Prefix(std::string_view bytes);
bool IsValidUtf8(std::string_view bytes);

}  // namespace duet::text

#endif  // DUET_ENGINE_TOKENIZER_H_
