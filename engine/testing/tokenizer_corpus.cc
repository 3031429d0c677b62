#include "engine/testing/tokenizer_corpus.h"

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace duet::testing {
namespace {

// SplitMix64: tiny, and the same numbers everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t Below(size_t n) { return static_cast<size_t>(Next() % n); }
  int Range(int lo, int hi) { return lo + static_cast<int>(Below(static_cast<size_t>(hi - lo + 1))); }
  bool Percent(int p) { return static_cast<int>(Below(100)) < p; }
  template <size_t N>
  std::string_view Pick(const std::string_view (&pool)[N]) {
    return pool[Below(N)];
  }

 private:
  uint64_t state_;
};

// ---- Word pools (written for this corpus) ---------------------------------

constexpr std::string_view kEnglish[] = {
    "the", "a", "an", "of", "to", "and", "in", "on", "with", "for", "from", "about", "under",
    "over", "between", "after", "before", "while", "because", "although", "river", "kettle",
    "lantern", "harbor", "engine", "garden", "window", "pocket", "ladder", "orchard", "signal",
    "ticket", "blanket", "compiler", "server", "token", "request", "model", "kernel", "queue",
    "weather", "morning", "evening", "quietly", "slowly", "suddenly", "almost", "never",
    "always", "often", "green", "heavy", "narrow", "bright", "crooked", "patient", "curious",
    "ordinary", "strange", "walked", "painted", "counted", "borrowed", "answered", "forgot",
    "carried", "builds", "returns", "measures", "sleeps", "whispers", "travels", "repairs",
    "remembers", "is", "was", "were", "has", "had", "will", "would", "could", "should", "might",
    "she", "he", "they", "we", "you", "it", "someone", "nobody", "everyone", "this", "that",
    "these", "those", "here", "there", "again", "yesterday", "tomorrow", "Monday", "October",
    "Alice", "Bob", "Priya", "Mateo", "Oslo", "Lisbon", "Nairobi", "Toronto", "well-known",
    "half-empty", "up-to-date", "re-entry", "e-mail", "co-op", "naive", "resume", "A.I.", "U.S.",
    "etc.", "e.g.", "i.e.", "Dr.", "Mr.", "Ms.", "St.", "vs.", "OK", "API", "GPU", "HTTP/2",
};

constexpr std::string_view kContractions[] = {
    "don't",  "can't",  "won't",  "isn't",    "aren't",   "wasn't",  "doesn't",   "didn't",
    "it's",   "I'm",    "I'll",   "I'd",      "I've",     "you're",  "you've",    "you'll",
    "they've", "they're", "they'd", "she's",  "he'd",     "we'll",   "we're",     "wouldn't",
    "shouldn't", "couldn't", "let's", "that's", "there's", "who's",  "what's",    "y'all",
    "o'clock", "rock'n'roll", "ma'am", "'twas", "ne'er",  "could've", "might've", "mustn't",
    "Alice's", "the dogs'", "James's", "it'd've", "'em",   "'cause",  "ol'",       "gov't",
};

constexpr std::string_view kFrench[] = {
    "être",  "déjà",     "où",     "garçon", "français", "hôpital", "forêt",    "naïf",
    "Noël",  "cœur",     "œuvre",  "ça",     "élève",    "théâtre", "fenêtre",  "très",
    "à",     "l'été",    "aujourd'hui", "qu'il", "c'est", "n'est", "j'ai",     "s'il",
    "bientôt", "château", "crème", "brûlée", "façade",   "goût",    "maïs",     "ÉCOLE",
    "Ça",    "voilà",    "élan",   "sûr",    "dîner",    "Île-de-France", "Œdipe", "Ægir",
};

constexpr std::string_view kGerman[] = {
    "Straße", "Müller",  "über",    "schön",   "Grüße",   "Fußgänger", "Äpfel",   "Öl",
    "Übung",  "größer",  "Mädchen", "Käse",    "Brötchen", "heißt",    "Weißbier", "GROSS",
    "Donaudampfschifffahrtsgesellschaft", "Kühlschrank", "Bäckerei", "Schlüssel", "fünf",
    "zwölf",  "Tschüss", "Gemütlichkeit", "ẞ",  "Maß",     "Frühstück", "Ärger",   "Glück",
};

constexpr std::string_view kPolish[] = {
    "źdźbło", "żółć",    "gęś",     "łódź",    "Kraków",  "Wrocław",  "świętość", "źle",
    "cześć",  "dziękuję", "przepraszam", "Gdańsk", "Łukasz", "więcej", "może",    "język",
    "Zażółć", "gęślą",   "jaźń",    "Szczebrzeszyn", "chrząszcz", "brzmi", "trzcinie", "ŻUBR",
};

constexpr std::string_view kVietnamese[] = {
    "Việt", "Nam",   "tiếng", "người", "trường", "học",  "nước",  "phở",   "bánh",  "mì",
    "đường", "Hà",   "Nội",   "thành", "phố",    "Hồ",   "Chí",   "Minh",  "cảm",   "ơn",
    "xin",  "chào",  "những", "được",  "không",  "nghĩa", "quốc", "ngữ",   "Đà",    "Nẵng",
    "ưỡn",  "khuỷu", "nghiêng", "quyển", "sách", "ĐẸP",  "rồi",   "mười",  "hai",   "giờ",
};

constexpr std::string_view kCyrillic[] = {
    "привет", "мир",    "сегодня", "хорошая", "погода", "съешь",  "ещё",    "этих",
    "мягких", "французских", "булок", "да",  "выпей",  "же",     "чаю",    "Москва",
    "Ёлка",   "ЖУРНАЛ", "їжак",   "ґанок",   "європейський", "Київ", "щъркел", "Ђорђе",
    "љубав",  "њива",   "объём",  "подъезд", "Санкт-Петербург", "ПРИВЕТ", "Ўзбекистон",
};

constexpr std::string_view kGreek[] = {
    "Καλημέρα", "κόσμε", "ΑΘΗΝΑ", "φιλοσοφία", "ψυχή", "Ωκεανός", "λόγος", "ἀρχή", "ς",
};

constexpr std::string_view kChinese[] = {
    "我们", "今天", "天气", "很好", "学习", "计算机", "语言", "模型", "北京", "上海",
    "朋友", "吃饭", "喝茶", "工作", "时间", "问题", "中文", "繁體字", "電腦", "資料庫",
    "龍",   "鑫",   "𠀋",   "𠮷野家", "的",  "了",   "是",   "在",   "一个", "没有",
    "人工智能", "服务器", "令牌", "编码", "解码", "三千五百", "二〇二四年",
};

constexpr std::string_view kJapanese[] = {
    "こんにちは", "ありがとう", "日本語", "東京", "カタカナ", "ひらがな", "漢字",
    "コンピューター", "ラーメン", "すし", "今日は", "いい天気", "ですね", "勉強",
    "しています", "人々", "ヴァイオリン", "ｶﾀｶﾅ", "ゃゅょっ", "ー", "行きましょう",
    "大丈夫", "お疲れ様です", "トークナイザー", "猫が好き", "ゑゐ",
};

constexpr std::string_view kKorean[] = {
    "안녕하세요", "감사합니다", "한국어", "서울", "컴퓨터", "사랑", "학교", "친구",
    "오늘", "날씨가", "좋네요", "읽고", "있어요", "ㄱㄴㄷ", "괜찮아요", "토크나이저",
    "부산", "똑똑한", "빨리빨리", "뷁",
};

constexpr std::string_view kArabic[] = {
    "مرحبا", "بالعالم", "السلام", "عليكم", "كتاب", "مدرسة", "شكرا", "جزيلا", "اللغة",
    "العربية", "الحاسوب", "مَرْحَبًا", "٠١٢٣٤٥٦٧٨٩", "القاهرة", "فارسی", "سلام", "زبان",
};

constexpr std::string_view kHebrew[] = {
    "שלום", "עולם", "תודה", "רבה", "ספר", "מחשב", "ירושלים", "בוקר", "טוב", "שָׁלוֹם", "אַ",
};

constexpr std::string_view kDevanagari[] = {
    "नमस्ते", "भारत", "हिन्दी", "भाषा", "कंप्यूटर", "धन्यवाद", "विद्यालय", "पुस्तक",
    "मित्र", "क्षत्रिय", "०१२३४५६७८९", "श्री", "ज्ञान", "ॐ", "मराठी",
};

constexpr std::string_view kThai[] = {
    "สวัสดีครับ", "ภาษาไทย", "ขอบคุณ", "กรุงเทพมหานคร",
};

constexpr std::string_view kEmoji[] = {
    "😀", "😂", "🥲", "❤️", "👍", "🙏", "👩‍👩‍👧‍👦", "🧑🏽‍💻", "👨‍🍳", "🏳️‍🌈", "🏴‍☠️",
    "👩🏻‍🤝‍👨🏿", "🇫🇷", "🇯🇵", "🇺🇸", "🇩🇪", "🇮🇳", "🇧🇷", "1️⃣", "#️⃣", "✌️", "☕",
    "🚀", "🎉", "🦙", "🐍", "🤖", "✅", "❌", "⭐", "🔥", "💯", "🏃‍♀️", "🤷🏽‍♂️",
    "🧑‍🚀", "👁️‍🗨️", "🫶🏾", "🧔🏻‍♀️", "🐈‍⬛", "❤️‍🔥",
};

// Emoji that take a skin-tone modifier (U+1F3FB..U+1F3FF).
constexpr std::string_view kToneable[] = {"👍", "👋", "🙏", "✋", "👏", "💪", "🤞", "👶", "🧑", "🙋"};
constexpr std::string_view kSkinTones[] = {"🏻", "🏼", "🏽", "🏾", "🏿"};

constexpr std::string_view kSymbols[] = {
    "©", "®", "™", "°", "±", "×", "÷", "€", "£", "¥", "§", "¶", "•", "…", "—", "–", "→",
    "⇒", "∀", "∑", "√", "∞", "≠", "≤", "½", "¾", "²", "³", "µ", "Ω", "Å", "Ⅻ", "①", "¹⁰",
    "«", "»", "„", "“", "”", "‘", "’", "¿", "¡", "・", "〜", "【", "】", "「", "」",
};

// Whitespace other than ASCII space, tab and line breaks that every tokenizer
// here agrees on (U+0085 and U+FEFF are left out on purpose: JavaScript's \s
// and Unicode's White_Space disagree on them).
constexpr std::string_view kOddSpaces[] = {
    "\u00a0", "\u2003", "\u2009", "\u3000", "\u202f", "\f", "\v",
};

constexpr std::string_view kIdentifiers[] = {
    "count", "total", "buffer", "tokens", "vocab", "merges", "offset", "length", "kv_cache",
    "num_blocks", "request_id", "userName", "HTTPServer", "_private", "__init__", "x", "i",
    "data2", "MAX_LEN", "parse_json", "EncodeBatch", "self", "tmp", "élan", "名前",
};

constexpr std::string_view kTypes[] = {
    "int", "int32_t", "size_t", "double", "std::string", "std::vector<int>", "bool", "auto",
    "const char*", "absl::Status", "uint8_t",
};

// ---- Generators ------------------------------------------------------------

std::string Upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

std::string CapitalizeFirst(std::string s) {
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 'a' + 'A');
  return s;
}

