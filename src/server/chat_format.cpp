#include "server/chat_format.h"

namespace tetra::server {

ChatFormat chat_format_for(Arch arch) {
  switch (arch) {
    case Arch::GlmMoeDsa:
    case Arch::Glm4Moe: return ChatFormat::Glm;
    case Arch::Qwen3Moe: return ChatFormat::Qwen;
    case Arch::DeepseekV3: return ChatFormat::DeepSeek;
  }
  return ChatFormat::Qwen;
}

std::string_view chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::Glm: return "glm";
    case ChatFormat::Qwen: return "qwen";
    case ChatFormat::DeepSeek: return "deepseek";
  }
  return "?";
}

std::string render_chat(ChatFormat f, const std::vector<ChatMessage>& messages) {
  std::string out;
  switch (f) {
    case ChatFormat::Glm:
      // [gMASK]<sop><|system|>\n...<|user|>\n...<|assistant|>\n...
      out = "[gMASK]<sop>";
      for (const ChatMessage& m : messages) out += "<|" + m.role + "|>\n" + m.content;
      out += "<|assistant|>\n";
      break;
    case ChatFormat::Qwen:
      // <|im_start|>role\n...<|im_end|>\n per message
      for (const ChatMessage& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      out += "<|im_start|>assistant\n";
      break;
    case ChatFormat::DeepSeek: {
      // BOS, system text bare, then <｜User｜>... <｜Assistant｜>...<｜end▁of▁sentence｜>
      out = "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
      for (const ChatMessage& m : messages) {
        if (m.role == "system") out += m.content;
        else if (m.role == "user") out += "<\xEF\xBD\x9CUser\xEF\xBD\x9C>" + m.content;
        else out += "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>" + m.content + "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
      }
      out += "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>";
      break;
    }
  }
  return out;
}

std::vector<std::string> chat_end_tokens(ChatFormat f) {
  switch (f) {
    case ChatFormat::Glm: return {"<|endoftext|>", "<|user|>", "<|observation|>"};
    case ChatFormat::Qwen: return {"<|im_end|>", "<|endoftext|>"};
    case ChatFormat::DeepSeek: return {"<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"};
  }
  return {};
}

}  // namespace tetra::server
