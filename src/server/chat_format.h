// Built-in chat prompt formats per model family (no Jinja: the model's chat_template is not
// evaluated). The rendered text already holds the family's BOS-style tokens, so encode it
// with add_special_tokens = false. It ends with the assistant's turn opened (generation prompt).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "format/model_config.h"
#include "server/openai_request.h"

namespace tetra::server {

enum class ChatFormat { Glm, Qwen, DeepSeek };

ChatFormat chat_format_for(Arch arch);  // GLM-4.x/GLM-5: Glm, Qwen3: Qwen, DeepSeek-V3: DeepSeek
std::string_view chat_format_name(ChatFormat f);
std::string render_chat(ChatFormat f, const std::vector<ChatMessage>& messages);

// Token spellings that end an assistant turn in that format (the server stops on them).
std::vector<std::string> chat_end_tokens(ChatFormat f);

}  // namespace tetra::server