std::string LineBreak(Rng& rng) {
  int r = static_cast<int>(rng.Below(100));
  if (r < 72) return "\n";
  if (r < 84) return "\r\n";
  if (r < 90) return "";
  if (r < 95) return std::string(rng.Range(1, 4), ' ') + "\n";
  return "\n\n";
}

std::string Digits(Rng& rng, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += static_cast<char>('0' + rng.Below(10));
  return s;
}

// Groups a digit string in threes from the right with `sep`.
std::string Grouped(const std::string& digits, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += sep;
    out += digits[i];
  }
  return out;
}

std::string Number(Rng& rng) {
  int len = rng.Range(1, 20);
  std::string d = Digits(rng, len);
  switch (rng.Below(14)) {
    case 0: return d;
    case 1: return Grouped(d, ",");
    case 2: return Grouped(d, ".");
    case 3: return Grouped(d, " ");
    case 4: return Grouped(d, "_");
    case 5: return Grouped(d, "'");
    case 6: return "-" + d + "." + Digits(rng, rng.Range(1, 8));
    case 7: return absl::StrCat(rng.Range(1900, 2099), "-", Digits(rng, 2), "-", Digits(rng, 2), "T",
                                Digits(rng, 2), ":", Digits(rng, 2), ":", Digits(rng, 2), "Z");
    case 8: return "+" + Digits(rng, rng.Range(1, 3)) + " (" + Digits(rng, 3) + ") " + Digits(rng, 3) +
                   "-" + Digits(rng, 4);
    case 9: return "0x" + Upper(d.substr(0, rng.Range(1, 16))) + "ULL";
    case 10: return "$" + Grouped(d, ",") + "." + Digits(rng, 2);
    case 11: return d + "." + Digits(rng, rng.Range(1, 6)) + "e" + (rng.Percent(50) ? "-" : "+") +
                    Digits(rng, 2);
    case 12: return absl::StrCat("v", rng.Range(0, 20), ".", rng.Range(0, 99), ".", d);
    default: return d + "%";
  }
}

