// libFuzzer entry: the input is what a client could send the server. Its first byte picks the
// endpoint; the rest is parsed both as an HTTP request head and as that endpoint's JSON body.
// Bad input must come back as HttpParseError / ApiError with a 4xx status, never anything else;
// accepted requests must hold only in-range values.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ops/sampling/logprobs.h"
#include "server/http_message.h"
#include "server/openai_request.h"

namespace {

[[noreturn]] void violated(const std::string& what) {
  std::fprintf(stderr, "server request invariant violated: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tetra::server;
  if (size == 0) return 0;
  const Endpoint ep = data[0] % 3 == 0 ? Endpoint::Completions : data[0] % 3 == 1 ? Endpoint::Chat : Endpoint::Generate;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  HttpRequest head;
  size_t len = 0;
  if (auto err = parse_request_head(text, head, len)) {
    if (err->status < 400 || err->status > 505 || err->message.empty()) violated("bad HttpParseError");
  } else {
    if (head.method.empty() || head.path.empty() || head.path[0] != '/') violated("accepted a head without method/path");
  }

  try {
    const GenerationRequest r = parse_generation_request(ep, text);
    if (r.max_tokens && *r.max_tokens < 1) violated("max_tokens < 1 accepted");
    if (!(r.sampling.temperature >= 0 && r.sampling.temperature <= 2)) violated("temperature out of range");
    if (!(r.sampling.top_p > 0 && r.sampling.top_p <= 1)) violated("top_p out of range");
    if (r.sampling.top_k < -1) violated("top_k < -1");
    for (const std::vector<int32_t>& ids : r.token_prompts)
      for (int32_t t : ids)
        if (t < 0) violated("negative token id accepted");
    const size_t prompts = ep == Endpoint::Chat ? 1 : r.prompts.size() + r.token_prompts.size();
    if (prompts == 0) violated("a request without a prompt accepted");
    if (r.n < 1 || prompts * size_t(r.n) > size_t(kMaxChoices)) violated("n or the choice count out of range");
    if (ep == Endpoint::Generate && (r.n != 1 || r.token_prompts.size() != 1)) violated("/generate with several sequences");
    if (ep == Endpoint::Chat && r.messages.empty()) violated("chat without messages accepted");
    if (ep == Endpoint::Generate && text.find("input_ids") == std::string_view::npos)
      violated("generate without input_ids accepted");
    for (const std::string& s : r.stop)
      if (s.empty()) violated("empty stop string accepted");
    if (r.logprobs < -1 || r.logprobs > tetra::ops::kMaxTopLogprobs) violated("logprobs out of range");
    if (ep == Endpoint::Generate && r.logprobs != -1) violated("logprobs accepted on /generate");
    if (r.logit_bias.size() > size_t(tetra::ops::kMaxLogitBias)) violated("too many logit_bias entries");
    for (const auto& [t, bias] : r.logit_bias)
      if (t < 0 || !(bias >= -100 && bias <= 100)) violated("logit_bias entry out of range");
    if (r.min_tokens < 0 || (r.max_tokens && r.min_tokens > *r.max_tokens)) violated("min_tokens out of range");
  } catch (const ApiError& e) {
    if (e.status != 400 || std::string(e.what()).empty()) violated("ApiError without a 400 and a message");
  }
  return 0;
}