// One English sentence, cased one of four ways.
std::string EnglishSentence(Rng& rng) {
  std::string s;
  int words = rng.Range(3, 18);
  for (int i = 0; i < words; ++i) {
    if (i > 0) s += rng.Percent(8) ? ", " : " ";
    int r = static_cast<int>(rng.Below(100));
    if (r < 18) {
      s += rng.Pick(kContractions);
    } else if (r < 21) {
      s += Number(rng);
    } else if (r < 23) {
      s += "\"" + std::string(rng.Pick(kEnglish)) + "\"";
    } else if (r < 24) {
      s += "(" + std::string(rng.Pick(kEnglish)) + ")";
    } else if (r < 25) {
      s += std::string(rng.Pick(kSymbols));
    } else {
      s += rng.Pick(kEnglish);
    }
  }
  constexpr std::string_view kEnds[] = {".", ".", ".", "!", "?", "...", "?!", ":", ";", "…", ".\""};
  s += rng.Pick(kEnds);
  switch (rng.Below(10)) {
    case 0:
    case 1: return Upper(s);  // "I'LL", "DON'T", "THEY'VE"
    case 2: {                 // Title Case
      bool start = true;
      for (char& c : s) {
        if (start && c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
        start = (c == ' ');
      }
      return s;
    }
    default: return CapitalizeFirst(s);
  }
}

std::string Prose(Rng& rng) {
  std::string s;
  int n = rng.Range(1, 5);
  for (int i = 0; i < n; ++i) {
    if (i > 0) s += rng.Percent(15) ? "  " : " ";
    s += EnglishSentence(rng);
  }
  if (rng.Percent(10)) s = "> " + s;  // a quoted reply
  if (rng.Percent(8)) s = "- " + s;   // a list item
  return s + LineBreak(rng);
}

template <size_t N>
std::string WordsFrom(Rng& rng, const std::string_view (&pool)[N], int lo, int hi, std::string_view sep) {
  std::string s;
  int n = rng.Range(lo, hi);
  for (int i = 0; i < n; ++i) {
    if (i > 0) s += sep;
    s += rng.Pick(pool);
  }
  return s;
}

std::string AccentedLatin(Rng& rng) {
  std::string s;
  switch (rng.Below(4)) {
    case 0: s = WordsFrom(rng, kFrench, 3, 14, " ") + (rng.Percent(50) ? " ?" : " !"); break;
    case 1: s = WordsFrom(rng, kGerman, 3, 12, " ") + "."; break;
    case 2: s = WordsFrom(rng, kPolish, 3, 12, " ") + "."; break;
    default: s = WordsFrom(rng, kVietnamese, 4, 16, " ") + "."; break;
  }
  if (rng.Percent(20)) s += " " + Number(rng);
  if (rng.Percent(10)) s += " Cafe\u0301 nai\u0308ve";  // decomposed accents (NFD)
  if (rng.Percent(10)) s = WordsFrom(rng, kGreek, 2, 6, " ") + " " + s;
  return s + LineBreak(rng);
}

std::string Cyrillic(Rng& rng) {
  std::string s = WordsFrom(rng, kCyrillic, 3, 14, " ");
  s += rng.Percent(30) ? "?" : ".";
  if (rng.Percent(25)) s += " — " + Number(rng) + " руб.";
  return s + LineBreak(rng);
}

std::string Cjk(Rng& rng) {
  std::string s;
  switch (rng.Below(3)) {
    case 0: s = WordsFrom(rng, kChinese, 2, 14, rng.Percent(70) ? "" : "，") + "。"; break;
    case 1: s = WordsFrom(rng, kJapanese, 2, 12, rng.Percent(70) ? "" : "、") + "。"; break;
    default: s = WordsFrom(rng, kKorean, 2, 10, " ") + (rng.Percent(50) ? "." : "?"); break;
  }
  if (rng.Percent(20)) s += Number(rng);
  if (rng.Percent(15)) s += "（" + std::string(rng.Pick(kEnglish)) + "）";
  if (rng.Percent(10)) s += "　" + std::string(rng.Pick(kChinese));  // ideographic space
  if (rng.Percent(10)) s += "ＡＢＣ１２３";                              // full-width forms
  return s + LineBreak(rng);
}

std::string RtlAndIndic(Rng& rng) {
  std::string s;
  switch (rng.Below(5)) {
    case 0: s = WordsFrom(rng, kArabic, 2, 10, " ") + (rng.Percent(50) ? "؟" : "، " + Number(rng)); break;
    case 1: s = WordsFrom(rng, kHebrew, 2, 10, " ") + "."; break;
    case 2: s = WordsFrom(rng, kDevanagari, 2, 10, " ") + "।"; break;
    case 3: s = WordsFrom(rng, kThai, 1, 5, ""); break;
    default:  // right-to-left words inside left-to-right text
      s = "The word " + std::string(rng.Pick(kArabic)) + " and " + std::string(rng.Pick(kHebrew)) +
          " (" + std::string(rng.Pick(kDevanagari)) + ") appear here.";
  }
  return s + LineBreak(rng);
}

std::string Flag(Rng& rng) {
  // Two regional indicator symbols, U+1F1E6 + letter.
  std::string s;
  for (int i = 0; i < 2; ++i) {
    uint32_t cp = 0x1F1E6 + static_cast<uint32_t>(rng.Below(26));
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

std::string Emoji(Rng& rng) {
  std::string s;
  int n = rng.Range(1, 8);
  for (int i = 0; i < n; ++i) {
    if (i > 0 && rng.Percent(50)) s += " ";
    switch (rng.Below(5)) {
      case 0: s += std::string(rng.Pick(kToneable)) + std::string(rng.Pick(kSkinTones)); break;
      case 1: s += Flag(rng); break;
      case 2: s += rng.Pick(kEnglish); break;
      default: s += rng.Pick(kEmoji); break;
    }
  }
  if (rng.Percent(40)) s = EnglishSentence(rng) + " " + s;
  return s + LineBreak(rng);
}

std::string NumbersLine(Rng& rng) {
  std::string s;
  int n = rng.Range(1, 8);
  constexpr std::string_view kSeps[] = {" ", ", ", "; ", " | ", "\t", "/", " - ", " = ", ""};
  for (int i = 0; i < n; ++i) {
    if (i > 0) s += rng.Pick(kSeps);
    s += Number(rng);
  }
  if (rng.Percent(20)) s = "Order #" + Digits(rng, rng.Range(1, 20)) + ": " + s;
  if (rng.Percent(10)) s += " ٣٤٥ ३४५ ７８９ ²³ ½";
  return s + LineBreak(rng);
}

// Words separated by every kind of whitespace run, over several lines.
std::string Whitespace(Rng& rng) {
  std::string s;
  int lines = rng.Range(1, 5);
  for (int l = 0; l < lines; ++l) {
    if (rng.Percent(30)) s += std::string(rng.Range(1, 8), rng.Percent(50) ? ' ' : '\t');
    int words = rng.Range(1, 6);
    for (int w = 0; w < words; ++w) {
      if (w > 0) {
        switch (rng.Below(6)) {
          case 0: s += std::string(rng.Range(2, 12), ' '); break;
          case 1: s += std::string(rng.Range(1, 3), '\t'); break;
          case 2: s += " \t "; break;
          case 3: s += rng.Pick(kOddSpaces); break;
          default: s += " "; break;
        }
      }
      switch (rng.Below(4)) {
        case 0: s += Number(rng); break;
        case 1: s += rng.Pick(kFrench); break;
        case 2: s += rng.Pick(kSymbols); break;
        default: s += rng.Pick(kEnglish); break;
      }
    }
    if (rng.Percent(30)) s += std::string(rng.Range(1, 6), ' ');  // trailing spaces
    switch (rng.Below(5)) {
      case 0: s += "\r\n"; break;
      case 1: s += "\n\n"; break;
      case 2: s += "\n" + std::string(rng.Range(1, 4), ' ') + "\n"; break;  // a line of spaces
      case 3: s += "\n\n\n\n"; break;
      default: s += "\n"; break;
    }
  }
  if (rng.Percent(30)) s += std::string(rng.Range(1, 5), ' ');  // ends in whitespace
  return s;
}

std::string Indent(int depth, std::string_view unit) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += unit;
  return s;
}

// Templates: leading '>' marks one indent level; $A/$B are identifiers, $T a
// type, $N a number, $S a short phrase.
constexpr std::string_view kCppLines[] = {
    "// $S",
    "$T $A = $N;",
    "for (size_t $A = 0; $A < $B.size(); ++$A) {",
    ">if ($B[$A] % $N == 0) continue;",
    ">$A += $B[$A] * $N;  // $S",
    "}",
    "if (!$A.ok()) return $A.status();",
    "std::printf(\"%d tokens in %.3f s\\n\", $A, $B);",
    "auto $A = std::make_unique<$T>($N);",
    "while ($A-- > 0) {",
    ">$B.push_back({$N, \"$S\"});",
    "}",
    "template <typename T>",
    "$T $A($T $B) { return $B << $N; }",
    "#include <$A.h>",
    "#define $A($B) (($B) * $N)",
    "/* $S */",
    "switch ($A) {",
    ">case $N: return \"$S\";",
    ">default: break;",
    "}",
    "namespace $A {",
    "}  // namespace $A",
    "std::map<std::string, $T> $A = {{\"$B\", $N}};",
    "$A->$B = $A->$B ? nullptr : &$B;",
    "return $A != $B && $A >= $N || !$B;",
};

constexpr std::string_view kPythonLines[] = {
    "def $A($B, *args, **kwargs):",
    ">\"\"\"$S\"\"\"",
    ">if $B is None:",
    ">>return []",
    ">for $A in range($N):",
    ">>$B.append($A ** 2)  # $S",
    ">return {'$A': $B, \"$B\": $N}",
    "class $A($B):",
    ">def __init__(self, $B=$N):",
    ">>self.$B = $B",
    "import $A",
    "from $A import $B as _$B",
    "$A = [x for x in $B if x % $N == 0]",
    "print(f\"{$A!r}: {$B:>10.3f}\")",
    "with open('$A.txt', encoding='utf-8') as $B:",
    ">lines = $B.read().splitlines()",
    "try:",
    ">$A = int($B)",
    "except ValueError as e:",
    ">raise RuntimeError(\"$S\") from e",
    "@dataclass(frozen=True)",
    "lambda $A, $B: $A if $A > $B else $N",
    "# TODO($A): $S",
};

std::string FillTemplate(Rng& rng, std::string_view line) {
  std::string out;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '$' && i + 1 < line.size()) {
      char k = line[++i];
      if (k == 'A' || k == 'B') {
        out += rng.Pick(kIdentifiers);
      } else if (k == 'T') {
        out += rng.Pick(kTypes);
      } else if (k == 'N') {
        out += rng.Percent(70) ? std::to_string(rng.Range(0, 1000)) : Digits(rng, rng.Range(1, 20));
      } else if (k == 'S') {
        out += rng.Percent(80) ? EnglishSentence(rng) : WordsFrom(rng, kChinese, 1, 4, "");
      } else {
        out += '$';
        out += k;
      }
    } else {
      out += line[i];
    }
  }
  return out;
}

template <size_t N>
std::string CodeFrom(Rng& rng, const std::string_view (&pool)[N]) {
  constexpr std::string_view kUnits[] = {"  ", "    ", "\t", "\t"};
  std::string_view unit = rng.Pick(kUnits);
  std::string_view eol = rng.Percent(10) ? "\r\n" : "\n";
  int base = rng.Range(0, 2);
  std::string s;
  int lines = rng.Range(2, 12);
  for (int l = 0; l < lines; ++l) {
    std::string_view t = rng.Pick(pool);
    int depth = base;
    while (!t.empty() && t[0] == '>') {
      ++depth;
      t.remove_prefix(1);
    }
    s += Indent(depth, unit) + FillTemplate(rng, t);
    if (rng.Percent(5)) s += "   ";  // trailing spaces
    s += eol;
    if (rng.Percent(12)) s += eol;  // blank line
  }
  return s;
}

std::string JsonValue(Rng& rng, int depth, std::string_view unit, bool pretty) {
  int kind = static_cast<int>(rng.Below(depth > 2 ? 5 : 7));
  switch (kind) {
    case 0: return rng.Percent(50) ? Digits(rng, rng.Range(1, 12))
                                   : absl::StrCat(rng.Range(-999, 999), ".", Digits(rng, rng.Range(1, 6)));
    case 1: return rng.Percent(50) ? "true" : (rng.Percent(50) ? "false" : "null");
    case 2: return "\"" + std::string(rng.Pick(kCyrillic)) + " " + std::string(rng.Pick(kEmoji)) + "\"";
    case 3: return "\"" + std::string(rng.Pick(kContractions)) + " \\\"quoted\\\" \\n\\t\\u00e9\"";
    case 4: return "\"" + std::string(rng.Pick(kEnglish)) + "\"";
    default: {
      bool array = kind == 5;
      std::string nl = pretty ? "\n" : "";
      std::string s = array ? "[" : "{";
      int n = rng.Range(0, 4);
      for (int i = 0; i < n; ++i) {
        s += (i > 0 ? "," : "") + nl + (pretty ? Indent(depth + 1, unit) : (i > 0 ? " " : ""));
        if (!array) s += "\"" + std::string(rng.Pick(kIdentifiers)) + "\": ";
        s += JsonValue(rng, depth + 1, unit, pretty);
      }
      if (n > 0) s += nl + (pretty ? Indent(depth, unit) : "");
      return s + (array ? "]" : "}");
    }
  }
}

std::string Code(Rng& rng) {
  switch (rng.Below(3)) {
    case 0: return CodeFrom(rng, kCppLines);
    case 1: return CodeFrom(rng, kPythonLines);
    default: {
      constexpr std::string_view kUnits[] = {"  ", "    ", "\t"};
      bool pretty = rng.Percent(75);
      std::string s = "{";
      std::string_view unit = rng.Pick(kUnits);
      int n = rng.Range(1, 5);
      for (int i = 0; i < n; ++i) {
        s += std::string(i > 0 ? "," : "") + (pretty ? "\n" + std::string(unit) : " ");
        s += "\"" + std::string(rng.Pick(kIdentifiers)) + "\": " + JsonValue(rng, 1, unit, pretty);
      }
      return s + (pretty ? "\n}" : " }") + LineBreak(rng);
    }
  }
}

std::string Mixed(Rng& rng) {
  std::string s;
  int n = rng.Range(2, 5);
  for (int i = 0; i < n; ++i) {
    if (i > 0 && rng.Percent(70)) s += " ";
    switch (rng.Below(9)) {
      case 0: s += EnglishSentence(rng); break;
      case 1: s += rng.Pick(kChinese); break;
      case 2: s += rng.Pick(kEmoji); break;
      case 3: s += Number(rng); break;
      case 4: s += rng.Pick(kArabic); break;
      case 5: s += rng.Pick(kFrench); break;
      case 6: s += rng.Pick(kSymbols); break;
      case 7: s += rng.Pick(kContractions); break;
      default: s += rng.Pick(kKorean); break;
    }
  }
  return s + LineBreak(rng);
}

std::string Record(Rng& rng) {
  int r = static_cast<int>(rng.Below(100));
  if (r < 24) return Prose(rng);
  if (r < 40) return Code(rng);
  if (r < 52) return AccentedLatin(rng);
  if (r < 58) return Cyrillic(rng);
  if (r < 68) return Cjk(rng);
  if (r < 76) return RtlAndIndic(rng);
  if (r < 82) return Emoji(rng);
  if (r < 88) return NumbersLine(rng);
  if (r < 94) return Whitespace(rng);
  return Mixed(rng);
}

absl::Status WriteFile(const std::string& path, const std::string& bytes) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot open ", path, " for writing"));
  if (std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size()) {
    return absl::InternalError(absl::StrCat("short write to ", path));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> TokenizerCorpus(uint64_t seed, size_t min_bytes) {
  Rng rng(seed);
  std::vector<std::string> records;
  size_t bytes = 0;
  while (bytes < min_bytes) {
    std::string r = Record(rng);
    if (r.empty()) continue;
    bytes += r.size();
    records.push_back(std::move(r));
  }
  return records;
}

absl::Status WriteCorpusJsonLines(const std::vector<std::string>& records, const std::string& path) {
  std::string out;
  for (const std::string& r : records) {
    out += nlohmann::json(r).dump();
    out += '\n';
  }
  return WriteFile(path, out);
}

absl::Status WriteCorpusText(const std::vector<std::string>& records, const std::string& path) {
  std::string out;
  for (const std::string& r : records) out += r;
  return WriteFile(path, out);
}

}  // namespace duet::testing
